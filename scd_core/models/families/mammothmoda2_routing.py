"""MammothModa2's routed decoder layer, shared by the token stage's row cache and the condition's fresh forward.

The authors route by the input id (modeling_mammothmoda2_qwen*_vl.py moe_forward): generation ids through gen_mlp,
the others through mlp; here a torch.where, no host branch, so a window computes what single steps compute.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..sessions.row_attention import attention_block


def routed_layer(layer: nn.Module, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                 cache: Any, groups: int, route: torch.Tensor) -> torch.Tensor:
    """A decoder layer whose FFN is gen_mlp where `route` (rows, T, 1) is set, mlp elsewhere (tensor ops only)."""
    hidden = attention_block(layer, hidden, cos, sin, mask, cache, groups)
    x = layer.post_attention_layernorm(hidden)
    expert = getattr(layer, "gen_mlp", None)
    return hidden + (layer.mlp(x) if expert is None else torch.where(route, expert(x), layer.mlp(x)))
