"""Window calls whose logits do not depend on the window: every matrix product of a call at one shape.

A position's logits must be a function of its prefix only, or faithful's seed stops deciding the image.  In
bfloat16 and float16 they are not, as the kernels run: which GEMM and attention kernel runs, and how it splits
its reductions, depends on the shape of the call (measured on this CPU, torch 2.14, bfloat16: `F.linear` gives a
row other bits in a call of more than 32 rows at K >= 512, of 31 at K = 11008; float16 at 2 rows already;
`scaled_dot_product_attention` gives a query row other bits when the number of query rows or the key length
changes).  Run at one fixed shape the same kernels give every row the same bits wherever it sits among the
others, whatever they hold (measured for linear at 8, 32 and 64 rows up to K = 11008, and for attention at 1 to
256 query rows up to 1100 keys, bfloat16, float16 and float32).  So while `fixed_shape_calls` is active:

- every linear layer runs over its input rows in tiles of exactly `tile_rows(device)` rows (the last one padded
  with zeros): batch x copies x width rows, the prompt's and the heads' included;
- every attention call runs its query rows in tiles of as many rows (padded rows see every key) over a key
  length that the cache keeps fixed (`RowCache.full_keys`: the whole pre-sized cache, masked).

The tile is 32 rows on a CPU, where a padded row costs its arithmetic, and 128 on CUDA, where a call of up to
about 150 rows costs the read of its weights whatever its rows (performance facts for H100 / H200; a tile of 32
would read the weights twice in a window-32 call with CFG, four times at 64).  The CUDA choice is not measured
yet: `python -m scd_core.bench device-run` compares tiles of 32, 64 and 128 rows there, bits and time.

Row-wise work (norms, activations, rotary embeddings, the sampler's softmax) never mixes rows.  Which dtypes take
it: `wanted`; the padding costs the narrow calls most (scd_core/bench/README.md, "Window-invariant calls").
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

TILE_ROWS = {"cuda": 128}  # rows of every linear tile and query rows of every attention tile, by device type
DEFAULT_TILE_ROWS = 32     # elsewhere (the CPU)

# "auto": bfloat16 and float16 (float32's kernels round alike at the shapes measured: tests/test_reproducible.py);
# "on": every dtype; "off": today's calls, each at its own shape (the cheapest; a seed's image then depends on
# the window in bfloat16 / float16)
POLICIES = ("auto", "on", "off")
POLICY_VARIABLE = "SCD_INVARIANT_CALLS"
HALF_DTYPES = (torch.bfloat16, torch.float16)


def policy() -> str:
    """The process's policy: `SCD_INVARIANT_CALLS` (auto when unset)."""
    name = os.environ.get(POLICY_VARIABLE, "auto").strip().lower() or "auto"
    if name not in POLICIES:
        raise ValueError(f"{POLICY_VARIABLE}={name!r}: use one of {', '.join(POLICIES)}")
    return name


def wanted(dtype: torch.dtype) -> bool:
    """Whether calls computing in `dtype` run at fixed shapes under the process's policy."""
    chosen = policy()
    return chosen == "on" or (chosen == "auto" and dtype in HALF_DTYPES)


def tile_rows(device: torch.device) -> int:
    """The rows of a tile on `device`."""
    return TILE_ROWS.get(device.type, DEFAULT_TILE_ROWS)


def _padded_rows(x: torch.Tensor, dim: int, multiple: int, value: Any = 0) -> torch.Tensor:
    """`x` with zeros (or `value`) appended along `dim` up to a multiple of `multiple`."""
    extra = -x.shape[dim] % multiple
    if not extra:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, torch.full(shape, value, dtype=x.dtype, device=x.device)], dim=dim)


def tiled_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                 rows: int = DEFAULT_TILE_ROWS) -> torch.Tensor:
    """`F.linear(x, weight, bias)` as GEMMs of exactly `rows` rows each."""
    flat = _padded_rows(x.reshape(-1, x.shape[-1]), 0, rows)
    out = _joined([F.linear(tile, weight, bias) for tile in flat.split(rows)], 0)
    return out[:x.shape[:-1].numel()].reshape(*x.shape[:-1], out.shape[-1])


def tiled_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0, is_causal: bool = False,
                    scale: Optional[float] = None, enable_gqa: bool = False, rows: int = DEFAULT_TILE_ROWS
                    ) -> torch.Tensor:
    """`F.scaled_dot_product_attention` with its query rows in tiles of exactly `rows` (masked calls only: a
    causal one's mask depends on where its tile starts)."""
    options = dict(dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa)
    if attn_mask is None or is_causal or attn_mask.dim() < 2:
        return F.scaled_dot_product_attention(query, key, value, attn_mask, is_causal=is_causal, **options)
    count = query.shape[-2]
    # a mask row broadcast to every query is written out: each tile reads one mask layout
    masks = attn_mask.expand(*attn_mask.shape[:-2], count, attn_mask.shape[-1])
    masks = _padded_rows(masks, -2, rows, True if attn_mask.dtype == torch.bool else 0)  # padding sees every key
    tiles = [F.scaled_dot_product_attention(tile, key, value, mask, **options)
             for tile, mask in zip(_padded_rows(query, -2, rows).split(rows, dim=-2), masks.split(rows, dim=-2))]
    return _joined(tiles, -2)[..., :count, :]


def _joined(tiles: list[torch.Tensor], dim: int) -> torch.Tensor:
    """The tiles' outputs as one tensor (one tile, the common case on CUDA, as it is: no copy, no launch)."""
    return tiles[0] if len(tiles) == 1 else torch.cat(tiles, dim=dim)


class FixedShapeCalls(TorchFunctionMode):
    """Routes `F.linear` and `F.scaled_dot_product_attention` through their tiled versions, in tiles of `rows`."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.routes: dict[Callable[..., Any], Callable[..., torch.Tensor]] = {
            F.linear: functools.partial(tiled_linear, rows=rows),
            F.scaled_dot_product_attention: functools.partial(tiled_attention, rows=rows)}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        route = self.routes.get(func)
        return (route or func)(*args, **(kwargs or {}))


@contextlib.contextmanager
def fixed_shape_calls(active: bool, device: torch.device) -> Iterator[None]:
    """Run the calls inside at fixed shapes (`active`: in tiles of `tile_rows(device)`), or as they come."""
    if not active:
        yield
        return
    with FixedShapeCalls(tile_rows(device)):
        yield
