"""What each model family declares about itself, and the list of family modules.

A family module (`scd_core/models/families/<name>.py`) holds `FAMILY = Family(...)` near its top,
`detect(folder) -> bool`, `load(folder, device, dtype, quantize)` and `CACHE_TOKENS`, and optionally the other hooks `FamilyHooks` lists.
Loading, the loader's folder lists and messages, the node tooltips and the CLI's help are made from the
declarations, so a family that fits the shared session is its module plus its name in MODULES.
"""

from __future__ import annotations

import difflib
import functools
import importlib
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Optional

from ..model import joined  # (re-exported: the front ends name families in prose)

# Asked in this order; the first family that recognises a folder loads it (llamagen claims a folder whose
# llamagen.json it cannot read, so the transformers-format families come first; emu3 claims every model_type
# "Emu3" folder, to explain the original Emu3-Gen layout, so emu3p5 comes before it).
MODULES = ("janus", "mammothmoda2", "llamagen", "emu3p5", "emu3", "cosmos", "lumina", "glm_image")


@dataclass(frozen=True)
class Family:
    """One family as users meet it: names, folders, recommended settings and what it supports."""

    label: str  # its name in lists: "Janus-Pro"
    holds: str  # what its folder holds and how it is recognised, for the unrecognised-folder message
    # (a word of a folder's name, lower case; what to download into it): the first match names the download
    downloads: tuple[tuple[str, str], ...] = ()
    # the published repositories that are a whole model folder on their own (`python -m scd_core fetch` and the
    # loader's download option take these; a family needing files from several repositories declares none)
    repos: tuple[str, ...] = ()
    roots: tuple[str, ...] = ()  # folders of its own under ComfyUI's models/ (models/scd/ takes any family)
    also: str = ""  # another name its models go by in lists of what supports a feature: "demo"
    cfg: str = ""  # its recommended CFG scales, as the tooltip lists them: "Janus-Pro 5"; "" means no CFG
    cfg_note: str = ""  # a sentence on guidance peculiar to it
    top_k: str = ""  # its recommended top-k where it has one, as the tooltip lists them: "Emu3 2048"
    top_p: str = ""  # its recommended top-p where it has one (the others' is 1: no top-p)
    temperature: str = ""  # its recommended temperature where it is not 1: "0.9 for GLM-Image"
    class_index: str = ""  # which of its models take a class index as the prompt
    sizes: tuple[str, ...] = ()  # the other image sizes it takes: "Emu3 (any aspect, 8 px steps)"
    video: str = ""  # a video family: the context frames (its image prompts) it continues; "" for image families
    image_tasks: tuple[str, ...] = ()  # what its checkpoints may take an image in the prompt for (model.image_tasks)
    compile: bool = False  # static-shape window calls: load_model(..., compile=True)
    decoder: str = ""  # a diffusion decoder's defaults (`set_decoding`), as its options list them: "X 50 steps, ..."
    quantize: bool = True  # its backbone stored in int8 / nf4

    @property
    def title(self) -> str:
        """Its name in lists of what supports a feature: "demo/LlamaGen"."""
        return f"{self.also}/{self.label}" if self.also else self.label


@functools.lru_cache(maxsize=None)
def family_modules() -> tuple[ModuleType, ...]:
    """The family modules in MODULES' order, imported on first use (this module imports nothing heavy; a family
    module imports torch but not transformers)."""
    return tuple(importlib.import_module(f"{__package__}.families.{name}") for name in MODULES)


@dataclass(frozen=True)
class FamilyHooks:
    """What a family module may provide, by the names it provides them under: a field without a default is
    required, the others are optional with that default.  Loading and the memory estimate read a module through
    `hooks`, never by probing it."""

    FAMILY: Family
    detect: Callable[[Path], bool]  # whether a folder (perhaps incomplete) holds one of its models
    load: Callable[..., Any]        # load(folder, device, dtype, quantize) -> the model
    CACHE_TOKENS: int               # KV cache positions the memory estimate allows: a prompt and the largest image
    UNUSED_WEIGHTS: tuple[str, ...] = ()  # prefixes of checkpoint weights sampling never loads (memory estimate)
    # its separate text encoder's folder (or None), whose weights the estimate adds
    text_encoder_folder: Optional[Callable[[Path], Optional[Path]]] = None
    # the estimate of a folder of several models (GLM-Image: its AR stage), instead of the folder's weights
    memory_estimate: Optional[Callable[[Path], Any]] = None


HOOKS = tuple(field.name for field in fields(FamilyHooks))
REQUIRED_HOOKS = tuple(field.name for field in fields(FamilyHooks) if field.default is MISSING)


def misspelt_hooks(module: ModuleType) -> list[str]:
    """The public names of `module` close to a hook's name but not one ("CACHE_TOKEN"): a hook it meant to give."""
    return [f"{name} (meant {close[0]}?)" for name in vars(module) if not name.startswith("_") and name not in HOOKS
            for close in [difflib.get_close_matches(name, HOOKS, n=1, cutoff=0.85)] if close]


def hooks(module: ModuleType) -> FamilyHooks:
    """The hooks of a family module, the defaults where it gives none; refused when it lacks a required one or
    misspells one."""
    name = module.__name__.rsplit(".", 1)[-1]
    missing = [hook for hook in REQUIRED_HOOKS if not hasattr(module, hook)]
    misspelt = misspelt_hooks(module)
    if missing or misspelt:
        raise TypeError(f"family module {name!r} " + "; ".join(
            filter(None, [missing and f"lacks {', '.join(missing)}", misspelt and f"has {', '.join(misspelt)}"])))
    return FamilyHooks(**{hook: vars(module)[hook] for hook in HOOKS if hook in vars(module)})


def families() -> tuple[Family, ...]:
    return tuple(module.FAMILY for module in family_modules())


def published_repos() -> dict[str, Family]:
    """Each repository that fetch downloads whole, and its family."""
    return {repo: family for family in families() for repo in family.repos}


def diffusion_decoders() -> tuple[str, str]:
    """(the families whose decoder is a diffusion model, their decoders' defaults): ("GLM-Image and ...",
    "GLM-Image 50 steps, guidance 1.5; ...")."""
    decoding = [family for family in families() if family.decoder]
    return joined(family.label for family in decoding), "; ".join(family.decoder for family in decoding)


def compilable() -> str:
    """What loads with compile=True: "Janus-Pro, demo/LlamaGen and Emu3"."""
    return joined(family.title for family in families() if family.compile)
