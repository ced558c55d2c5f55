"""The one session every family shares: one or more cache rows per sample, each sample at its own pace.

A generation of `batch` samples holds one RowCache of `copies x batch` rows, the
first copy of every sample, then the second, and so on (with classifier-free
guidance: the cond rows, then the uncond rows, so guidance costs one batched
forward; Janus-4o's editing guides over three).  A
sample's rows are fed the same drafts and rewound together.  Per-row `extras`
(e.g. cross-attention keys of each row's text) follow the rows when samples
leave (`keep_rows`) or join (`admit`).  A family supplies the network that runs
over the cache (`RowNetwork`) and the rows' prompt inputs (`context`).
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol, Sequence, Union

import torch

from ...model import Logits
from ...compiled.invariant import fixed_shape_calls, wanted
from .row_cache import RowCache, joined_call, left_padded, row_order


class RowNetwork(Protocol):
    """What a family runs over a session's cache."""

    def embed_context(self, context: torch.Tensor) -> torch.Tensor:
        """The session's `context` (rows, P, ...) -> the inputs of its prefill call: embeddings in the network's
        compute dtype, which decides whether its calls run at fixed shapes (`invariant.wanted`)."""
        ...

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """(rows, T) fed ids -> the inputs of a call, of the kind `embed_context` returns."""
        ...

    def __call__(self, cache: RowCache, inputs: torch.Tensor, extras: Sequence[torch.Tensor], branches: int,
                 last_only: bool) -> torch.Tensor:
        """Inputs (rows, T, ...) after each row's cached slots (a tree with `branches` > 1) -> float logits
        (rows, T, V); with `last_only` it may return the last position's only."""
        ...


# Where prompts come in many lengths (text), a compiled run's cache has room for its prompt's slots rounded up to
# a multiple of this: its shapes, and with them every graph its calls compile, then fit every prompt length of
# the bucket, so that a new prompt in a long session compiles nothing new (the spare slots are never attended).
PROMPT_BUCKET = 64


def prompt_slots(width: int, bucket: int) -> int:
    """The cache slots a prompt of `width` tokens is given: `width` rounded up to a multiple of `bucket`."""
    return width + -width % bucket


def new_cache(rows: int, width: int, num_tokens: int, device: torch.device,
              real: Optional[torch.Tensor] = None, static: bool = False, bucket: int = 1,
              lead: bool = False) -> RowCache:
    """The cache of `rows` rows whose prompts take `width` slots (`real` marks those attended) and whose images
    take `num_tokens`; `static`: a compiled run's (static shapes, room for its prompt's `bucket`); `lead`: the
    prompt's slots rounded up to `bucket` by hidden slots before it instead (`RowSession.layout`)."""
    room = prompt_slots(width, bucket if static or lead else 1) - width
    spare, before = (0, room) if lead else (room, 0)
    cache = RowCache(rows, before + width + num_tokens + spare, before + width, device, real=real, spare=spare,
                     lead=before)
    cache.static = static
    return cache


def _slice(logits: Logits, rows: slice, positions: slice) -> Logits:
    return tuple(None if branch is None else branch[rows, positions] for branch in logits)


