"""Cache rows kept across the segments of one long sequence (Emu3.5's stories: text, then an image, then text ...).

Each row of a `KeptRows` holds a start of its own token list (the cond row the whole sequence, the uncond row what
its context is fed).  A segment's first call feeds each row only the ids it lacks (`catch_up`), so a switch between
segments costs the new tokens, never the sequence again.  Text steps call it on one row alone (a `RowCache.view`);
an image runs the engine over both rows through a `KeptSession`, whose prefill is that catch-up.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ...compiled.invariant import fixed_shape_calls, wanted
from ...model import Logits
from .cfg_session import BackboneHead, Embed
from .row_attention import RowAttentionBackbone
from .row_cache import RowCache
from .row_session import RowSession


class KeptRows:
    """`rows` cache rows of `capacity` slots for `net` (a transformers causal LM: `.model` the decoder, `.config`),
    allocated at once."""

    def __init__(self, net: torch.nn.Module, rows: int, capacity: int, device: torch.device) -> None:
        self.net = net
        config, dtype = net.config, net.get_input_embeddings().weight.dtype
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.cache = RowCache(rows, capacity, 0, device)
        self.cache.allocate(config.num_hidden_layers, config.num_key_value_heads, head_dim, dtype)
        self.cache.full_keys = wanted(dtype)  # as a session's prefill decides it (row_session)

    @torch.no_grad()
    def catch_up(self, sequences: Sequence[Sequence[int]], head: Embed) -> torch.Tensor:
        """Feed the first rows the ids of `sequences` they lack (row i those of sequence i), in one call (a shorter
        feed padded after its ids, the padding rewound); `head`'s float logits (rows, V) after each sequence's last
        id.  A row that holds its whole sequence is fed its last id again, so that every row yields logits.  The
        rows must hold starts of their sequences: the engine leaves only committed ids in them."""
        rows = len(sequences)
        cache = self.cache if rows == self.cache.lengths.shape[0] else self.cache.view(slice(0, rows))
        held = cache.lengths.tolist()
        if any(count > len(ids) or not ids for count, ids in zip(held, sequences)):
            raise ValueError(f"kept rows hold {held} ids, more than their sequences' {[len(s) for s in sequences]}")
        back, device = [max(0, count - len(ids) + 1) for count, ids in zip(held, sequences)], cache.lengths.device
        if any(back):
            cache.rewind(torch.tensor(back, device=device))
        missing = [list(ids[count - drop:]) for count, drop, ids in zip(held, back, sequences)]
        width = max(map(len, missing))
        fed = torch.tensor([ids + ids[-1:] * (width - len(ids)) for ids in missing], device=device)
        with fixed_shape_calls(cache.full_keys, device):
            hidden = RowAttentionBackbone(self.net.model, cache)(self.net.get_input_embeddings()(fed))
            last = torch.tensor([len(ids) - 1 for ids in missing], device=device)
            logits = head(hidden[torch.arange(rows, device=device), last])
        cache.rewind(torch.tensor([width - len(ids) for ids in missing], device=device))
        self.cache.recount()
        return logits.to(torch.promote_types(logits.dtype, torch.float32))


class KeptSession(RowSession):
    """An engine session over both rows of `rows` (cond, then uncond) for an image of `num_tokens` after
    `sequences`: its prefill feeds each row what it lacks; its window calls run `head` as any session's."""

    def __init__(self, rows: KeptRows, sequences: tuple[Sequence[int], Sequence[int]], num_tokens: int,
                 head: Embed) -> None:
        net = rows.net
        network = BackboneHead(lambda cache: RowAttentionBackbone(net.model, cache), net.get_input_embeddings(),
                               net.get_input_embeddings(), head)
        context = torch.empty(len(sequences), 0, dtype=torch.long, device=rows.cache.lengths.device)
        super().__init__(context, num_tokens, network, copies=len(sequences), cache=rows.cache)
        self.rows, self.sequences, self.head = rows, sequences, head

    def prefill(self) -> Logits:
        """The ids each row lacks, in one call; the logits of the image's first position."""
        return self._split(self.rows.catch_up(self.sequences, self.head)[:, None])
