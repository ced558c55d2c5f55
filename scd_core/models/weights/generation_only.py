"""Dropping at load time what image generation never runs: image encoders, text heads, unsampled head rows."""

from __future__ import annotations

import torch
from torch import nn


def drop_modules(root: nn.Module, *names: str) -> None:
    """Remove the submodules `names` (dotted paths under `root`), freeing their weights."""
    for name in names:
        parent, _, leaf = name.rpartition(".")
        delattr(root.get_submodule(parent) if parent else root, leaf)


def code_rows_head(head: nn.Linear, code_ids: torch.Tensor) -> nn.Linear:
    """A head that computes only the rows `code_ids` of `head` (in that order); the other rows are freed."""
    weight = head.weight.detach()
    first, count = int(code_ids[0]), code_ids.numel()
    contiguous = torch.equal(code_ids.cpu(), torch.arange(first, first + count))
    rows = weight[first:first + count] if contiguous else weight[code_ids.to(weight.device)]
    sliced = nn.Linear(head.in_features, count, bias=head.bias is not None, device="meta")
    sliced.weight = nn.Parameter(rows.clone(), requires_grad=False)
    if head.bias is not None:
        bias = head.bias.detach()
        sliced.bias = nn.Parameter((bias[first:first + count] if contiguous else bias[code_ids]).clone(),
                                   requires_grad=False)
    return sliced.eval()
