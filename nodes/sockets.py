"""The pack's socket types and the values that travel through them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import comfy.model_management as mm
from comfy_api.latest import io
from scd_core import GenerationResult, SamplerConfig

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
    memory_required: int = 0  # beyond the weights: KV cache and distributions, so ComfyUI frees that much too

    def to_compute_device(self) -> None:
        # Full load: the adapters run plain torch modules, which cannot run half on the CPU.
        mm.load_models_gpu([self.patcher], memory_required=self.memory_required, force_full_load=True)


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
