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

import torch
import torch.nn.functional as F

from .row_cache import RowCache


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class RowAttentionBackbone:
    """`backbone` (embed_tokens, layers, norm, rotary_emb, config) over `rows`; each row's left padding
    (`rows.pads`) is subtracted from its slots to give its position ids."""

    def __init__(self, backbone: torch.nn.Module, rows: RowCache) -> None:
        config = backbone.config
        self.backbone, self.rows = backbone, rows
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.groups = config.num_attention_heads // config.num_key_value_heads

    def __call__(self, hidden: torch.Tensor, branches: int = 1) -> torch.Tensor:
        """(rows, T, hidden) input embeddings, each row after its own cached slots -> final-norm hidden states."""
        net = self.backbone
        batch, width = hidden.shape[:2]
        slots, visible = self.rows.begin(width, branches)
        cos, sin = net.rotary_emb(hidden, (slots - self.rows.pads).clamp(min=0))  # left padding takes no position
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        mask = visible.unsqueeze(1).repeat(1, 1, self.groups, 1)  # (rows, 1, groups * T, keys)
        split = (batch, width, -1, self.head_dim)
        for index, layer in enumerate(net.layers):
            attention = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = attention.q_proj(x).view(split).transpose(1, 2)
            k = attention.k_proj(x).view(split).transpose(1, 2)
            keys, values = self.rows.write(index, k * cos + rotate_half(k) * sin,
                                           attention.v_proj(x).view(split).transpose(1, 2))
            # query head h uses KV head h // groups: fold each group's heads into the query rows of its KV head
            q = (q * cos + rotate_half(q) * sin).reshape(batch, keys.shape[1], self.groups * width, self.head_dim)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attention.scaling)
            out = out.reshape(batch, -1, width, self.head_dim).transpose(1, 2).reshape(batch, width, -1)
            hidden = hidden + attention.o_proj(out)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return net.norm(hidden)
