"""ComfyUI entry point of the SCD node pack: speculative coupled decoding for autoregressive image models."""

import sys
from pathlib import Path

# scd_core sits next to this file and imports its own modules by absolute name.  Appended, not
# prepended: this folder also holds a `nodes` package, and ComfyUI's own `nodes` module must win.
_PACK_ROOT = str(Path(__file__).resolve().parent)
if _PACK_ROOT not in sys.path:
    sys.path.append(_PACK_ROOT)

WEB_DIRECTORY = "./web"


async def comfy_entrypoint():
    """Called by ComfyUI.  ComfyUI's API is imported only here: pytest imports this file as a package too."""
    from .nodes import SCDExtension
    from .nodes.model_folders import register_model_roots

    register_model_roots()
    return SCDExtension()
