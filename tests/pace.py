"""Checks shared by the family tests for samples that advance at their own pace.

`staggered_logits` feeds windows to batch rows that sit at different positions
and returns, next to each call's logits, what a batch-1 session gives for the
same row fed one token at a time.  (`scd_core.bench_pace.PaceRecorder` records
each row's progress during a generation.)
"""

from __future__ import annotations

from typing import Any, Sequence

import torch


def _sequential(model: Any, cond: Any, tokens: list[int], last: int) -> tuple[torch.Tensor, ...]:
    """(cond, uncond) logits of the last `last` tokens, fed one at a time to a fresh batch-1 session."""
    session = model.start(cond, 1)
    session.prefill()
    steps = [session.forward(torch.tensor([[token]])) for token in tokens]
    return tuple(torch.cat([step[branch] for step in steps[-last:]], dim=1) for branch in (0, 1))


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
        pairs.append((batched, tuple(torch.cat([row[branch] for row in rows]) for branch in (0, 1))))
        session.rewind(torch.tensor(rewind))
        kept = [(k + t)[:len(k) + len(t) - n] for k, t, n in zip(kept, tokens.tolist(), rewind)]
        if keep:
            session.keep_rows(torch.tensor(keep[0]))
            kept = [kept[r] for r in keep[0]]
    return pairs
