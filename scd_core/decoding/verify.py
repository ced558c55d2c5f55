"""One call's verification and next drafts: the rule the engine applies to every window.

Given the distributions p of a call's slots and the drafts it was fed, verify the drafts left to right
(modified rejection sampling against their proposals, or block verification), and make every slot's next
draft with the configured coupler (scd_core.decoding.couplers).  Every draw is keyed by the row's seed, the position
and the row's call count (scd_core.decoding.rng), so a row's tokens depend on its own seed only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from . import couplers, rng
from .config import SamplerConfig
from .sampling import block_verify, modified_rejection, sample


@dataclass
class Window:
    """What one model call produced and the drafts it was fed."""

    probs: torch.Tensor      # (B, T, V) sampling distribution of positions c .. c+T-1
    positions: torch.Tensor  # (B, T) absolute positions of those slots
    drafts: torch.Tensor     # (B, T-1) drafts that were fed for positions c .. c+T-2
    proposals: torch.Tensor  # (B, T-1, V) the distributions those drafts were drawn from
    gumbel: Optional[torch.Tensor]  # (B, T, V) position-fixed noise, for the couplers that draw on it
    free: torch.Tensor       # (B, T) False at forced slots
    keys: torch.Tensor       # (B, 1) each row's seed key (rng.seed_keys)
    calls: torch.Tensor      # (B, 1) the calls each row took part in before this one: its draws' counter
    drafts_left: torch.Tensor  # (B,) drafts before each row's last position; later slots lie past it


def propose_next(config: SamplerConfig, noise: rng.KeyedRandom, window: Window
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verify the drafts and make every slot's next token.

    Returns (accepted (B, T-1), verified (B, T), coupled (B, T)): `verified` holds
    what each slot commits if no earlier slot was rejected; `coupled` is the next
    draft for slots after a row's first rejection.  Both are distributed as
    `window.probs`, which becomes the proposal of every carried draft.  Block verification ends each row's
    block at `window.drafts_left`, which also cuts a static call padded past its true width (token
    verification is slot by slot, and commits never pass the last position anyway).
    """
    p, pos, x, keys, calls = window.probs, window.positions, window.drafts, window.keys, window.calls
    n_drafts = x.shape[1]
    coupler = couplers.coupler(config.coupler)

    def fresh(first: int = 0) -> torch.Tensor:
        """Independent draws from p for the slots from `first` on."""
        return sample(p[:, first:], noise.uniform(rng.FRESH, keys, pos[:, first:], calls))

    if not coupler.reads_proposals:  # a draft passes when it is its slot's next draft
        y = coupler.draft(couplers.Draws(p, None, window.gumbel, fresh))
        return x == y[:, :n_drafts], y, y
    accepted, kept = modified_rejection(
        p[:, :n_drafts], window.proposals, x,
        noise.uniform(rng.ACCEPT, keys, pos[:, :n_drafts], calls),
        noise.uniform(rng.RESIDUAL, keys, pos[:, :n_drafts], calls))
    verified = torch.cat([kept, fresh(n_drafts)], dim=1)  # the last slot has no draft: a bonus draw
    coupled = coupler.draft(couplers.Draws(p, verified, window.gumbel, fresh))
    if config.alpha < 1.0:
        use_coupled = noise.uniform(rng.ALPHA, keys, pos, calls) < config.alpha
        coupled = torch.where(use_coupled, coupled, fresh())
    if config.verification == "block":
        # the joint decision draws on streams of its own, apart from the independent next drafts
        tau, replacement = block_verify(p, window.proposals, x, window.free,
                                        noise.uniform(rng.BLOCK, keys, pos, calls),
                                        noise.uniform(rng.BLOCK_RESIDUAL, keys, pos, calls), window.drafts_left)
        slots = torch.arange(p.shape[1], device=p.device).unsqueeze(0)
        accepted = slots[:, :n_drafts] < tau.unsqueeze(1)
        verified = torch.where(slots < tau.unsqueeze(1), torch.cat([x, replacement.unsqueeze(1)], dim=1),
                               replacement.unsqueeze(1))
    return accepted, verified, coupled
