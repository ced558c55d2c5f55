"""The row session of the transformers-backed families (Janus-Pro, Lumina-mGPT, Emu3, Emu3.5, GLM-Image).

Two rows per sample (cond, uncond: `row_session.RowSession`) whose prompts are token
ids.  A family supplies only what differs: the backbone run over the cache, how
prefix ids and image ids become input embeddings, and the head that turns hidden
states into logits over the ids it samples.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from .row_cache import RowCache
from .row_session import PROMPT_BUCKET, RowSession

Embed = Callable[[torch.Tensor], torch.Tensor]  # (rows, T) ids -> (rows, T, hidden)
Backbone = Callable[[torch.Tensor, int], torch.Tensor]  # (rows, T, hidden) embeddings, tree branches -> hidden


def cfg_prefix(cond: Sequence[int], uncond: Sequence[int], pad: int, batch_size: int, device: torch.device
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The (2 x batch, width) prefix ids, cond rows then uncond rows, left-padded with `pad` to one width, and
    the mask that is 0 on the padding (never attended, so any id will do)."""
    width = max(len(cond), len(uncond))
    rows = [[pad] * (width - len(ids)) + list(ids) for ids in (cond, uncond)]
    masks = [[0] * (width - len(ids)) + [1] * len(ids) for ids in (cond, uncond)]
    return (torch.tensor(rows, device=device).repeat_interleave(batch_size, dim=0),
            torch.tensor(masks, device=device).repeat_interleave(batch_size, dim=0))


def check_positions(cond: Sequence[int], uncond: Sequence[int], image_tokens: int, limit: int, advice: str
                    ) -> None:
    """The prompt's longer branch and the image must fit the model's `limit` positions; `advice` says what to
    change when they do not."""
    width = max(len(cond), len(uncond))
    if width + image_tokens > limit:
        raise ValueError(f"prompt ({width} tokens) plus image ({image_tokens}) exceed the model's {limit} "
                         f"positions: {advice}")


class BackboneHead:
    """A `row_session.RowNetwork`: input embeddings through `backbone(cache)`, then `head` on the hidden states."""

    def __init__(self, backbone: Callable[[RowCache], Backbone], embed_prefix: Embed, embed_image: Embed,
                 head: Embed) -> None:
        self.embed_context, self.embed_tokens = embed_prefix, embed_image
        self._make_backbone, self._head = backbone, head
        self._bound: tuple[Optional[RowCache], Optional[Backbone]] = (None, None)

    def __call__(self, cache: RowCache, inputs: torch.Tensor, extras: Sequence[torch.Tensor], branches: int,
                 last_only: bool) -> torch.Tensor:
        if self._bound[0] is not cache:  # a backbone holds its cache: built again when the session's changes
            self._bound = (cache, self._make_backbone(cache))
        hidden = self._bound[1](inputs, branches)
        logits = self._head(hidden[:, -1:] if last_only else hidden)
        return logits.to(torch.promote_types(logits.dtype, torch.float32))


class CFGSession(RowSession):
    prompt_bucket = PROMPT_BUCKET  # text prompts of any length: a compiled model's graphs serve a bucket of them

    def __init__(self, prefix: torch.Tensor, prefix_mask: torch.Tensor, num_tokens: int,
                 backbone: Callable[[RowCache], Backbone], embed_prefix: Embed, embed_image: Embed,
                 head: Embed, static_shapes: bool = False, guided: bool = True, copies: int = 2,
                 guidance: Optional[Callable[[float], Sequence[float]]] = None) -> None:
        """`prefix` (copies x batch, width) ids (or what `embed_prefix` takes), left-padded where `prefix_mask`
        is 0, the uncond rows last; `backbone(cache)` builds the callable that runs input embeddings (rows, T,
        hidden) over `cache` (whose `pads` is each row's left padding).  `static_shapes`: the cache is static
        (scd_core.compiled.compiled_regions) and the backbone compiled.  `guided` False: without the uncond rows (a CFG
        scale of 1 never reads their logits).  `guidance`: the branches' weights where there are more than
        cond and uncond (`model.Session`), for the rows kept."""
        if not guided:
            kept = prefix.shape[0] // copies * (copies - 1)
            prefix, prefix_mask, copies = prefix[:kept], prefix_mask[:kept], copies - 1
        super().__init__(prefix, num_tokens, BackboneHead(backbone, embed_prefix, embed_image, head), copies=copies,
                         real=prefix_mask, static_shapes=static_shapes, guidance=guidance)
