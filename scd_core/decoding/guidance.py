"""Guidance over a session's branches of logits, chosen once per run from the settings: a CFG scale (one, or
one per position from the model's schedule) over a cond and an uncond branch, or the session's own weights over
its branches.  The sampling step then turns a call's logits into p without asking which."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from ..compiled.invariant import fixed_shape_calls, wanted
from ..model import Logits
from .sampling import Sampling, branch_weights, to_probs, weighted_logits


class ScaleGuidance:
    """u + s (c - u) at one scale (no uncond branch: the cond logits as they are)."""

    def __init__(self, sampler: Sampling, device: torch.device) -> None:
        self.sampler, self.device = sampler, device

    def probs(self, logits: Logits, positions: Callable[[], torch.Tensor]) -> torch.Tensor:
        cond, uncond = logits
        with fixed_shape_calls(wanted(cond.dtype), self.device):  # top-p's row sums at the calls' tiles
            return to_probs(cond.to(self.device), None if uncond is None else uncond.to(self.device),
                            self.sampler_at(positions))

    def sampler_at(self, positions: Callable[[], torch.Tensor]) -> Sampling:
        return self.sampler


class ScheduledGuidance(ScaleGuidance):
    """A scale per position (`model.cfg_schedule`), read at each slot's position."""

    def __init__(self, sampler: Sampling, device: torch.device, scales: torch.Tensor) -> None:
        super().__init__(sampler, device)
        self.scales = scales

    def sampler_at(self, positions: Callable[[], torch.Tensor]) -> Sampling:
        return self.sampler.with_scale(self.scales[positions().clamp(max=self.scales.shape[0] - 1)].unsqueeze(-1))


class BranchGuidance:
    """The session's weights over its branches (`Session.guidance`), summed before the sampler's filters."""

    def __init__(self, sampler: Sampling, weights: torch.Tensor) -> None:
        self.sampler, self.weights = sampler.with_scale(1.0), weights

    def probs(self, logits: Logits, positions: Callable[[], torch.Tensor]) -> torch.Tensor:
        with fixed_shape_calls(wanted(logits[0].dtype), self.weights.device):
            return to_probs(weighted_logits(logits, self.weights), None, self.sampler)


def guidance_for(model: Any, session_guidance: Optional[Callable[[float], Sequence[float]]], cfg_scale: float,
                 sampler: Sampling, device: torch.device) -> ScaleGuidance | BranchGuidance:
    """The run's guidance: `sampler` is what the sampling step reads (device tensors for a static step), `cfg_scale`
    the resolved scale as a number."""
    schedule = getattr(model, "cfg_schedule", None)  # a guidance scale per position, where the model has one
    scales = schedule(cfg_scale) if callable(schedule) else None
    if scales is not None:
        scales = torch.as_tensor(scales, dtype=torch.float32, device=device)
        if scales.shape != (model.num_tokens,):
            raise ValueError(f"model.cfg_schedule must give {model.num_tokens} scales, got {tuple(scales.shape)}")
    if session_guidance is not None:
        if scales is not None:
            raise ValueError("a session that weighs its own branches (guidance) takes no model.cfg_schedule")
        # the weight of each branch's logits (float32, on the device: a compiled step serves every value)
        return BranchGuidance(sampler, branch_weights(session_guidance, cfg_scale, device))
    return ScaleGuidance(sampler, device) if scales is None else ScheduledGuidance(sampler, device, scales)
