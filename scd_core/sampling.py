"""From raw logits to the sampling distribution p, and the draws made from it.

Everything the engine verifies or couples operates on `to_probs(...)` output:
float32 probabilities after CFG, temperature, top-k and top-p.
"""

from __future__ import annotations

from typing import Optional

import torch


def to_probs(cond: torch.Tensor, uncond: Optional[torch.Tensor], cfg_scale: float, temperature: float,
             top_k: Optional[int], top_p: float) -> torch.Tensor:
    """Raw (batch, T, V) logits to float32 probabilities (batch, T, V)."""
    logits = cond.float()
    if uncond is not None and cfg_scale != 1.0:
        logits = torch.lerp(uncond.float(), logits, cfg_scale)  # u + s (c - u)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # keep the smallest prefix of the sorted tokens whose mass reaches top_p
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from non-negative (unnormalised) weights (..., V) with uniforms u (...) in (0, 1).

    The first index whose CDF reaches u * total always has positive weight, and
    u < 1 keeps the target at or below the total even after rounding.
    """
    cdf = torch.cumsum(weights, dim=-1)
    target = (u * cdf[..., -1]).unsqueeze(-1)
    index = torch.searchsorted(cdf, target).squeeze(-1)
    return index.clamp(max=weights.shape[-1] - 1)


def gumbel_argmax(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """argmax_v(log p(v) + g(v)): a draw from p when g is fresh Gumbel noise."""
    return torch.argmax(torch.log(probs) + noise, dim=-1)


def modified_rejection(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, u_accept: torch.Tensor,
                       u_residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep `draft` (drawn from q) with probability min(1, p/q), else draw from norm(max(0, p - q)).

    Returns (accepted mask, resulting token); the token is distributed as p.
    """
    p_x = p.gather(-1, draft.unsqueeze(-1)).squeeze(-1)
    q_x = q.gather(-1, draft.unsqueeze(-1)).squeeze(-1)
    accepted = u_accept * q_x < p_x
    residual = (p - q).clamp_min(0.0)
    # p == q leaves no residual mass; rejection is then impossible, but stay well defined
    empty = residual.sum(-1, keepdim=True) <= 0
    residual = torch.where(empty, p, residual)
    return accepted, torch.where(accepted, draft, sample(residual, u_residual))
