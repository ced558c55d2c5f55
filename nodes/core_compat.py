"""What the running ComfyUI core offers, detected rather than assumed.

The pack runs on ComfyUI 0.3.75 (December 2025, what the tests install) and on late-2026 cores (0.38.x, read in
their sources, not run here), where
- dynamic VRAM (comfy-aimdo) is on by default where supported: `comfy.memory_management.aimdo_enabled`, the
  dynamic patcher as `comfy.model_patcher.CoreModelPatcher`, weight pages that comfy-aimdo evicts on demand
  (`comfy_aimdo.model_vbar.vbars_analyze()`), and `--lowvram` does nothing;
- the model compiler records the allocations of a model call in a per-thread malloc graph, with
  `comfy.model_prefetch.pause_malloc_graph()` and `--disable-comfy-compiler` as the ways out.
"""

from __future__ import annotations

import contextlib
import importlib
from types import ModuleType
from typing import Any, ContextManager, Optional

import comfy.model_patcher
import torch


def _module(name: str) -> Optional[ModuleType]:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def dynamic_vram() -> bool:
    """Whether the core manages VRAM dynamically (comfy-aimdo); False on cores without it."""
    return bool(getattr(_module("comfy.memory_management"), "aimdo_enabled", False))


def classic_patcher_class() -> type:
    """The ModelPatcher the loader wraps its model in: always the classic one, never the dynamic-VRAM patcher
    (`CoreModelPatcher` under comfy-aimdo).  The dynamic one streams only the comfy.ops layers it prepared
    itself (their virtual weight buffers); the pack's casting layers (nodes/lowvram.py) follow the classic
    partial-load protocol, which late cores keep for models that opt out (hooks, torch.compile)."""
    return comfy.model_patcher.ModelPatcher


def is_dynamic_patcher(patcher: Any) -> bool:
    dynamic = getattr(comfy.model_patcher, "ModelPatcherDynamic", None)
    return dynamic is not None and isinstance(patcher, dynamic)


def reclaimable_bytes() -> int:
    """VRAM of dynamically loaded models that comfy-aimdo evicts on demand: free for a new model, but not in
    `get_free_memory` (0 without dynamic VRAM)."""
    if not dynamic_vram():
        return 0
    analyze = getattr(_module("comfy_aimdo.model_vbar"), "vbars_analyze", None)
    return int(analyze() or 0) if analyze is not None else 0


def outside_malloc_graph() -> ContextManager[Any]:
    """A scope whose allocations the core's model compiler does not record (`pause_malloc_graph`, synchronised:
    a CUDA graph capture must not interleave with the record); a no-op where no malloc graph exists or none is
    active."""
    pause = getattr(_module("comfy.model_prefetch"), "pause_malloc_graph", None)
    return pause(sync=True) if pause is not None else contextlib.nullcontext()


def core_note(device: torch.device) -> str:
    """A status-line remark on the late core's memory manager; "" on cores without dynamic VRAM."""
    if device.type != "cuda" or not dynamic_vram():
        return ""
    return "dynamic VRAM on: this model loads the classic way (--lowvram changes nothing)"
