"""The pack's ComfyUI nodes (V3 schema), thin wrappers over scd_core.  Imported only inside ComfyUI."""

from pathlib import Path

import folder_paths
from comfy_api.latest import ComfyExtension, io
from scd_core.windows import window_memory
from scd_core.compiled.capture_scope import set_capture_scope

from .core_compat import outside_malloc_graph
from .decode import SCDVQDecode
from .encode import SCDPromptEncode
from .image_prompt import SCDImagePrompt
from .loader import SCDModelLoader
from .sampler import SCDSampler
from .stats import SCDStatsNode
from .story import SCDEmu3p5Story
from .video_context import SCDVideoContext

# the compiled path captures its CUDA graphs outside the core's malloc graph (late-2026 ComfyUI's model compiler)
set_capture_scope(outside_malloc_graph)
# the automatic window's learned call costs live with the user's ComfyUI data, for the next server start
window_memory.set_folder(Path(folder_paths.get_user_directory()) / "comfyui-scd")

NODES = [SCDModelLoader, SCDPromptEncode, SCDSampler, SCDVQDecode, SCDStatsNode, SCDVideoContext, SCDImagePrompt,
         SCDEmu3p5Story]


class SCDExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return list(NODES)
