"""Images as rows of codes, each row closed by a row-end token, then closing tokens: the layout Lumina-mGPT, Emu3
and Emu3.5 generate (Emu3.5 leaves out the last row's row-end)."""

from __future__ import annotations

from typing import Sequence

import torch


def forced_tokens(rows: int, cols: int, row_end: int, closing: Sequence[int], last_row_end: bool = True
                  ) -> dict[int, int]:
    """Position -> token of the layout's forced cells: each row's row-end after its `cols` codes (the last row's
    too where `last_row_end`), then the `closing` tokens."""
    ends = rows if last_row_end else rows - 1
    forced = {row * (cols + 1) + cols: row_end for row in range(ends)}
    after = rows * (cols + 1) - (0 if last_row_end else 1)
    forced.update({after + i: token for i, token in enumerate(closing)})
    return forced


def code_cells(tokens: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Ids (batch, N) in the layout -> the code cells' (batch, rows, cols): row-ends and closing tokens left out."""
    return tokens[:, :rows * (cols + 1)].reshape(-1, rows, cols + 1)[..., :cols]


def with_row_ends(ids: torch.Tensor, row_end: int) -> torch.Tensor:
    """Code ids (batch, rows, cols) -> (batch, rows * (cols + 1)): each row followed by a row-end."""
    row_ends = torch.full((*ids.shape[:2], 1), row_end, dtype=ids.dtype, device=ids.device)
    return torch.cat([ids, row_ends], dim=2).flatten(1)
