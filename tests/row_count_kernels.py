"""Stand-in kernels whose result depends on the number of rows in the call, on every machine.

The window-invariant calls (scd_core.compiled.invariant) exist because real kernels pick their reduction order
from the call's shape: cuBLAS splits K for few rows, flash-decoding splits the keys when there are few queries,
CUDA's row reductions give a row fewer lanes when the call has more rows.  Whether a CPU's own kernels do so
depends on its instruction set (oneDNN's AVX512-BF16, AVX512 and AVX2 paths round alike at some shapes on one
machine and apart on another), so a check that "the plain calls round apart" with the machine's kernels proves
nothing on some machines.  Under `RowCountKernels` every `F.linear`, `F.scaled_dot_product_attention`, and `mean`
or `sum` along the last dim (the norms' variance, the sampler's top-p mass) runs the machine's own kernel and,
in a call of more than `FEW_ROWS` rows, moves its result by a relative `NUDGE` (about one bfloat16 step for the
matrix products and attention, a few float32 steps for the reductions): a row gets other bits in a call of many
rows than alone, on any machine, as a CUDA kernel's other reduction order gives it.  A call of a fixed row count
gives a row the same bits wherever it sits, as the real kernels do at one shape.  The attention also moves a
query row's output by a step per slot that its first visible key sits past a multiple of `KEY_BLOCK`: keys moved
by other than whole key blocks are reduced in other groups, as split-KV kernels (and the CPU's flash attention)
do, so a job whose keys move between calls, or between alone and a stream, gets other bits.  Pushed outside the
invariant mode, the stand-ins see the tiles' calls; without the mode, each call's own rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

FEW_ROWS = 4
KEY_BLOCK = 64
NUDGE = {"product": 2.0 ** -8, "reduction": 2.0 ** -14, "key phase": 2.0 ** -10}


def _rows(x: torch.Tensor) -> int:
    return x.reshape(-1, x.shape[-1]).shape[0]


def _nudged(out: torch.Tensor, rows: int, kind: str) -> torch.Tensor:
    return out if rows <= FEW_ROWS else (out.float() * (1 + NUDGE[kind])).to(out.dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    return _nudged(F.linear(x, weight, *args, **kwargs), _rows(x), "product")


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask=None, *args, **kwargs
              ) -> torch.Tensor:
    out = _nudged(F.scaled_dot_product_attention(query, key, value, attn_mask, *args, **kwargs), query.shape[-2],
                  "product")
    if attn_mask is None or attn_mask.dim() < 2:
        return out
    visible = attn_mask if attn_mask.dtype == torch.bool else attn_mask > torch.finfo(attn_mask.dtype).min / 2
    phase = (visible.int().argmax(-1) % KEY_BLOCK).unsqueeze(-1)  # each query row's first visible key
    return (out.float() * (1 + NUDGE["key phase"] * phase)).to(out.dtype)


def row_reduction(func):
    """`func` (torch.sum or torch.mean) as the stand-in runs it along the last dim; any other call as it comes."""
    def run(x, *args, **kwargs):
        out = func(x, *args, **kwargs)
        dim = args[0] if args else kwargs.get("dim")
        along_rows = x.dim() >= 2 and x.is_floating_point() and dim in (-1, x.dim() - 1)
        return _nudged(out, _rows(x), "reduction") if along_rows else out
    return run


class RowCountKernels(TorchFunctionMode):
    """The stand-ins above in place of the kernels they wrap."""

    routes = {F.linear: linear, F.scaled_dot_product_attention: attention,
              **{spelling: row_reduction(reduce) for reduce in (torch.mean, torch.sum)
                 for spelling in (reduce, getattr(torch.Tensor, reduce.__name__))}}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self.routes.get(func, func)(*args, **(kwargs or {}))
