"""The tree call of candidates: k first drafts in one call, each followed by the same later drafts.

A row with `candidates` > 1 feeds its window and, for each alternative first draft, a chain of it and the later
drafts (`row_cache.tree_layout` lays them out in the cache); verification then reads every chain's
distributions (`engine._Decoder.decide`).
"""

from __future__ import annotations

import torch


def tree_inputs(window: torch.Tensor, alternatives: torch.Tensor) -> torch.Tensor:
    """A window's inputs (B, L): the last committed token, the first draft, the later drafts; with k - 1
    alternatives (B, k - 1) for the first draft, the tree `row_cache.tree_layout` describes: the window, then
    for each alternative a chain of it and the later drafts."""
    later = window[:, 2:]
    return torch.cat([window] + [torch.cat([alternatives[:, c:c + 1], later], dim=1)
                                 for c in range(alternatives.shape[1])], dim=1)


def chain_probs(probs: torch.Tensor, width: int, branches: int) -> torch.Tensor:
    """p of a tree call's slots (B, T, V) -> p of every chain (B, branches, width, V); the first slot, computed
    before the chains part, is every chain's."""
    extra = probs[:, width:].unflatten(1, (branches - 1, width - 1))
    first = probs[:, :1].unsqueeze(1).expand(-1, branches - 1, -1, -1)
    return torch.cat([probs[:, :width].unsqueeze(1), torch.cat([first, extra], dim=2)], dim=1)
