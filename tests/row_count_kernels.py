"""Stand-in kernels whose rounding depends on the number of rows in the call, the same on every machine.

The window-invariant calls (scd_core.models.invariant) exist because real kernels pick their reduction order
from the call's shape: cuBLAS splits K for few rows, flash-decoding splits the keys when there are few queries.
Whether a CPU's own kernels do so depends on its instruction set (oneDNN's AVX512-BF16, AVX512 and AVX2 paths
round alike at some shapes on one machine and apart on another), so a check that "the plain calls round apart"
with the machine's kernels proves nothing on some machines.  Under `RowCountKernels` every `F.linear` and
`F.scaled_dot_product_attention` runs through a kernel that does this by construction, on any machine:

- linear: a call of more than `SPLIT_ABOVE_ROWS` rows sums K in two halves, each rounded to the output dtype;
  fewer rows sum it whole;
- attention: a call of more than `SPLIT_ABOVE_ROWS` query rows reduces the keys in blocks of `KEY_BLOCK`, each
  block's output rounded to the output dtype and merged by its log-sum-exp; fewer rows reduce them whole.

Each sum runs in float64 over low-precision inputs, exact up to the final rounding, so the bits depend on the
row count only, never on the machine or on where a row sits among the others.  Pushed outside the invariant
mode, it sees the tiles' calls; without the mode, each call's own rows.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

SPLIT_ABOVE_ROWS = 4
KEY_BLOCK = 64


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1]).double()
    halves = 2 if flat.shape[0] > SPLIT_ABOVE_ROWS else 1
    out = sum((part_x @ part_w.T).to(x.dtype).double()
              for part_x, part_w in zip(flat.tensor_split(halves, dim=1), weight.double().tensor_split(halves, dim=1)))
    if bias is not None:
        out = out + bias.double()
    return out.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
              dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
              enable_gqa: bool = False) -> torch.Tensor:
    assert dropout_p == 0.0, "the stand-in has no dropout"
    rows, keys = query.shape[-2], key.shape[-2]
    if key.shape[-3] != query.shape[-3]:  # grouped-query attention: each KV head serves a group of query heads
        repeat = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(repeat, dim=-3), value.repeat_interleave(repeat, dim=-3)
    scores = query.double() @ key.double().transpose(-1, -2) * (scale or query.shape[-1] ** -0.5)
    if is_causal:
        attn_mask = torch.ones(rows, keys, dtype=torch.bool, device=query.device).tril()
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, -torch.inf) if attn_mask.dtype == torch.bool else scores + attn_mask
    block = KEY_BLOCK if rows > SPLIT_ABOVE_ROWS else keys
    outs, sums = [], []
    for part_scores, part_values in zip(scores.split(block, dim=-1), value.double().split(block, dim=-2)):
        log_sum = part_scores.logsumexp(-1, keepdim=True)  # -inf where the block holds no visible key
        weights = (part_scores - log_sum).exp().nan_to_num(0.0)
        outs.append((weights @ part_values).to(query.dtype).double())
        sums.append(log_sum)
    log_sums = torch.cat(sums, dim=-1)
    shares = (log_sums - log_sums.logsumexp(-1, keepdim=True)).exp().nan_to_num(0.0)
    return sum(share.unsqueeze(-1) * out for share, out in zip(shares.unbind(-1), outs)).to(query.dtype)


class RowCountKernels(TorchFunctionMode):
    """`F.linear` and `F.scaled_dot_product_attention` run by the stand-ins above."""

    routes = {F.linear: linear, F.scaled_dot_product_attention: attention}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self.routes.get(func, func)(*args, **(kwargs or {}))
