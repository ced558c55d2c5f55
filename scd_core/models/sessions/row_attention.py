"""A Llama-style transformers text model run layer by layer over a `RowCache`.

The layers' own modules (norms, projections, rotary embedding, MLP) compute
everything but the attention over the cache, so weights and numerics stay
transformers'.  The attention is ours for one reason: with a 4-D mask,
transformers' grouped-query attention repeats every cached key and value per
query head on each call (a copy of the whole cache, 4x for Emu3's 32/8 heads).
Here the query heads that share a KV head become extra query rows instead, so
the cache is only ever read in place.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .row_cache import LayerSlots, RowCache


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def attention_layer(layer: torch.nn.Module, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    mask: torch.Tensor, cache: LayerSlots, groups: int) -> torch.Tensor:
    """One decoder layer over its cache tensors: tensors and constants only, so one compiled graph (per width)
    serves every layer."""
    hidden = attention_block(layer, hidden, cos, sin, mask, cache, groups)
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))


def attention_block(layer: torch.nn.Module, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    mask: torch.Tensor, cache: LayerSlots, groups: int) -> torch.Tensor:
    """A decoder layer's attention half over its cache tensors, its residual added: the layer's FFN comes next."""
    attention = layer.self_attn
    batch, width = hidden.shape[:2]
    head_dim = attention.head_dim
    split = (batch, width, -1, head_dim)
    x = layer.input_layernorm(hidden)
    q, k = attention.q_proj(x).view(split), attention.k_proj(x).view(split)
    if hasattr(attention, "q_norm"):  # Qwen3-style layers (Emu3.5): each head's query and key RMS-normed first
        q, k = attention.q_norm(q), attention.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    keys, values = cache.write(k * cos + rotate_half(k) * sin, attention.v_proj(x).view(split).transpose(1, 2))
    # query head h uses KV head h // groups: fold each group's heads into the query rows of its KV head
    q = (q * cos + rotate_half(q) * sin).reshape(batch, keys.shape[1], groups * width, head_dim)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attention.scaling)
    out = out.reshape(batch, -1, width, head_dim).transpose(1, 2).reshape(batch, width, -1)
    return hidden + attention.o_proj(out)


class RowAttentionBackbone:
    """`backbone` (embed_tokens, layers, norm, rotary_emb, config) over `rows`; each row's left padding
    (`rows.pads`) is subtracted from its slots to give its position ids.

    With `compiled_layer` (a compiled `attention_layer`) the window calls after the prefill run through it:
    with `rows.static` their shapes depend on the width only (scd_core.compiled.compiled_regions).  `layer_step`:
    what runs each layer otherwise (`attention_layer`'s arguments; MammothModa2's routes the FFN).
    """

    def __init__(self, backbone: torch.nn.Module, rows: RowCache,
                 compiled_layer: Optional[Callable[..., torch.Tensor]] = None,
                 layer_step: Callable[..., torch.Tensor] = attention_layer) -> None:
        config = backbone.config
        self.backbone, self.rows, self.layer_step = backbone, rows, layer_step
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.groups = config.num_attention_heads // config.num_key_value_heads
        self.compiled_layer = compiled_layer

    def __call__(self, hidden: torch.Tensor, branches: int = 1) -> torch.Tensor:
        """(rows, T, hidden) input embeddings, each row after its own cached slots -> final-norm hidden states."""
        net = self.backbone
        # the prefill runs eagerly: its one shape per prompt length is not worth a compilation
        run_layer = self.compiled_layer if self.compiled_layer is not None and self.rows.longest else self.layer_step
        slots, visible = self.rows.begin(hidden.shape[1], branches)
        if not self.rows.keys:
            self.rows.allocate(len(net.layers), net.config.num_key_value_heads, self.head_dim, hidden.dtype)
        cos, sin = net.rotary_emb(hidden, (slots - self.rows.pads).clamp(min=0))  # left padding takes no position
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        mask = visible.unsqueeze(1).repeat(1, 1, self.groups, 1)  # (rows, 1, groups * T, keys)
        for index, layer in enumerate(net.layers):
            hidden = run_layer(layer, hidden, cos, sin, mask, self.rows.layer(index), self.groups)
        return net.norm(hidden)
