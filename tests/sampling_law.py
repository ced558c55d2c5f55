"""A family's default sampling law against its reference's: the probabilities the reference's logits
processors give and those the engine samples from (`to_probs` at the model's defaults), for the same logits."""

from __future__ import annotations

from typing import Optional

import torch

from scd_core import SamplerConfig
from scd_core.decoding.run_settings import sampling_settings
from scd_core.decoding.sampling import to_probs


def spread_logits(vocab: int, seed: int = 0) -> torch.Tensor:
    """(6, vocab) logits from nearly flat to peaked, so that any top-k or top-p below the whole vocabulary
    removes tokens in some rows."""
    noise = torch.randn(6, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (noise * torch.tensor([0.05, 0.3, 1.0, 2.0, 4.0, 8.0], dtype=torch.float64)[:, None]).float()


def processed_probs(processors: object, scores: torch.Tensor, input_ids: Optional[torch.Tensor] = None
                    ) -> torch.Tensor:
    """softmax of a transformers LogitsProcessorList's output, as generate samples from it."""
    ids = torch.zeros(scores.shape[0], 1, dtype=torch.long) if input_ids is None else input_ids
    return torch.softmax(processors(ids, scores.clone()), dim=-1)


def warpers(temperature: float, top_k: Optional[int], top_p: float) -> object:
    """transformers' own temperature, top-k and top-p warpers in generate's order (the authors' loops that
    filter this way: their values, each a no-op where it changes nothing)."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    return LogitsProcessorList([TemperatureLogitsWarper(temperature)]
                               + ([TopKLogitsWarper(top_k)] if top_k else [])
                               + ([TopPLogitsWarper(top_p)] if top_p < 1.0 else []))


def guided(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """The authors' guidance: uncond + scale (cond - uncond)."""
    return uncond + scale * (cond - uncond)


def default_probs(model: object, cond: torch.Tensor, uncond: Optional[torch.Tensor] = None) -> torch.Tensor:
    """What the engine samples from at every setting left at the model's value (SamplerConfig's None)."""
    return to_probs(cond[None], None if uncond is None else uncond[None], sampling_settings(model, SamplerConfig()))[0]


def assert_same_law(ours: torch.Tensor, reference: torch.Tensor) -> None:
    """Same support and the same probabilities (float32 rounding apart)."""
    assert torch.equal(ours > 0, reference > 0), ((ours > 0).sum(-1), (reference > 0).sum(-1))
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=1e-5)
