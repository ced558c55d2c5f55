"""Given cells: image positions fixed in advance, for continuation and region regeneration.

A `GivenCells` wraps a conditioning with model ids at the engine's positions and a mask of the cells to keep.
`generate` and `generate_many` take one wherever they take a conditioning: the engine starts the model on
`cond` and forces every kept cell of a row to its token, sampling the others.  The output is the AR law given
those cells: a raster model sees only the cells above and to the left of the one it samples, so regenerating
a region is conditional sampling from what precedes each cell, not inpainting from what surrounds it.  Kept
cells cost no model calls of their own (`engine`: a call's width counts the free positions it verifies).

A call is widened over the kept cells of its widest row, so under a coupler whose tokens depend on the widths
(all but faithful) a row of a batch may differ from the same seed alone; its law does not change.  With
faithful a row is the image of its own seed, and `generate_many` takes given cells with faithful only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch


@dataclass(frozen=True)
class GivenCells:
    """A conditioning plus image cells fixed in advance.

    `tokens` (1 or B, N): model ids at the engine's positions (what `model.decode` takes); `keep` (bool, same
    shape): True where the cell is forced to `tokens` and never sampled.  One row serves every row of a batch;
    B rows give each row of a batch of B its own cells.  A model's own forced tokens (row-ends) stay forced
    whether kept or not; where a cell is kept there, its token must be the model's.
    """

    cond: Any
    tokens: torch.Tensor
    keep: torch.Tensor

    def __post_init__(self) -> None:
        tokens, keep = self.tokens, self.keep
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype.is_floating_point \
                or tokens.dtype == torch.bool or tokens.is_complex():
            raise ValueError(f"GivenCells.tokens must be an integer tensor (rows, num_tokens) of model ids, got "
                             f"{_described(tokens)}")
        if not isinstance(keep, torch.Tensor) or keep.dtype != torch.bool:
            raise ValueError(f"GivenCells.keep must be a bool tensor, got {_described(keep)}")
        if keep.shape != tokens.shape:
            raise ValueError(f"GivenCells.keep has shape {tuple(keep.shape)} where tokens have "
                             f"{tuple(tokens.shape)}: give one flag per token")
        if tokens.shape[0] < 1:
            raise ValueError("GivenCells.tokens has no rows")
        if bool((tokens[keep] < 0).any()):
            raise ValueError(f"GivenCells keeps negative ids: {sorted(set(tokens[keep & (tokens < 0)].tolist()))}")

    def rows(self, num_tokens: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, keep), each (batch_size, num_tokens) long / bool: the cells of every row of a batch."""
        count, length = self.tokens.shape
        if length != num_tokens:
            raise ValueError(f"GivenCells hold {length} tokens per row where the model generates {num_tokens} "
                             f"at its current size: encode the image at the size of the conditioning")
        if count not in (1, batch_size):
            raise ValueError(f"GivenCells hold {count} rows for a batch of {batch_size}: give 1 row (shared) or "
                             f"{batch_size} (one per image)")
        return (self.tokens.long().expand(batch_size, -1).cpu(), self.keep.expand(batch_size, -1).cpu())


def unwrap(cond: Any) -> tuple[Any, Any]:
    """(the model's conditioning, the GivenCells or None) of what `generate` was given."""
    return (cond.cond, cond) if isinstance(cond, GivenCells) else (cond, None)


