"""What a generation reports: each call's statistics as it goes (`IterationStats`, for a callback) and the
whole run's (`GenerationResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class IterationStats:
    iteration: int
    committed: int
    total: int
    num_tokens: int
    nfe: int
    acceptance: list[float]
    tokens: torch.Tensor
    forward_s: float
    sample_s: float
    forced: int = 0  # of `committed`, the tokens that were forced (given cells, row-ends), not sampled
    forced_total: int = 0  # of `total`, the forced tokens: plain AR needs one call per other token

    def __str__(self) -> str:
        """One line (`callback=print` shows the run's pace, not its tensors)."""
        drafts = len(self.acceptance)
        accepted = f"mean acceptance {sum(self.acceptance) / drafts:.0%} ({drafts} drafts)" if drafts else "no drafts"
        return f"call {self.nfe}: committed {self.committed}, {self.total} / {self.num_tokens} tokens done, {accepted}"



@dataclass
class GenerationResult:
    tokens: torch.Tensor
    nfe: int
    committed: list[int] = field(default_factory=list)
    forced: list[int] = field(default_factory=list)  # of each call's `committed`, the forced tokens
    acceptance: list[float] = field(default_factory=list)
    draft_changes: list[float] = field(default_factory=list)
    windows: list[int] = field(default_factory=list)  # width of each call (1 for the prefill)
    fed: list[int] = field(default_factory=list)  # tokens each call fed: its width, more with candidates
    forward_s: float = 0.0
    sample_s: float = 0.0
    prefill_s: float = 0.0
    total_s: float = 0.0
    # a compiled model's parts that ran eagerly, each with why (a failed compile or CUDA graph capture)
    eager_fallbacks: list[str] = field(default_factory=list)

    @property
    def tokens_per_call(self) -> float:
        return self.tokens.shape[1] / self.nfe
