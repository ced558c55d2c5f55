"""The pack's socket types and the values that travel through them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import comfy.model_management as mm
from comfy_api.latest import io
from scd_core import GenerationResult, SamplerConfig
from scd_core.compiled import cuda_graphs
from scd_core.windows import window_policies

SCDModel = io.Custom("SCD_MODEL")
SCDCond = io.Custom("SCD_COND")
SCDTokens = io.Custom("SCD_TOKENS")  # LongTensor (batch, num_tokens) on the CPU
SCDStats = io.Custom("SCD_STATS")


@dataclass(eq=False)
class LoadedModel:
    """A scd_core model plus the ModelPatcher through which ComfyUI moves and evicts its weights."""

    name: str
    model: Any
    patcher: Any
    streamable: bool = False  # its layers cast their weights per call (nodes/lowvram.py): it may load partially
    image_cache_bytes: int = 0  # the KV cache of one sampled image (its CFG rows), at the loader's prompt allowance
    slot_bytes: int = 0  # the distributions of one window slot of one image, with their working copies
    decoder_patcher: Any = None  # a separate decoding stage's own patcher (GLM-Image's DiT), built by its first decode

    def run_memory(self, batch_size: int, window: int | str, candidates: int = 1) -> int:
        """What a sampler run allocates besides the weights: each image's KV cache and the distributions of
        its widest call (the automatic window's widest, 64, or the pinned one; a tree of candidates feeds k
        chains), and a compiled model's CUDA graph pool, less what the model holds from its last image for the
        next (a compiled model's kept CUDA graphs and their KV cache, which the run reuses or frees first)."""
        width = window_policies.widest(window, self.model.num_tokens)
        allocated = batch_size * (self.image_cache_bytes + candidates * width * self.slot_bytes)
        kept = cuda_graphs.kept_graphs(self.model).kept_bytes()
        return max(0, allocated + self.graph_pool_bytes(batch_size, width) - kept)

    def graph_pool_bytes(self, batch_size: int, width: int) -> int:
        """A compiled model's CUDA graphs hold their steps' intermediates in a pool of their own, from their capture
        until the model's next image: estimated as the widest step's distributions with their working copies
        (`slot_bytes` per slot and image), which an eager call frees as it ends (the step's activations are
        smaller: a layer's width is well below the vocabulary).  None where kept graphs are there (the run
        replays them, or frees them before it captures) or no graph is captured (CPU, MPS)."""
        graphed = bool(getattr(self.model, "compiled", False)) and mm.is_device_cuda(self.patcher.load_device)
        if not graphed or cuda_graphs.kept_graphs(self.model).kept is not None:
            return 0
        return batch_size * width * self.slot_bytes

    @property
    def memory_required(self) -> int:
        """Beyond the weights, for one image at the automatic window: what ComfyUI frees unless told more."""
        return self.run_memory(1, window_policies.AUTO_WINDOW)

    def to_compute_device(self, memory_required: int | None = None) -> None:
        """Load the weights for a node's use, asking ComfyUI to free `memory_required` bytes beside them
        (default: one image's run)."""
        # A streamable model may load partially: what does not fit stays on the CPU and is copied in per call.
        # Others load fully: a compiled model's CUDA graphs hold its weights' addresses, which casting
        # copies made anew per call would not be.
        required = self.memory_required if memory_required is None else memory_required
        if self.streamable:
            mm.load_models_gpu([self.patcher], memory_required=required)
        else:
            load_fully(self.patcher, required)


def load_fully(patcher: Any, memory_required: int) -> None:
    """Load all of `patcher`'s weights, freeing `memory_required` bytes beside them.  ComfyUI counts only the
    missing part of a model it partly evicted before (e.g. for another stage) and may then evict that model
    itself to make room, loading it whole on top of the others; so the room for the missing part is made first,
    keeping the model's loaded part, through its own free_memory."""
    for entry in mm.current_loaded_models:
        missing = entry.model_offloaded_memory() if entry.model is patcher else 0
        if missing > 0:
            mm.free_memory(missing * 1.1 + memory_required, entry.device, keep_loaded=[entry])
    mm.load_models_gpu([patcher], memory_required=memory_required, force_full_load=True)


@dataclass(eq=False)
class EncodedPrompt:
    """Conditioning plus the name of the model that made it, to catch mixed-up connections."""

    model_name: str
    cond: Any


@dataclass(eq=False)
class SamplingStats:
    result: GenerationResult
    config: SamplerConfig
    batch_size: int
    model_name: str
