"""A Llama-style transformers backbone run over a pre-allocated KV cache with a logical length.

transformers' DynamicCache concatenates on every append (a copy of the whole
cache per call at 8k tokens) and its crop API drifted across releases.  Here
each layer's keys and values live in one tensor sized for the whole generation;
a call writes its window in place and attends to the filled part (a view), and
`rewind` only moves the length.  The layers' own modules (norms, projections,
rotary embedding, MLP) do the rest, so the weights and numerics stay
transformers'; only the attention over the cache is ours.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class StaticKVBackbone:
    """Keys/values of `rows` sequences for `backbone` (a transformers Llama-style text model), up to `capacity`.

    `key_mask` (rows, prefix_len) marks the real (not left-padding) prefix slots;
    every slot after the prefix is real.  `pads` (rows, 1), each row's left padding,
    is subtracted from the slot index to give its RoPE position.
    """

    def __init__(self, backbone: torch.nn.Module, key_mask: torch.Tensor, pads: torch.Tensor, capacity: int) -> None:
        config = backbone.config
        rows = key_mask.shape[0]
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.backbone = backbone
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        self.groups = heads // kv_heads
        weight = backbone.embed_tokens.weight
        shape = (len(backbone.layers), rows, kv_heads, capacity, self.head_dim)
        self.keys = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
        self.values = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
        self.real = torch.ones(rows, capacity, dtype=torch.bool, device=weight.device)
        self.real[:, :key_mask.shape[1]] = key_mask.bool()
        self.pads = pads
        self.slots = torch.arange(capacity, device=weight.device)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    def nbytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()

    def rewind(self, n: int) -> None:
        self.length -= n

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Append (rows, T) token ids; returns the final-norm hidden states (rows, T, hidden)."""
        start, width = self.length, ids.shape[1]
        end = start + width
        if end > self.capacity:
            raise ValueError(f"the KV cache holds {self.capacity} positions; {end} were requested")
        net = self.backbone
        hidden = net.embed_tokens(ids)
        query_slots = self.slots[start:end]
        cos, sin = net.rotary_emb(hidden, query_slots.unsqueeze(0) - self.pads)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        # causal over the filled slots, padding hidden; a padding query sees itself so no row is all -inf
        keys = self.slots[:end]
        visible = (keys <= query_slots.unsqueeze(1)) & (self.real[:, None, :end] | (keys == query_slots.unsqueeze(1)))
        mask = visible.unsqueeze(1).repeat(1, 1, self.groups, 1)  # (rows, 1, groups * T, end)
        for index, layer in enumerate(net.layers):
            attention = layer.self_attn
            x = layer.input_layernorm(hidden)
            split = (x.shape[0], width, -1, self.head_dim)
            q = attention.q_proj(x).view(split).transpose(1, 2)
            k = attention.k_proj(x).view(split).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            self.keys[index, :, :, start:end] = k * cos + rotate_half(k) * sin
            self.values[index, :, :, start:end] = attention.v_proj(x).view(split).transpose(1, 2)
            # grouped-query attention without repeating the cache: a KV head's query heads become extra rows
            q = q.reshape(q.shape[0], -1, self.groups * width, self.head_dim)
            out = F.scaled_dot_product_attention(q, self.keys[index, :, :, :end], self.values[index, :, :, :end],
                                                 attn_mask=mask, scale=attention.scaling)
            out = out.reshape(x.shape[0], -1, width, self.head_dim).transpose(1, 2).reshape(x.shape[0], width, -1)
            hidden = hidden + attention.o_proj(out)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        self.length = end
        return net.norm(hidden)
