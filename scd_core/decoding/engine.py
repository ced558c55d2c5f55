"""Jacobi decoding with speculative verification: AR, SJD and SCD in one loop.

Words used throughout:
  committed  a row's tokens that are final, positions 0 .. its commit count - 1;
  forced     a position no row samples: the model's row-ends, a prompt's given cells (`fixed_cells`);
  free       a position that is sampled (not forced); a width chosen by the window policy counts free ones;
  fed        the tokens a call feeds: the last committed one, then the drafts (a tree with candidates);
  width      the slots a call verifies, each yielding one distribution p;
  carried    a draft kept from the last call for the next (coupled to its old value, or redrawn);
  ready      the window slots, from a row's committed count on, that hold a draft (`_Decoder.grow`);
  pad        committed tokens fed again in front of a call to keep its shape (fixed shapes), or, at static
             shapes, the slots past the last position that fill a call to its bucket's width.

Each iteration feeds a window of L tokens (the last committed token, then the
drafts of the next L - 1 positions), gets the sampling distribution p of L
positions from one model call, and then, all on the device:

  1. verifies the drafts left to right with modified rejection sampling (MRS),
  2. commits up to and including the first rejection (plus a bonus token when
     every draft passes),
  3. makes the next drafts for the rest of the window -- the coupler's job --
     and records p as their proposal,
  4. gives new positions entering the window an initial draft.

Steps 1-3 for one window are `verify.propose_next`, with the couplers declared
in `couplers.py`; each call's width comes from a window policy
(`window_policies`: pinned, or a policy such as the automatic window).  One host
synchronisation per iteration reads back the counts for the callback, the
window policy and rewinding the cache.  See `docs/algorithm.md` for why each step
is exact.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from ..windows import auto_window, window_policies
from . import couplers, rng, verify
from .call_summary import CallSummary
from .candidate_tree import chain_probs, tree_inputs
from .config import MAX_CANDIDATES, SamplerConfig
from .fixed_cells import FixedCells, code_and_fixed, kept_prefix
from .given import unwrap
from .guidance import guidance_for
from ..model import Logits, Session, TokenModel, check_batch_size
from ..compiled.run_calls import Call, calls_for
from .results import GenerationResult, IterationStats
from .run_settings import draft_source, sampling_settings, start_session
from .sampling import recursive_rejection, sampler_tensors, without_replacement


class GenerationCancelled(RuntimeError):
    """Raised when `should_cancel()` returned True; nothing of the run is kept."""


class ModelOutputError(RuntimeError):
    """The model returned logits the engine cannot use (wrong shape, NaN)."""


def slot_positions(committed: torch.Tensor, count: int, branches: int) -> torch.Tensor:
    """Absolute positions (B, count) of a call's output slots: the window's from each row's committed count,
    then, in a tree call (`branches` > 1, see `candidate_tree.tree_inputs`), each chain's, which starts one
    position later."""
    width = count if branches == 1 else (count - 1) // branches + 1
    slots = torch.arange(count, device=committed.device)
    return committed.unsqueeze(1) + torch.where(slots < width, slots, (slots - width) % max(width - 1, 1) + 1)


class _Decoder:
    """The state of one generation: token buffer, commit counts, proposals.

    `seq` holds model token ids; verification and coupling work on indices into
    the model's `code_ids` (the ids it may sample), so every (batch, window, V)
    tensor spans the codes only.  Forced framing ids need not be codes.
    """

    # the state of each row, first dimension the batch: what `select` and `join` carry (the rest is shared, but
    # the fixed cells', which carry their own)
    ROW_STATE = ("rows", "committed", "prefix", "keys", "calls", "seq", "proposals", "noise_window", "noise_start",
                 "first_new", "drafted_at")
    # the sampler's numbers as given: a static step reads their device copies (`sampler`), so a kept CUDA graph
    # serves any of them (scd_core.compiled.graph_state)
    per_generation = frozenset({"sampling"})

    def __init__(self, model: TokenModel, config: SamplerConfig, window: int, seeds: Sequence[int],
                 device: torch.device, rows_per_cache: int, prefix: Optional[torch.Tensor],
                 copy_back: Optional[int], static: bool = False,
                 given: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
                 guidance: Optional[Callable[[float], Sequence[float]]] = None) -> None:
        """`window`: the widest call the window policy asks for, in free positions; `given`: each row's cells
        fixed in advance ((tokens, keep), each (batch, N), `GivenCells.rows`); `guidance`: the session's, where
        it weighs its branches itself (`model.Session`)."""
        self.config, self.coupler = config, couplers.coupler(config.coupler)
        self.static = static  # static shapes: state updated in place, nothing sized by host values
        batch = len(seeds)
        self.batch, self.n, self.vocab = batch, model.num_tokens, model.vocab_size
        self.device = device
        self.code_ids, self.code_index, forced, forced_ids = code_and_fixed(model, given, batch, device)
        self.cells = FixedCells(forced, forced_ids, window, given is not None, static, device)
        self.noise = rng.KeyedRandom(device)
        # each row's randomness: its own seed, and the calls it took part in (so not the batch's iteration)
        self.keys = rng.seed_keys(seeds, device)
        self.calls = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.rows_per_cache = rows_per_cache
        self.sampling = sampling_settings(model, config)
        # what the sampling step reads: device tensors where one compiled step serves every value; eager calls
        # keep the host numbers (top-k by torch.topk, ~3.5x cheaper than the sort a tensor k needs)
        sampler = sampler_tensors(self.sampling, self.vocab, device) if static else self.sampling
        self.guidance = guidance_for(model, guidance, self.sampling.cfg_scale, sampler, device)
        self.copy_back = copy_back
        # tokens known before position 0 (a video's context frames): drafts may be copied from them
        self.prefix = (torch.zeros(batch, 0, dtype=torch.long, device=device) if prefix is None
                       else prefix.to(device=device, dtype=torch.long).expand(batch, -1))
        self._buffers(batch, self.cells.window)

    def _buffers(self, batch: int, window: int) -> None:
        """The token buffer, commit counts, proposals and noise of calls up to `window` slots wide."""
        device = self.device
        self.window = window  # the widest call
        # room for drafts running past the last position keeps every index in range
        self.seq = torch.zeros(batch, self.n + window, dtype=torch.long, device=device)
        self.committed = torch.zeros(batch, dtype=torch.long, device=device)
        self.proposals = torch.zeros(batch, window, self.vocab, device=device)
        # rows still decoding, by their index in the caller's batch; finished rows' tokens move to `finished`
        # when the batch is regrouped (keep_rows)
        self.rows = torch.arange(batch, device=device).unsqueeze(1)
        self.finished: Optional[torch.Tensor] = None
        self.slots = torch.arange(window, device=device)
        # position-fixed Gumbel noise of each row's last window (from noise_start), reused while a position
        # stays in the window
        self.noise_start = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.noise_window = torch.zeros(batch, 0, self.vocab, device=device)
        # a call drafts only the slots of its own width; `grow` drafts the rest when a wider call comes, as the
        # narrower call would have (static calls draft the whole window: their shapes do not follow widths)
        self.ready = window if self.static else 0  # slots (from each row's committed count) with a draft
        self.first_new, self.drafted_at = self.committed.clone(), self.calls.clone()

    def probs(self, logits: Logits, width: int, branches: int = 1) -> torch.Tensor:
        """The sampling distribution of a call's `width` output slots (a tree's when `branches` > 1)."""
        expected = (self.batch, width, self.vocab)
        names = ("cond", "uncond") if len(logits) == 2 else [f"branch {i}" for i in range(len(logits))]
        for name, value in zip(names, logits):
            if value is not None and tuple(value.shape) != expected:
                raise ModelOutputError(f"model returned {name} logits of shape {tuple(value.shape)}, "
                                       f"expected {expected}")
        return self.guidance.probs(logits, lambda: slot_positions(self.committed, width, branches))

    def window_inputs(self, width: int, pad: int = 0) -> torch.Tensor:
        """The last committed token and the drafts after it, (B, pad + width), after the `pad` committed
        tokens before it (fed again to keep a call's shape)."""
        self.grow(width - 1)
        index = (self.committed - 1 - pad).unsqueeze(1) + self.slots[:pad + width]
        return self.seq.gather(1, index)

    def gumbel(self, positions: torch.Tensor, max_shift: int) -> Optional[torch.Tensor]:
        """Noise for the window's positions (B, width); only positions new to a row's window are hashed.

        `max_shift` (a host int) bounds how far any row moved since the last call, so the last `fresh` slots
        cover every row's new positions and the slots before them are all in the kept window.
        """
        if not self.coupler.position_noise:
            return None
        if self.static:  # the same noise hashed afresh: how much is new is a host value
            return self.noise.gumbel(self.keys, positions, self.vocab)
        width, cached = positions.shape[1], self.noise_window.shape[1]
        fresh = min(width, max(0, width - cached + max_shift))
        source = (self.slots[:width - fresh] + positions[:, :1] - self.noise_start).unsqueeze(-1)
        kept = self.noise_window.gather(1, source.expand(-1, -1, self.vocab))
        new = self.noise.gumbel(self.keys, positions[:, width - fresh:], self.vocab)
        self.noise_window, self.noise_start = torch.cat([kept, new], dim=1), positions[:, :1]
        return self.noise_window

    def to_index(self, ids: torch.Tensor) -> torch.Tensor:
        """Model ids -> code indices (a forced non-code id maps to code 0; its slot is never verified)."""
        return self.code_index[ids]

    def alternatives(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`count` more candidates for the first draft: its proposal's next tokens without replacement.
        Returns (model ids (B, count), valid (B, count)); an invalid one repeats the draft."""
        position = self.committed.unsqueeze(1)
        draft = self.seq.gather(1, position).squeeze(1)
        noise = self.noise.gumbel(self.keys, position, self.vocab, rng.CANDIDATE, self.calls).squeeze(1)
        codes, valid = without_replacement(self.proposals[:, 0], self.to_index(draft), count, noise)
        return torch.where(valid, self.code_ids[codes], draft.unsqueeze(1)), valid

    def _first_of(self, tree: torch.Tensor, alternatives: torch.Tensor, valid: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Recursive rejection sampling of the first position over the draft and its alternatives.
        Returns (the candidate kept (B,), -1 where none was, the token committed there)."""
        position = self.committed.unsqueeze(1)
        candidates = torch.cat([self.to_index(self.seq.gather(1, position)), self.to_index(alternatives)], dim=1)
        valid = torch.cat([torch.ones_like(valid[:, :1]), valid], dim=1)
        stage = position * MAX_CANDIDATES + torch.arange(candidates.shape[1], device=self.device)
        return recursive_rejection(tree[:, 0, 0], self.proposals[:, 0], candidates, valid,
                                   self.noise.uniform(rng.CANDIDATE_ACCEPT, self.keys, stage, self.calls),
                                   self.noise.uniform(rng.CANDIDATE_RESIDUAL, self.keys, position, self.calls)[:, 0])

    def step(self, p: torch.Tensor, max_shift: int,
             tree: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """Verify, commit and re-draft; returns (commit counts, accepted, draft-change counts, chain kept).

        `max_shift` is the most any row committed in the previous call (`gumbel`).  With `tree` = (p of every
        chain (B, k, width, V), alternatives (B, k - 1), valid): the first position is settled over all
        candidates, and the row then goes on with the chain of the one it kept (the draft's own when none), whose
        p is what the later drafts are verified against and coupled to.  A static decoder's call may be padded
        past its true width (the slowest row's last position): draft changes are counted within that width.
        """
        width = p.shape[1]
        positions = self.committed.unsqueeze(1) + self.slots[:width]
        drafts = self.seq.gather(1, positions[:, :width - 1])
        forced = self.cells.forced.gather(1, positions)
        codes, chain = self.to_index(drafts), None
        if tree is not None:
            chains, alternatives, valid = tree
            kept, first = self._first_of(chains, alternatives, valid)
            kept = torch.where(forced[:, 0], 0, kept)
            chain = kept.clamp(min=0)
            p = chains[torch.arange(self.batch, device=self.device), chain]
            picked = torch.cat([drafts[:, :1], alternatives], dim=1).gather(1, chain.unsqueeze(1))
            codes[:, :1] = self.to_index(picked)
        window = verify.Window(p, positions, codes, self.proposals[:, :width - 1],
                         self.gumbel(positions, max_shift), ~forced, self.keys, self.calls,
                         (self.n - self.committed).clamp(max=width - 1))
        accepted, verified, coupled = verify.propose_next(self.config, self.noise, window)
        if tree is not None:  # the first position as settled over every candidate
            accepted[:, 0] = kept >= 0
            verified[:, 0] = torch.where(forced[:, 0], verified[:, 0], first)
        if self.config.verification == "token":  # block verification accounts for forced slots itself
            accepted = accepted | forced[:, :width - 1]
        forced_ids = self.cells.forced_ids.gather(1, positions)
        verified = torch.where(forced, forced_ids, self.code_ids[verified])
        coupled = torch.where(forced, forced_ids, self.code_ids[coupled])

        per_row, shared = self._commits(accepted)
        slot = self.slots[:width].unsqueeze(0)
        nxt = torch.where(slot < per_row.unsqueeze(1), verified, coupled)
        redrafted = slot[:, :width - 1] >= shared.unsqueeze(1)  # drafted before and still a draft
        if self.static:  # the width an eager call would have had
            redrafted = redrafted & (slot[:, :width - 1] < (self.n - self.committed.min()).clamp(max=width - 1))
        changes = torch.stack([((nxt[:, :width - 1] != drafts) & redrafted).sum(), redrafted.sum()])
        self.seq.scatter_(1, positions, nxt)
        self.committed += shared
        limit = self.window if self.static else width  # the slots this call drafts (`grow`: the others)
        self._next_proposals(p, shared, limit)
        self._init_new_drafts(width - shared, limit)
        self.calls += 1
        return shared, accepted, changes, chain

    def _commits(self, accepted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the tokens each row commits, those its cache advances by), each (B,)."""
        # commits per row: up to and including the first rejection, at most what is left
        rejected = torch.cat([~accepted, torch.ones(self.batch, 1, dtype=torch.bool, device=self.device)], dim=1)
        per_row = torch.minimum(rejected.int().argmax(1) + 1, self.n - self.committed)
        # rows that share a cache advance together, by the smallest count among them
        return per_row, per_row.view(-1, self.rows_per_cache).amin(1).repeat_interleave(self.rows_per_cache)

    def decide(self, logits: Logits, width: int, max_shift: int, tree: Optional[tuple[torch.Tensor, torch.Tensor]]
               ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """A call's logits to its decisions, all on the device (the part of a step a compiled or captured call
        holds): returns (the packed `CallSummary`, commit counts (B,), tree chain kept or None)."""
        branches = 1 if tree is None else tree[0].shape[1] + 1
        probs = self.probs(logits, logits[0].shape[1], branches)
        chains = None if tree is None else (chain_probs(probs, width, branches),) + tree
        shared, accepted, changes, chain = self.step(probs[:, :width], max_shift, chains)
        values = torch.arange(width + 1, device=shared.device)  # counted as every backend can (no bincount)
        counts = (shared[::self.rows_per_cache].unsqueeze(1) == values).sum(0)  # one per cache group
        summary = CallSummary.pack(self.committed, shared, (self.committed < self.n).sum(), torch.isnan(probs).any(),
                                   changes, counts, accepted.float().mean(0))
        return summary, shared, chain

    def tokens(self, count: int) -> torch.Tensor:
        """The first `count` tokens of every row of the caller's batch, (batch, count)."""
        if self.finished is None:
            return self.seq[:, :count]
        tokens = self.finished[:, :count].clone()
        tokens[self.rows.squeeze(1)] = self.seq[:, :count]
        return tokens

    def start_after(self, count: int) -> None:
        """Begin at position `count`: the prefill fed the fixed cells before it (`Run.kept_prefix`), and they
        commit with its decision (the host's count stays behind, so that the call counts them as forced)."""
        self.seq[:, :count] = self.cells.forced_ids[:, :count]
        self.committed += count
        self.first_new = self.committed.clone()

    def keep_rows(self, index: torch.Tensor) -> None:
        """Go on with rows `index` only; the others are done and keep their tokens for `tokens`."""
        if self.finished is None:
            self.finished = self.seq[:, :self.n].clone()
        else:
            self.finished[self.rows.squeeze(1)] = self.seq[:, :self.n]
        self.select(index)

    def select(self, index: torch.Tensor) -> None:
        """Go on with rows `index` only (a stream reads a finished row's tokens from `seq` itself)."""
        for name in self.ROW_STATE:
            value = getattr(self, name)
            setattr(self, name, value[index.to(value.device)])
        self.cells.select(index)
        self.batch = index.numel()

    def join(self, other: "_Decoder") -> None:
        """Go on with `other`'s rows (prefilled later, same model and settings) after this decoder's: a stream's
        refill.  Their Gumbel noise is hashed for this decoder's window; prefixes are left-aligned to one width."""
        width = self.noise_window.shape[1]
        if other.noise_window.shape[1] != width:  # position-fixed noise: hashing it again gives the same values
            other.noise_window = self.noise.gumbel(other.keys, other.noise_start + self.slots[:width], self.vocab)
        longest = max(self.prefix.shape[1], other.prefix.shape[1])
        window = max(self.window, other.window)
        for decoder in (self, other):  # one prefix width, one window, one width of drafted slots, for all rows
            decoder.prefix = torch.nn.functional.pad(decoder.prefix, (longest - decoder.prefix.shape[1], 0))
            decoder._make_room(window)
            decoder.grow(max(self.ready, other.ready))
        for name in self.ROW_STATE:
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        self.cells.join(other.cells)
        self.batch += other.batch

    def _make_room(self, window: int) -> None:
        """Buffers for calls of `window` slots (a wider decoder joins: rows with more given cells)."""
        extra = window - self.window
        if extra > 0:
            pad = torch.nn.functional.pad
            self.seq, self.proposals = pad(self.seq, (0, extra)), pad(self.proposals, (0, 0, 0, extra))
            self.cells.make_room(extra)
            self.window, self.slots = window, torch.arange(window, device=self.device)

    def _next_proposals(self, p: torch.Tensor, shift: torch.Tensor, limit: int) -> None:
        """Carried drafts keep p as their proposal; new slots get a one-hot (set in _init_new_drafts)."""
        if not self.coupler.reads_proposals:
            return
        source = (shift.unsqueeze(1) + self.slots[:limit]).clamp(max=p.shape[1] - 1)
        self.proposals[:, :limit].copy_(p.gather(1, source.unsqueeze(-1).expand(-1, -1, self.vocab)))  # in
        # place: a captured graph reads this tensor

    def _init_new_drafts(self, carried: torch.Tensor, limit: int) -> None:
        """Initial drafts for window slots >= `carried` (per row) and below `limit`; proposal one-hot on the
        draft.  What `grow` needs to draft the later slots the same way is kept."""
        first_new = self.committed + carried
        if not self.static:
            self.first_new, self.drafted_at, self.ready = first_new, self.calls.clone(), limit
        self._draft(first_new, self.calls, 0, limit)

    def grow(self, slots: int) -> None:
        """Draft the window slots below `slots` that the last call, narrower, left out, as it would have (same
        first new position, same draw counter: a slot it drafted comes out the same again)."""
        if slots > self.ready:
            self._draft(self.first_new, self.drafted_at, self.ready, slots)
            self.ready = slots

    def _draft(self, first_new: torch.Tensor, calls: torch.Tensor, start: int, stop: int) -> None:
        """Initial drafts at window slots start .. stop - 1 for the positions from `first_new` (B,) on, drawn
        with counter `calls` (B, 1); earlier positions keep theirs."""
        positions = self.committed.unsqueeze(1) + self.slots[start:stop]
        first_new = first_new.unsqueeze(1)
        is_new = positions >= first_new
        if self.copy_back is None:
            u = self.noise.uniform(rng.INIT, self.keys, positions, calls)
            codes = (u * self.vocab).long().clamp(max=self.vocab - 1)
        else:
            # the nearest earlier position `copy_back` steps apart that is already set: committed, carried,
            # or before position 0 in the prefix; with nothing there, the left neighbour
            hops = (positions - first_new) // self.copy_back + 1
            source = positions - hops * self.copy_back
            known = torch.cat([self.prefix, self.seq], dim=1)
            offset = self.prefix.shape[1]
            copied = known.gather(1, (source + offset).clamp(0, known.shape[1] - 1))
            left = self.seq.gather(1, first_new - 1).expand_as(positions)
            codes = self.to_index(torch.where(source + offset >= 0, copied, left))
        # one-hot by comparison: F.one_hot may check its input's range on the host, which a graph cannot
        proposal = (codes.unsqueeze(-1) == torch.arange(self.vocab, device=self.device)).to(self.proposals.dtype)
        tokens = torch.where(self.cells.forced.gather(1, positions), self.cells.forced_ids.gather(1, positions),
                             self.code_ids[codes])
        self.seq.scatter_(1, positions, torch.where(is_new, tokens, self.seq.gather(1, positions)))
        if self.coupler.reads_proposals:
            drafted = self.proposals[:, start:stop]
            drafted.copy_(torch.where(is_new.unsqueeze(-1), proposal, drafted))


@dataclass
class Outcome:
    """What verifying one call decided, read back in the iteration's one host synchronisation."""

    shared: torch.Tensor       # (B,) tokens each row's cache advances by
    chain: Optional[torch.Tensor]  # (B,) the tree chain each row kept, or None
    committed: int             # the slowest row's progress in this call
    counts: list[int]          # counts[c]: rows (cache groups) that committed c tokens, c = 0 .. width
    acceptance: list[float]    # share of drafts accepted per slot
    changed: int               # carried drafts that changed ...
    carried: int               # ... out of these
    live: torch.Tensor         # (B,) rows not finished
    live_count: int
    forced: int                # of `committed`, the forced tokens (the slowest row's)
    forced_rows: list[int]     # the forced tokens each row committed
    free_counts: list[int]     # free_counts[c]: rows (cache groups) that committed c free tokens, c = 0 .. free


class Run:
    """One generation, step by step: prefill, choose a width, feed, verify, settle the cache, keep the books.

    `generate` runs these steps in turn; `batching.generate_many` runs feed, verify and settle_cache on rows that
    join (`join`, prefilled elsewhere) and leave (`leave`) between calls.
    """

    def __init__(self, model: TokenModel, session: Session, config: SamplerConfig, batch_size: int,
                 sync_timing: bool = False, rows_leave: bool = False,
                 given: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> None:
        """`session` comes first from `model.start`: a family may adopt the image size its `cond` was made for.
        `rows_leave`: rows join and leave between calls (a stream: `join`, `leave`), so each rewinds on its own
        and finished rows are never regrouped.  `given`: the rows' cells fixed in advance (`GivenCells.rows`)."""
        self.model, self.config, self.batch_size, self.sync_timing = model, config, batch_size, sync_timing
        self.given = given
        self.session = session
        self.copy_back = draft_source(model, config)
        self.rows_per_cache = getattr(self.session, "rows_per_cache", batch_size)
        if batch_size % self.rows_per_cache:
            raise ValueError(f"session.rows_per_cache={self.rows_per_cache} must divide batch_size={batch_size}")
        # a compiled model whose sessions offer static-shape calls (compile=True) runs every call at static shapes
        # (scd_core.compiled.compiled_regions); one that compiled its forward by other means runs as any other
        self.compiled = bool(getattr(model, "compiled", False)) and bool(getattr(session, "static_shapes", False))
        # rows at their own pace in a session that can drop rows: once half of them are done, the rest go on as
        # a smaller batch, so finished rows stop costing work (halving keeps the copies of the cache few)
        self.regroup = (self.rows_per_cache == 1 and callable(getattr(self.session, "keep_rows", None))
                        and not config.fixed_shapes and not self.compiled and not rows_leave)
        self.per_row = rows_leave or self.rows_per_cache < batch_size  # rewinds per row (or cache group)
        self.branches = self._branches()
        self.policy = window_policies.policy_for(config.window, model, batch_size, self.branches,
                                                  self._timed_call)
        self.calls = calls_for(self, self.compiled)  # last: it refers back to the run (`close` breaks that)
        self.n = model.num_tokens
        self.result = GenerationResult(tokens=torch.empty(0), nfe=0)
        self.decoder: Optional[_Decoder] = None
        self.done, self.iteration, self.max_shift = 0, 0, 0

    def _branches(self) -> int:
        """The chains each call feeds: the candidates for the first draft, where the session scores trees."""
        branches = self.config.candidates
        if branches > 1 and not callable(getattr(self.session, "keep_branch", None)):
            raise ValueError(f"candidates={branches} needs a model whose session scores a tree of drafts "
                             f"(keep_branch); this one takes candidates=1")
        if self.compiled and branches > 1:
            raise ValueError(f"candidates={branches} is not available with a compiled model: a tree of "
                             "candidates would grow the static KV cache; use candidates=1, or load the model "
                             "with compile=False")
        # a proposal holds at most top-k tokens: more candidates than that could only repeat the draft
        top_k = sampling_settings(self.model, self.config).top_k
        return min(branches, top_k) if top_k else branches

    def prefill(self) -> Call:
        """The prefix call, which yields the first free position's distribution (position 0's, or the one after
        a kept prefix the call fed too); the decoder is sized after it."""
        t0 = time.perf_counter()
        kept = self.kept_prefix()
        self.calls.before_prefill()
        logits = self.session.prefill() if kept is None else self.session.prefill(kept)
        seeds = [self.config.seed + row for row in range(self.batch_size)]  # row i: seed s + i (mod 2**64)
        self.decoder = self.new_decoder(seeds, logits[0].device, getattr(self.session, "prefix_tokens", None),
                                        self.given)
        if kept is not None:
            self.decoder.start_after(kept.shape[1])
        self.calls.after_prefill()
        return Call(1, 1, 0, logits, None, self.elapsed(t0), prefill=True)

    def close(self) -> None:
        """Let go of the run's state now, finished or not: its session (the KV cache), its decoder and its calls'
        state (`run_calls`: what the model keeps for its next generation aside), so that a cancel or an error
        leaves nothing to Python's cycle collector (the calls and the window policy refer back to the run)."""
        self.calls.close()
        self.calls, self.policy, self.decoder, self.session = None, None, None, None

    def kept_prefix(self) -> Optional[torch.Tensor]:
        """The ids (batch, K) of the fixed cells every row has from position 0 on (an image's kept top rows, its
        row-ends), where the session's prefill can feed them after the prompt in the same call, so that they
        cost no call; None where there are none or it cannot."""
        if self.given is None or "tokens" not in inspect.signature(self.session.prefill).parameters:
            return None
        return kept_prefix(self.model, self.given, self.batch_size)

    def new_decoder(self, seeds: Sequence[int], device: torch.device, prefix: Optional[torch.Tensor],
                    given: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> _Decoder:
        """The decoding state of rows with these seeds (and these given cells), right after their prefill."""
        return _Decoder(self.model, self.config, self.policy.widest, seeds, device, self.rows_per_cache, prefix,
                        self.copy_back, static=self.compiled, given=given,
                        guidance=getattr(self.session, "guidance", None))

    def choose_window(self) -> int:
        """The call's window, from the window policy (pinned, or chosen from earlier calls): free positions to
        verify, the forced ones in their way riding along (`FixedCells.call_width`)."""
        return self.policy.choose(self.decoder.cells.left(self.done))

    def feed(self, window: int) -> Call:
        """One forward of the window's inputs: the last committed token and the drafts, or, with candidates, the
        tree of chains that differ in the first draft."""
        t0 = time.perf_counter()
        # the last position is fed as a draft too (its slot then yields an unused distribution), so it is
        # verified like every other draft whether or not other rows of the batch are behind: a row's tokens do
        # not depend on its batch
        return self.calls.feed(window, self.decoder.cells.call_width(window, self.done), t0)

    def verify(self, call: Call) -> Outcome:
        """Verify, commit and re-draft on the device (`_Decoder.decide`), then the iteration's one host
        synchronisation: counts, flags, the commit counts and the per-slot acceptance."""
        (packed, shared, chain), decided_width = self.calls.decide(call)
        live = self.decoder.committed < self.n
        summary = CallSummary.read(packed, self.decoder.batch, decided_width)
        self.max_shift = summary.largest
        commits, forced_rows = self.decoder.cells.read_commits(summary.committed)
        if summary.has_nan:
            raise ModelOutputError(f"model returned NaN logits at iteration {self.iteration}; "
                                   "float16 overflow is a common cause: try bfloat16 or float32")
        # a call's count is the slowest row's progress: with rows at their own pace the counts add up to N
        committed, self.done = summary.slowest - self.done, summary.slowest
        forced = self.decoder.cells.fixed_of_slowest(self.done, committed)
        # free tokens per cache group, a count past the chosen width censored at it (the window's observation)
        free = (commits - forced_rows)[::self.rows_per_cache].clamp(max=call.free)
        free_counts = torch.bincount(free, minlength=call.free + 1).tolist()
        return Outcome(shared, chain, committed, summary.counts[:call.width + 1], summary.acceptance[:call.width - 1],
                       summary.changed, summary.carried, live, summary.live, forced, forced_rows.tolist(), free_counts)

    def settle_cache(self, call: Call, outcome: Outcome) -> None:
        """Keep the tree chain each row chose, rewind what was not committed, drop finished rows."""
        if outcome.chain is not None:
            self.session.keep_branch(outcome.chain, call.fed, self.branches)
        if not call.prefill:
            self.session.rewind(call.fed - outcome.shared if self.per_row else call.fed - outcome.committed)
        if self.regroup and 0 < outcome.live_count <= self.decoder.batch // 2:
            index = torch.nonzero(outcome.live).squeeze(1)
            self.session.keep_rows(index)
            self.decoder.keep_rows(index)

    def join(self, decoder: _Decoder) -> None:
        """Go on with `decoder`'s rows too (after the run's): rows prefilled elsewhere, holding their first token."""
        if self.decoder is None:
            self.decoder = decoder
        else:
            self.decoder.join(decoder)
        self.done, self.max_shift = 1, max(self.max_shift, 1)  # the new rows hold one token, and moved by one

    def leave(self, index: Optional[torch.Tensor]) -> None:
        """Go on with rows `index` only (None: none); the others' tokens were read (`_Decoder.tokens`)."""
        if index is None:
            self.decoder = None
        else:
            self.session.keep_rows(index)
            self.decoder.select(index)

    def record(self, call: Call, outcome: Outcome, sample_s: float,
               callback: Optional[Callable[[IterationStats], None]]) -> None:
        """The call's statistics, and the caller's callback."""
        result = self.result
        result.nfe += 1
        result.windows.append(call.width)
        result.fed.append(call.fed + call.pad)
        result.committed.append(outcome.committed)
        result.forced.append(outcome.forced)
        acceptance = outcome.acceptance
        result.acceptance.append(sum(acceptance) / len(acceptance) if acceptance else 1.0)
        result.draft_changes.append(outcome.changed / outcome.carried if outcome.carried else 0.0)
        if call.prefill:
            result.prefill_s = call.forward_s
        else:
            result.forward_s += call.forward_s
        result.sample_s += sample_s
        if callback is not None:
            callback(IterationStats(self.iteration, outcome.committed, self.done, self.n, result.nfe, acceptance,
                                    self.decoder.tokens(self.done), call.forward_s, sample_s, outcome.forced,
                                    sum(result.forced)))
        self.observe(call, outcome)
        self.iteration += 1

    def observe(self, call: Call, outcome: Outcome) -> None:
        """Tell the window policy what came of a call it chose the width of."""
        if call.prefill:
            return
        # widened over forced cells, a call is the width it was chosen at, in free positions, costing its own
        widened = self.decoder.cells.widening
        width, counts = (call.free, outcome.free_counts) if widened else (call.width, outcome.counts)
        self.policy.observe(auto_window.CallRecord(width, self.calls.cost_width(call), counts, outcome.acceptance,
                                                   self.decoder.batch))

    def forward(self, inputs: torch.Tensor, alternatives: Optional[torch.Tensor]) -> tuple[int, Logits]:
        """Feed a window's inputs, or the tree they make with the first draft's alternatives; (tokens fed, logits)."""
        if alternatives is None:
            return inputs.shape[1], self.session.forward(inputs)
        inputs = tree_inputs(inputs, alternatives)
        return inputs.shape[1], self.session.forward(inputs, self.branches)

    def _timed_call(self, width: int) -> torch.Tensor:
        """A call of `width` as the run makes them (a tree with candidates), rewound: the auto window's cost."""
        inputs = self.decoder.window_inputs(width)
        tree = self.branches > 1 and width > 1
        fed, logits = self.forward(inputs, inputs[:, 1:2].expand(-1, self.branches - 1) if tree else None)
        self.rewind_all(fed)
        return self.decoder.probs(logits, fed, self.branches if tree else 1)

    def rewind_all(self, count: int) -> None:
        self.session.rewind(torch.full((self.decoder.batch,), count) if self.per_row else count)

    def elapsed(self, t0: float) -> float:
        """Seconds since t0, the device synchronised first when the caller wants an exact forward/sampling split."""
        if self.sync_timing and self.decoder.device.type == "cuda":
            torch.cuda.synchronize(self.decoder.device)
        return time.perf_counter() - t0


def generate(model: TokenModel, cond: Any, config: SamplerConfig, *, batch_size: int = 1,
             callback: Optional[Callable[[IterationStats], None]] = None,
             should_cancel: Optional[Callable[[], bool]] = None, sync_timing: bool = False) -> GenerationResult:
    """Sample `batch_size` token sequences from `model` given `cond`.

    `cond` may be a `GivenCells` (scd_core.decoding.given): its kept cells are forced in every row, the others
    sampled.  The output law equals plain AR sampling from the same p (given the kept cells) for every
    coupler and window.  `sync_timing` synchronises the device after each forward so that the
    forward/sampling split is exact (slower; for benchmarks).
    """
    check_batch_size(batch_size)
    started = time.perf_counter()
    cond, given = unwrap(cond)
    # (a family may switch to the size `cond` was made for; at CFG 1 its uncond rows may be left out)
    session = start_session(model, cond, batch_size, config)
    cells = None if given is None else given.rows(model.num_tokens, batch_size)
    run = Run(model, session, config, batch_size, sync_timing, given=cells)
    del session  # the run's from here on: it lets go of it on every way out (`Run.close`)
    try:
        while run.done < run.n:
            if should_cancel is not None and should_cancel():
                raise GenerationCancelled(f"generation cancelled after {run.done} of {run.n} tokens")
            call = run.prefill() if run.decoder is None else run.feed(run.choose_window())
            t1 = time.perf_counter()
            outcome = run.verify(call)
            run.settle_cache(call, outcome)
            run.record(call, outcome, time.perf_counter() - t1, callback)
        # a copy: a compiled model's next generation may reuse this one's memory (`run_calls.StaticShapeCalls.finish`)
        run.result.tokens = run.decoder.tokens(run.n).to("cpu", copy=True)
        run.result.total_s = time.perf_counter() - started
        run.calls.finish()
        run.policy.finish()
        return run.result
    finally:
        run.close()