def forced_cells(forced_tokens: dict[int, int], cells: Optional[tuple[torch.Tensor, torch.Tensor]], batch: int,
                 num_tokens: int, code_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(forced (batch, N) bool, their ids (batch, N)) on the CPU: the model's own forced tokens (row-ends) in
    every row, and the kept cells of `cells` (`GivenCells.rows`).  A kept cell must hold one of the model's
    image codes (`code_ids`), or, where the model forces a token, that token."""
    forced = torch.zeros(batch, num_tokens, dtype=torch.bool)
    ids = torch.zeros(batch, num_tokens, dtype=torch.long)
    for position, token in forced_tokens.items():
        forced[:, position], ids[:, position] = True, token
    if cells is None:
        return forced, ids
    tokens, keep = cells
    clash = keep & forced & (tokens != ids)
    if bool(clash.any()):
        row, position = (int(i) for i in clash.nonzero()[0])
        raise ValueError(f"GivenCells keep id {int(tokens[row, position])} at position {position} (row {row}), "
                         f"where the model forces its own token {int(ids[row, position])} (a row-end): keep that "
                         f"token there, or leave the cell unkept")
    own = keep & ~forced
    strange = own & ~torch.isin(tokens, code_ids.cpu())
    if bool(strange.any()):
        row, position = (int(i) for i in strange.nonzero()[0])
        raise ValueError(f"GivenCells keep id {int(tokens[row, position])} at position {position} (row {row}), "
                         f"which is not one of the model's {code_ids.numel()} image codes: give the model's own "
                         f"ids (`model.encode_image`)")
    return forced | keep, torch.where(own, tokens, ids)


def _grid_rows(grid: Sequence[int]) -> tuple[int, int]:
    """(rows, cols) of a model's `grid` (a video's frames count their rows)."""
    if not grid or len(grid) not in (2, 3) or not all(isinstance(side, int) and side > 0 for side in grid):
        raise ValueError(f"grid must be (rows, cols) or (frames, rows, cols) of positive sizes, got {grid!r}")
    return math.prod(grid[:-1]), grid[-1]


def continuation(tokens: torch.Tensor, rows_kept: int, grid: Sequence[int]) -> torch.Tensor:
    """The `keep` of a continuation: the first `rows_kept` grid rows of `tokens` (B, N), row-end columns
    included (`grid`'s cols count them, as `model.grid` does); bool, the shape of `tokens`."""
    rows, cols = _grid_rows(grid)
    if not isinstance(rows_kept, int) or not 0 <= rows_kept <= rows:
        raise ValueError(f"rows_kept must be an integer in 0..{rows} (the grid's rows), got {rows_kept!r}")
    _check_tokens(tokens, rows * cols, grid)
    keep = torch.zeros(tokens.shape, dtype=torch.bool)
    keep[:, :rows_kept * cols] = True
    return keep


def from_cell_mask(tokens: torch.Tensor, regenerate: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
    """The `keep` of a region regeneration: every image cell outside `regenerate` (1 or B, rows, cols), True
    where a cell is sampled anew.  On a grid with a row-end column (`grid` cols = the mask's + 1) that column
    is not kept: the model's own forced tokens fill it.  Positions after the grid (an end token) are not
    kept either.  Returns a bool (B, N) for `tokens` (B, N)."""
    rows, cols = _grid_rows(grid)
    _check_tokens(tokens, rows * cols, grid)
    if not isinstance(regenerate, torch.Tensor) or regenerate.dtype != torch.bool or regenerate.dim() != 3:
        raise ValueError(f"regenerate must be a bool tensor (batch, rows, cols), got {_described(regenerate)}")
    mask_rows, mask_cols = regenerate.shape[1:]
    if mask_rows != rows or mask_cols not in (cols, cols - 1):
        raise ValueError(f"the mask has {mask_rows} x {mask_cols} cells where the grid has {rows} x {cols}"
                         f"{' (or ' + str(cols - 1) + ' columns without the row-end one)' if cols > 1 else ''}")
    if regenerate.shape[0] not in (1, tokens.shape[0]):
        raise ValueError(f"the mask has {regenerate.shape[0]} rows for {tokens.shape[0]} token rows: give 1 or "
                         f"{tokens.shape[0]}")
    keep_cells = torch.zeros(tokens.shape[0], rows, cols, dtype=torch.bool)
    keep_cells[:, :, :mask_cols] = ~regenerate.cpu()
    keep = torch.zeros(tokens.shape, dtype=torch.bool)
    keep[:, :rows * cols] = keep_cells.flatten(1)
    return keep


def _check_tokens(tokens: torch.Tensor, cells: int, grid: Sequence[int]) -> None:
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        raise ValueError(f"tokens must be (batch, num_tokens) model ids, got {_described(tokens)}")
    if tokens.shape[1] < cells:
        raise ValueError(f"tokens hold {tokens.shape[1]} positions per row, fewer than the {cells} cells of "
                         f"grid {tuple(grid)}")


def _described(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__
