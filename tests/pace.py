"""Checks shared by the family tests: a window's logits against tokens fed one at a time, and samples that
advance at their own pace.

`window_and_stepwise_logits` feeds a window of tokens, then the same tokens one at a time after a rewind;
`staggered_logits` feeds windows to batch rows that sit at different positions
and returns, next to each call's logits, what a batch-1 session gives for the
same row fed one token at a time; `assert_own_pace_gives_ar_tokens` checks whole
generations of rows at their own pace (`scd_core.bench.pace.PaceRecorder` records
each row's progress).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from scd_core import SamplerConfig, generate
from scd_core.bench.pace import PaceRecorder


def window_and_stepwise_logits(model: Any, cond: Any, tokens: torch.Tensor) -> tuple:
    """(cond, uncond) logits of `tokens` (batch, T) fed as one window after the prefill, and of the same
    tokens fed one at a time after rewinding them."""
    session = model.start(cond, batch_size=tokens.shape[0])
    session.prefill()
    window = session.forward(tokens)
    session.rewind(tokens.shape[1])
    stepwise = _cat([session.forward(tokens[:, i:i + 1]) for i in range(tokens.shape[1])], dim=1)
    return window, stepwise


def _cat(parts: Sequence[tuple], dim: int) -> tuple:
    """Concatenate (cond, uncond) pairs branch by branch; uncond stays None for a model without CFG."""
    return tuple(None if pieces[0] is None else torch.cat(pieces, dim=dim) for pieces in zip(*parts))


def _sequential(model: Any, cond: Any, tokens: list[int], last: int) -> tuple:
    """(cond, uncond) logits of the last `last` tokens, fed one at a time to a fresh batch-1 session."""
    session = model.start(cond, 1)
    session.prefill()
    steps = [session.forward(torch.tensor([[token]])) for token in tokens]
    return _cat(steps[-last:], dim=1)


def staggered_logits(model: Any, cond: Any, calls: Sequence[tuple]
                     ) -> list[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]]:
    """For each (tokens (B, T), rewind per row[, rows kept]) call: (batched logits, each row's sequential logits).

    The rewind after a call drops a different number of tokens per row, so the next
    call feeds rows at different positions over slots they rejected; with a third
    entry the session then keeps only those rows (`keep_rows`), and later calls feed them.
    """
    session = model.start(cond, calls[0][0].shape[0])
    session.prefill()
    kept: list[list[int]] = [[] for _ in range(calls[0][0].shape[0])]
    pairs = []
    for tokens, rewind, *keep in calls:
        batched = session.forward(tokens)
        rows = [_sequential(model, cond, kept[r] + tokens[r].tolist(), tokens.shape[1])
                for r in range(tokens.shape[0])]
        pairs.append((batched, _cat(rows, dim=0)))
        session.rewind(torch.tensor(rewind))
        kept = [(k + t)[:len(k) + len(t) - n] for k, t, n in zip(kept, tokens.tolist(), rewind)]
        if keep:
            session.keep_rows(torch.tensor(keep[0]))
            kept = [kept[r] for r in keep[0]]
    return pairs


def assert_own_pace_gives_ar_tokens(model: Any, cond: Any, seed: int, windows: Sequence[int] = (8,)) -> None:
    """Three faithful rows at their own pace give the window-1 tokens, finish at different calls (else the check
    says nothing), and a row alone gives its batch tokens."""
    def faithful(window: int, batch: int, sampled: Any = model) -> torch.Tensor:
        return generate(sampled, cond, SamplerConfig(coupler="faithful", window=window, seed=seed),
                        batch_size=batch).tokens

    ar = faithful(1, 3)
    for window in windows:
        recorder = PaceRecorder(model)
        fast = faithful(window, 3, recorder)
        assert torch.equal(fast, ar)
        assert len(set(recorder.finish_calls())) > 1  # rows finished at different calls
        assert torch.equal(faithful(window, 1)[0], fast[0])


def tree_logits(model: Any, cond: Any, ids: torch.Tensor
                ) -> list[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]]:
    """Two rows at different positions are fed a tree of 3 chains of width 3 (`row_cache.tree_layout`), keep
    chains 2 and 1 (3 and 2 of their tokens), then take 2 more tokens: once at the start of the image, and once
    ending at its last position, where the tree holds more tokens than positions are left.  `ids` (2, N + 5)
    supplies every token.  Returns (batched logits, sequential logits) for each chain and for the call after."""
    pairs = []
    for offset in (0, model.num_tokens - 7):
        session = model.start(cond, 2)
        session.prefill()
        session.forward(ids[:, :offset + 3])
        session.rewind(torch.tensor([1, 0]))
        held = [ids[0, :offset + 2].tolist(), ids[1, :offset + 3].tolist()]
        width, branches, tree = 3, 3, ids[:, offset + 3:offset + 10]
        batched = session.forward(tree, branches)
        chains = [[0, 1, 2], [0, 3, 4], [0, 5, 6]]
        for chain in chains:
            rows = [_sequential(model, cond, held[r] + tree[r, chain].tolist(), width) for r in range(2)]
            pairs.append((tuple(None if branch is None else branch[:, chain] for branch in batched),
                          _cat(rows, dim=0)))
        kept, counts = [2, 1], [3, 2]
        session.keep_branch(torch.tensor(kept), tree.shape[1], branches)
        session.rewind(tree.shape[1] - torch.tensor(counts))
        held = [held[r] + tree[r, chains[kept[r]]].tolist()[:counts[r]] for r in range(2)]
        after = ids[:, offset + 10:offset + 12]
        batched = session.forward(after)
        rows = [_sequential(model, cond, held[r] + after[r].tolist(), 2) for r in range(2)]
        pairs.append((batched, _cat(rows, dim=0)))
    return pairs


def assert_each_row_matches(pairs: Sequence[tuple], tolerance: float) -> None:
    """Every (batched, sequential) pair of `staggered_logits` / `tree_logits` agrees within `tolerance`."""
    for batched, sequential in pairs:
        for a, b in zip(batched, sequential):
            assert (a is None) == (b is None)
            if a is not None:
                assert a.shape == b.shape and float((a - b).abs().max()) <= tolerance
