"""The session the transformers-backed families share (Janus-Pro, Lumina-mGPT, Emu3).

One generation holds 2 x batch rows in one RowCache, the cond rows then the
uncond rows, so classifier-free guidance costs one batched forward.  A sample's
two rows are fed the same drafts and rewound together; samples advance at their
own pace.  A family supplies only what differs: the backbone run over the cache,
how prefix ids and image ids become input embeddings, and the head that turns
hidden states into logits over the ids it samples.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import torch

from ..model import Logits
from .row_cache import RowCache, joined_call, left_padded, paired_order

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


class CFGSession:
    rows_per_cache = 1

    def __init__(self, prefix: torch.Tensor, prefix_mask: torch.Tensor, num_tokens: int,
                 backbone: Callable[[RowCache], Backbone], embed_prefix: Embed, embed_image: Embed,
                 head: Embed, static_shapes: bool = False) -> None:
        """`prefix` (2 x batch, width) ids, left-padded where `prefix_mask` is 0; `backbone(cache)` builds the
        callable that runs input embeddings (rows, T, hidden) over `cache` (whose `pads` is each row's left
        padding).  `static_shapes`: the cache is static (scd_core.static_step) and the backbone compiled."""
        self._prefix, self._num_tokens = prefix, num_tokens
        self._batch = prefix.shape[0] // 2
        width = prefix.shape[1]
        self.cache = RowCache(prefix.shape[0], width + num_tokens, width, prefix.device, real=prefix_mask)
        self.static_shapes = self.cache.static = static_shapes
        self._make_backbone = backbone
        self._backbone = backbone(self.cache)
        self._embed_prefix, self._embed_image, self._head = embed_prefix, embed_image, head

    @torch.no_grad()
    def prefill(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cache.longest:
            raise RuntimeError("prefill() was already called for this session")
        return self._run(self._embed_prefix(self._prefix), last_only=True)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, branches: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed (batch, T) image-position ids (codes and framing ids), each sample after its own cached tokens;
        with `branches` > 1 they are a tree (`row_cache.tree_layout`)."""
        if not self.cache.longest:
            raise RuntimeError("call prefill() before forward()")
        if tokens.dim() != 2 or tokens.shape[0] != self._batch or tokens.shape[1] < 1:
            raise ValueError(f"tokens must be (batch={self._batch}, T>=1) token ids, got shape {tuple(tokens.shape)}")
        # the same drafts in both rows of a sample
        return self._run(self._embed_image(tokens.to(self._prefix.device).repeat(2, 1)), branches=branches)

    @torch.no_grad()
    def admit(self, fresh: Sequence["CFGSession"], tokens: Optional[torch.Tensor] = None
              ) -> tuple[Optional[Logits], Logits]:
        """Prefill the samples of `fresh` (sessions of this model from `start`, not prefilled) and go on with them
        after this session's samples; their prompts may differ in length (left padding).  With `tokens` the same
        call also feeds this session's samples as `forward(tokens)` would, when the prompts are no longer than
        `tokens` (else two calls).  Returns (the logits of `tokens` or None, the new samples' position-0 logits).
        A session not prefilled yet runs its own prefix in that call too, first."""
        prefilled = bool(self.cache.longest)
        if any(not isinstance(session, CFGSession) or session.cache.longest for session in fresh):
            raise ValueError("admit() takes sessions of the same model from start(), not prefilled")
        joining = list(fresh) if prefilled else [self, *fresh]
        halves = [(session._prefix[rows], session.cache.real[rows, :session.cache.prefix])
                  for half in (0, 1) for session in joining
                  for rows in [slice(half * session._batch, (half + 1) * session._batch)]]
        group = CFGSession(left_padded([ids for ids, _ in halves]), left_padded([mask for _, mask in halves], False),
                           self._num_tokens, self._make_backbone, self._embed_prefix, self._embed_image, self._head)
        if not prefilled:
            self.cache, self._backbone, self._prefix, self._batch = (group.cache, group._backbone, group._prefix,
                                                                     group._batch)
            return None, self.prefill()
        fed = None
        if tokens is not None and tokens.shape[1] < group._prefix.shape[1]:
            fed, tokens = self.forward(tokens), None
        batch, order = self._batch, paired_order(self._batch, group._batch, self._prefix.device)
        self._prefix = left_padded([self._prefix, group._prefix])[order]
        self._batch += group._batch
        if tokens is None:
            logits = group.prefill()
            self.cache = RowCache.joined([self.cache, group.cache], order)
            self._backbone = self._make_backbone(self.cache)
            return fed, logits
        live = self._embed_image(tokens.to(self._prefix.device).repeat(2, 1))
        self.cache, (cond, uncond) = joined_call(self.cache, group.cache, live, self._embed_prefix(group._prefix),
                                                 order, self._run_over)
        width, last = tokens.shape[1], group._prefix.shape[1] - 1
        return ((cond[:batch, :width], uncond[:batch, :width]),
                (cond[batch:, last:last + 1], uncond[batch:, last:last + 1]))

    def _run_over(self, cache: RowCache, embeds: torch.Tensor) -> Logits:
        """`_run` over `cache`, from now on this session's."""
        self.cache, self._backbone = cache, self._make_backbone(cache)
        return self._run(embeds)

    def rewind(self, n: Union[int, torch.Tensor]) -> None:
        """Drop the last n image tokens of every sample (an int) or of each sample (a (batch,) tensor)."""
        if isinstance(n, torch.Tensor) and n.dim() > 0:
            n = n.repeat(2)  # a sample's cond and uncond rows move together
        self.cache.rewind(n)

    def keep_branch(self, branch: torch.Tensor, width: int, branches: int) -> None:
        """After a tree call: keep each sample's chain `branch` (both of its rows)."""
        self.cache.keep_branch(branch.to(self._prefix.device).repeat(2), width, branches)

    def keep_rows(self, index: torch.Tensor) -> None:
        """Go on with samples `index` only (their cond and uncond rows)."""
        rows = torch.cat([index, index + self._batch]).to(self._prefix.device)
        self.cache.keep_rows(rows)
        self._prefix, self._batch = self._prefix[rows], index.numel()

    def _run(self, embeds: torch.Tensor, last_only: bool = False, branches: int = 1
             ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self._backbone(embeds, branches)
        logits = self._head(hidden[:, -1:] if last_only else hidden)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        return logits[: self._batch], logits[self._batch:]
