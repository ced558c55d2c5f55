"""The cells of a generation fixed before sampling: the model's forced tokens (row-ends) and the kept cells of a
prompt's `GivenCells`.  No row samples them; a call verifies free positions, and with given cells it is widened
over the fixed ones in its way, so that a chosen width counts free positions (`call_width`).  Fixed cells from
position 0 on in every row (an image's kept top rows) may ride in the prefill instead (`kept_prefix`)."""

from __future__ import annotations

from typing import Any, Optional

import torch

from .given import forced_cells
from .run_settings import code_tables

Given = Optional[tuple[torch.Tensor, torch.Tensor]]  # each row's given cells (tokens, keep), (batch, N) each


def code_and_fixed(model: Any, given: Given, batch: int, device: torch.device
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(code index -> model id, model id -> code index) on `device` (`code_tables`), then the cells no row
    samples and their ids, (batch, N) each on the CPU: the model's own forced tokens and the kept cells of
    `given` (`forced_cells`)."""
    forced_tokens = getattr(model, "forced_tokens", None) or {}
    code_ids, code_index = code_tables(getattr(model, "code_ids", None), model.vocab_size, forced_tokens.values(),
                                       device)
    return (code_ids, code_index, *forced_cells(forced_tokens, given, batch, model.num_tokens, code_ids))


def kept_prefix(model: Any, given: Given, batch: int) -> Optional[torch.Tensor]:
    """The ids (batch, K) of the fixed cells every row has from position 0 on, before a free position; None where
    there are none."""
    _, _, fixed, ids = code_and_fixed(model, given, batch, torch.device("cpu"))
    count = min(int(fixed.long().cumprod(1).sum(1).min()), model.num_tokens - 1)  # a free position must follow
    return ids[:, :count] if count else None


class FixedCells:
    """Each row's fixed cells, on the device for the sampling step and as a host table of free positions, from
    which calls are sized."""

    ROW_STATE = ("forced", "forced_ids", "free_before", "host_committed")  # first dimension the batch

    def __init__(self, forced: torch.Tensor, forced_ids: torch.Tensor, window: int, widening: bool, static: bool,
                 device: torch.device) -> None:
        """`forced`, `forced_ids`: (batch, N) on the CPU; `window` the widest call the window policy asks for, in
        free positions; `widening`: the rows have given cells; `static`: the calls have static shapes."""
        batch, self.n = forced.shape
        self.widening = widening
        # a widened call spans up to `window` free positions plus a row's fixed ones (a static run sizes for the
        # whole image, so that its compiled shapes do not depend on the cells)
        widest = self.n if static else window + int(forced.sum(1).max()) + 1
        self.window = min(widest if widening else window, self.n)  # the widest call; buffers are sized for it
        # free positions before each position (batch, N + 1), and each row's commit count, read back with every
        # call: what `call_width` sizes a call from, on the host
        self.free_before = torch.nn.functional.pad((~forced).long().cumsum(1), (1, 0))
        self.host_committed = torch.zeros(batch, dtype=torch.long)
        span = self.n + self.window  # room for drafts running past the last position
        self.forced = torch.nn.functional.pad(forced, (0, span - self.n)).to(device)  # (batch, span)
        self.forced_ids = torch.nn.functional.pad(forced_ids, (0, span - self.n)).to(device)

    def call_width(self, free: int, done: int) -> int:
        """The slots of a call that verifies `free` free positions in each row still decoding, `done` positions
        committed in the slowest.  Without given cells that is `free`, one more at the end: the last position is
        fed as a draft too.  With them the widest row decides: a row's fixed positions before its `free`-th free
        one ride along, and so do those after it when no free one follows (the image's end)."""
        if not self.widening:
            return min(free, self.n - done + 1)
        live = self.host_committed < self.n
        committed, table = self.host_committed[live].unsqueeze(1), self.free_before[live]
        before = table.gather(1, committed)
        left, remaining = table[:, -1:] - before, self.n - committed  # free positions, and positions, left
        reach = torch.searchsorted(table, before + free) - committed  # slots to the free-th free position
        to_end = (left < free) | ((left == free) & (reach < remaining))
        return int(torch.where(to_end, remaining + 1, reach).max())

    def left(self, done: int) -> int:
        """What the window policy sizes the next call against: the most free positions any row has left (with
        given cells), else the positions left."""
        if not self.widening:
            return self.n - done
        return int((self.free_before[:, -1] - self.free_before.gather(1, self.host_committed.unsqueeze(1))[:, 0])
                   .max())

    def read_commits(self, committed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's commit count (B,), read back after a call; returns (tokens, fixed ones) each row committed
        in that call."""
        # a copy: on the CPU `committed` may be the decoder's own counts, which the next call moves on
        before, self.host_committed = self.host_committed, committed.to("cpu", torch.long, copy=True)
        count = self.host_committed - before
        free = (self.free_before.gather(1, self.host_committed.unsqueeze(1))
                - self.free_before.gather(1, before.unsqueeze(1)))[:, 0]
        return count, count - free

    def fixed_of_slowest(self, done: int, committed: int) -> int:
        """Of the `committed` tokens the slowest row committed up to `done`, the fixed ones."""
        row = int(self.host_committed.argmin())
        return committed - int(self.free_before[row, done] - self.free_before[row, done - committed])

    def make_room(self, extra: int) -> None:
        """`extra` more slots past the last position (a wider decoder joins)."""
        self.forced, self.forced_ids = (torch.nn.functional.pad(t, (0, extra)) for t in (self.forced,
                                                                                        self.forced_ids))
        self.window += extra

    def select(self, index: torch.Tensor) -> None:
        for name in self.ROW_STATE:
            value = getattr(self, name)
            setattr(self, name, value[index.to(value.device)])

    def join(self, other: "FixedCells") -> None:
        for name in self.ROW_STATE:
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        self.widening = self.widening or other.widening
