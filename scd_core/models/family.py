"""What each model family declares about itself, and the list of family modules.

A family module (`scd_core/models/<name>.py`) holds `FAMILY = Family(...)` near its top, `detect(folder) -> bool`
and `load(folder, device, dtype, quantize)`.  Loading, the loader's folder lists and messages, the node tooltips
and the CLI's help are made from the declarations, so a family that fits the shared session is its module plus
its name in MODULES.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Iterable

# Asked in this order; the first family that recognises a folder loads it (llamagen claims a folder whose
# llamagen.json it cannot read, so the transformers-format families come first; emu3 claims every model_type
# "Emu3" folder, to explain the original Emu3-Gen layout, so emu3p5 comes before it).
MODULES = ("janus", "llamagen", "emu3p5", "emu3", "cosmos", "lumina", "glm_image")


@dataclass(frozen=True)
class Family:
    """One family as users meet it: names, folders, recommended settings and what it supports."""

    label: str  # its name in lists: "Janus-Pro"
    holds: str  # what its folder holds and how it is recognised, for the unrecognised-folder message
    # (a word of a folder's name, lower case; what to download into it): the first match names the download
    downloads: tuple[tuple[str, str], ...] = ()
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
    quantize: bool = True  # its backbone stored in int8 / nf4

    @property
    def title(self) -> str:
        """Its name in lists of what supports a feature: "demo/LlamaGen"."""
        return f"{self.also}/{self.label}" if self.also else self.label


@functools.lru_cache(maxsize=None)
def family_modules() -> tuple[ModuleType, ...]:
    """The family modules in MODULES' order, imported on first use (this module imports nothing heavy; a family
    module imports torch but not transformers)."""
    return tuple(importlib.import_module(f"{__package__}.{name}") for name in MODULES)


def families() -> tuple[Family, ...]:
    return tuple(module.FAMILY for module in family_modules())


def joined(words: Iterable[str], last: str = "and") -> str:
    """The words as prose: "a, b and c"."""
    items = list(words)
    return f" {last} ".join(filter(None, [", ".join(items[:-1]), *items[-1:]]))


def compilable() -> str:
    """What loads with compile=True: "Janus-Pro, demo/LlamaGen and Emu3"."""
    return joined(family.title for family in families() if family.compile)