class RowSession:
    """One generation over a RowCache; see the module docstring.

    `context` (copies x batch, P, ...): each row's prompt as the network's `embed_context` takes it (ids, or
    embeddings), left-padded where `real` (rows, P) is False.  `copies`: rows per sample, one per branch
    (2: cond, uncond; more with `guidance`, the weight of each branch at a guidance scale, `model.Session`).
    `extras`: per-row tensors (rows, ...) handed to every network call.  `prefix_tokens` ((K,) or
    (batch, K)): the image tokens before position 0 (`model.Session`), e.g. a video's context frames.
    `static_shapes`: the cache is static (scd_core.compiled.compiled_regions) and the network compiled.  `cache`:
    rows that already hold a start of each sequence (`kept_rows.KeptSession`), in place of a new cache.
    """

    rows_per_cache = 1
    per_generation = frozenset({"context"})  # read by the prefill only (scd_core.compiled.graph_state)
    # a compiled run's prompt slots, and a job's under full keys (`layout`), are rounded up to this (`PROMPT_BUCKET`
    # for text prompts); prompts of one length (labels, captions of a fixed width) take their own slots, and so
    # must a family whose positions count hidden slots (LlamaGen's)
    prompt_bucket = 1

    def __init__(self, context: torch.Tensor, num_tokens: int, network: RowNetwork, copies: int = 2,
                 real: Optional[torch.Tensor] = None, extras: Sequence[torch.Tensor] = (),
                 prefix_tokens: Optional[torch.Tensor] = None, static_shapes: bool = False,
                 guidance: Optional[Callable[[float], Sequence[float]]] = None,
                 cache: Optional[RowCache] = None) -> None:
        self.context, self.num_tokens, self.network = context, num_tokens, network
        self.copies, self.guidance = copies, guidance
        self.batch = context.shape[0] // self.copies
        self.extras, self.prefix_tokens = list(extras), prefix_tokens
        self.cache = cache if cache is not None else new_cache(context.shape[0], context.shape[1], num_tokens,
                                                               context.device, real, static_shapes,
                                                               self.prompt_bucket)
        self.static_shapes = static_shapes

    @property
    def device(self) -> torch.device:
        return self.context.device

    @property
    def prefix(self) -> int:
        """Slots before the image's first position: the widest prompt's (rounded up to its `layout` under full
        keys)."""
        return self.cache.prefix

    @property
    def layout(self) -> int:
        """The slots before the image of this session's jobs where the cache has full keys (bfloat16 / float16):
        its prompt's width rounded up to `prompt_bucket`, hidden slots first, decided by its own prompt alone.  So
        its keys sit at the same slots, and its calls attend over the same key length, alone and in any stream:
        under full keys `admit` joins jobs of one layout only (jobs.batching runs each layout's jobs together)."""
        return prompt_slots(self.context.shape[1], self.prompt_bucket)

    @torch.no_grad()
    def prefill(self, tokens: Optional[torch.Tensor] = None) -> Logits:
        """Run the prompt, and with `tokens` ((batch, K) image ids: a kept top of an image) feed them after it in
        the same call; the logits of the position after the last input."""
        if self.cache.written:
            raise RuntimeError("prefill() was already called for this session")
        return self._prefill(tokens, {self.layout})

    def _prefill(self, tokens: Optional[torch.Tensor], layouts: set[int]) -> Logits:
        """`prefill` of a session of the jobs of `layouts` (their `layout`s), which must be one under full keys."""
        inputs = self.network.embed_context(self.context)
        if not inputs.is_floating_point():
            raise TypeError(f"{type(self.network).__name__}.embed_context must return embeddings (floating point), "
                            f"got {inputs.dtype}: their dtype decides the window-invariant calls")
        full_keys = wanted(inputs.dtype)  # the compute dtype decides, from the first call on
        if full_keys:
            _one_layout(layouts, inputs.dtype)
            self._lay_out()
        self.cache.full_keys = full_keys
        with fixed_shape_calls(self.cache.full_keys, self.device):
            if tokens is not None:
                inputs = torch.cat([inputs, self._inputs(tokens).to(inputs.dtype)], dim=1)
            logits = self.network(self.cache, inputs, self.extras, 1, True)
        return self._split(logits[:, -1:])

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, branches: int = 1) -> Logits:
        """Feed (batch, T) image-position ids, each sample after its own cached tokens; with `branches` > 1
        they are a tree (`row_cache.tree_layout`)."""
        if not self.cache.written:
            raise RuntimeError("call prefill() before forward()")
        if tokens.dim() != 2 or tokens.shape[0] != self.batch or tokens.shape[1] < 1:
            raise ValueError(f"tokens must be (batch={self.batch}, T>=1) token ids, got shape {tuple(tokens.shape)}")
        # where the cache attends to all its keys (`invariant.wanted`), every matrix product at one shape: no
        # position's logits depend on the call's width or rows
        with fixed_shape_calls(self.cache.full_keys, self.device):
            return self._split(self.network(self.cache, self._inputs(tokens), self.extras, branches, False))

    def _lay_out(self) -> None:
        """Before the first call under full keys: the cache laid out by the prompt alone (`layout`), where its
        width is not a whole bucket.  A session that runs no streams keeps its own layout: a compiled run's static
        cache, and one without `admit` (GLM-Image's image-to-image, whose prompt positions are read by slot)."""
        width = self.context.shape[1]
        if self.static_shapes or self.admit is None or self.cache.lead or width == self.layout:
            return
        self.cache = new_cache(self.cache.lengths.shape[0], width, self.num_tokens, self.device,
                               self.cache.real[:, :width], bucket=self.prompt_bucket, lead=True)

    def _inputs(self, tokens: torch.Tensor) -> torch.Tensor:
        """The network's inputs for (batch, T) ids: the same drafts in every row of a sample."""
        return self.network.embed_tokens(tokens.to(self.device).repeat(self.copies, 1))

    def _split(self, logits: torch.Tensor) -> Logits:
        if self.copies == 1:
            return logits, None
        return tuple(logits[copy * self.batch:(copy + 1) * self.batch] for copy in range(self.copies))

    def rewind(self, n: Union[int, torch.Tensor]) -> None:
        """Drop the last n image tokens of every sample (an int) or of each sample (a (batch,) tensor)."""
        if isinstance(n, torch.Tensor) and n.dim() > 0:
            n = n.repeat(self.copies)  # a sample's rows move together
        self.cache.rewind(n)

    def keep_branch(self, branch: torch.Tensor, width: int, branches: int) -> None:
        """After a tree call: keep each sample's chain `branch` (in all of its rows)."""
        self.cache.keep_branch(branch.to(self.device).repeat(self.copies), width, branches)

    def keep_rows(self, index: torch.Tensor) -> None:
        """Go on with samples `index` only (all of their rows)."""
        rows = torch.cat([index + copy * self.batch for copy in range(self.copies)]).to(self.device)
        self.cache.keep_rows(rows)
        self.context, self.extras = self.context[rows], [extra[rows] for extra in self.extras]
        if self.prefix_tokens is not None:
            self.prefix_tokens = self._prefix_rows()[index.to(self.prefix_tokens.device)]
        self.batch = index.numel()

    def _prefix_rows(self) -> torch.Tensor:
        """`prefix_tokens` as (batch, K)."""
        return self.prefix_tokens.reshape(-1, self.prefix_tokens.shape[-1]).expand(self.batch, -1)

    def _group(self, sessions: Sequence["RowSession"]) -> "RowSession":
        """A session (not prefilled) of the rows of `sessions`, copy by copy, prompts left-padded to one width."""
        parts = [(session, slice(copy * session.batch, (copy + 1) * session.batch))
                 for copy in range(self.copies) for session in sessions]
        extras = [torch.cat([session.extras[i][rows] for session, rows in parts]) for i in range(len(self.extras))]
        group = RowSession(left_padded([session.context[rows] for session, rows in parts]), self.num_tokens,
                           self.network, self.copies,
                           left_padded([session.cache.real[rows, :session.prefix] for session, rows in parts], False),
                           extras, guidance=self.guidance)
        group.prompt_bucket = self.prompt_bucket  # the jobs' layout
        return group

    @torch.no_grad()
    def admit(self, fresh: Sequence["RowSession"], tokens: Optional[torch.Tensor] = None
              ) -> tuple[Optional[Logits], Logits]:
        """Prefill the samples of `fresh` (sessions of this model from `start`, not prefilled) and go on with them
        after this session's samples; their prompts may differ in length (left padding), and under full keys
        (bfloat16 / float16) must share this session's `layout`: each job's keys then stay where they are alone,
        and so do its logits, bit for bit.  With `tokens` the same call also feeds this session's samples as
        `forward(tokens)` would, when the prompts are no longer than `tokens` (else two calls).  Returns (the
        logits of `tokens` or None, the new samples' position-0 logits).  A session not prefilled yet runs its
        own prefix in that call too, first."""
        prefilled = self.cache.written
        if any(not isinstance(session, RowSession) or session.cache.written for session in fresh):
            raise ValueError("admit() takes sessions of the same model from start(), not prefilled")
        group = self._group(list(fresh) if prefilled else [self, *fresh])
        if prefilled and self.cache.full_keys and not self.static_shapes:
            _one_layout({self.layout, *(session.layout for session in fresh)}, self.cache.keys[0].dtype)
            group._lay_out()
        if not prefilled:
            logits = group._prefill(None, {session.layout for session in (self, *fresh)})
        if self.prefix_tokens is not None:
            self.prefix_tokens = left_padded([session._prefix_rows() for session in (self, *fresh)])
        if not prefilled:
            self.cache, self.context, self.extras, self.batch = group.cache, group.context, group.extras, group.batch
            return None, logits
        fed = None
        if tokens is not None and tokens.shape[1] < group.context.shape[1]:
            fed, tokens = self.forward(tokens), None
        batch, order = self.batch, row_order(self.batch, group.batch, self.copies, self.device)
        self.context = left_padded([self.context, group.context])[order]
        self.extras = [torch.cat(pair)[order] for pair in zip(self.extras, group.extras)]
        self.batch += group.batch
        if tokens is None:
            logits = group.prefill()
            self.cache = RowCache.joined([self.cache, group.cache], order)
            return fed, logits
        with fixed_shape_calls(self.cache.full_keys, self.device):
            self.cache, logits = joined_call(self.cache, group.cache, self._inputs(tokens),
                                             self.network.embed_context(group.context), order,
                                             lambda cache, inputs: self.network(cache, inputs, self.extras, 1, False))
        last = group.context.shape[1] - 1
        return (_slice(self._split(logits), slice(None, batch), slice(None, tokens.shape[1])),
                _slice(self._split(logits), slice(batch, None), slice(last, last + 1)))


def _one_layout(layouts: set[int], dtype: torch.dtype) -> None:
    """Refuse jobs of several `RowSession.layout`s in one cache with full keys (computing in `dtype`)."""
    if len(layouts) > 1:
        raise ValueError(f"jobs whose prompts take {' and '.join(map(str, sorted(layouts)))} slots cannot share a "
                         f"{dtype} session: their keys would move, and their logits change; admit jobs of one "
                         f"layout (generate_many runs each layout's jobs together)")
