"""What a call decided, packed on the device into one float32 tensor (exact for these integers) and read back
in the iteration's one host synchronisation: `CallSummary.pack` in `_Decoder.decide`, `CallSummary.read` in
`Run.verify`."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class CallSummary:
    slowest: int              # the slowest row's commit count after the call
    largest: int              # the most any row committed in it (how far the next call's noise window moves)
    has_nan: bool             # the model returned NaN logits
    live: int                 # rows still decoding
    changed: int              # carried drafts that changed ...
    carried: int              # ... out of these
    committed: torch.Tensor   # (B,) each row's commit count so far, on the CPU
    counts: list[int]         # counts[c]: rows (cache groups) that committed c tokens, c = 0 .. width
    acceptance: list[float]   # the share of drafts accepted, per slot

    @staticmethod
    def pack(committed: torch.Tensor, shared: torch.Tensor, live: torch.Tensor, has_nan: torch.Tensor,
             changes: torch.Tensor, counts: torch.Tensor, acceptance: torch.Tensor) -> torch.Tensor:
        """The fields in their order, on the device (`changes`: the changed and carried counts)."""
        head = torch.stack([committed.min(), shared.max(), has_nan.long(), live])
        return torch.cat([torch.cat([head, changes, committed, counts]).float(), acceptance])

    @classmethod
    def read(cls, packed: torch.Tensor, rows: int, width: int) -> "CallSummary":
        """The summary of a call decided at `width` slots over `rows` rows (one host synchronisation)."""
        values = packed.tolist()
        slowest, largest, has_nan, live, changed, carried = map(int, values[:6])
        counts = list(map(int, values[6 + rows:6 + rows + width + 1]))
        return cls(slowest, largest, bool(has_nan), live, changed, carried, torch.tensor(values[6:6 + rows]),
                   counts, values[6 + rows + len(counts):])
