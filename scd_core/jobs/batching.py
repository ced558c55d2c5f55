"""Continuous batching: a stream of jobs through a fixed number of slots.

`generate_many` keeps up to `slots` jobs decoding in one batch.  When rows
finish, their results are yielded at once and their slots go to the next jobs
of the queue: once `refill_at` slots are free (or no row is left) the next jobs'
prompts are prefilled together, folded into the next decoding call (the session's
`admit` with the other rows' window: one forward, no call of its own), and the
new rows go on in the same batch as the others.  A tree call (candidates > 1) or
an empty batch prefills in a call of its own.  Measured on the demo (64 jobs, 16
slots, `python -m scd_core.bench stream`): refilling at once takes 1.13x (64 / 16)
the calls of one job; separate prefill calls took 1.29x, and waiting for 4 or 8
free slots 1.31-1.37x (idle slots cost more than the calls they save).

Every job's tokens are exactly those of `generate(model, cond, config with its
seed)`: a row's randomness is keyed by its own seed and its own call count
(per-image seeds), its cache and positions are its own (`rows_per_cache = 1`),
and a call's window may be wider for the batch than the row needs, which never
changes a row's tokens.  (That takes the batched forward to give each row the
very logits it gets alone; a kernel that rounds a batch differently can move a
draw that falls on a rounding edge.)  The automatic window picks widths from the
batch's counts and measured costs, so it takes the faithful coupler, whose tokens
do not depend on the widths; the other couplers need a pinned window.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterable, Iterator, Optional

import torch

from ..decoding import couplers
from ..windows import window_policies
from ..decoding.config import SamplerConfig
from ..decoding.engine import GenerationResult, ModelOutputError, Run, generate
from ..decoding.given import unwrap
from ..decoding.run_settings import start_session
from ..model import Logits, Session, TokenModel


@dataclasses.dataclass
class _Job:
    index: int
    cond: Any  # a conditioning, or a GivenCells around one
    seed: int
    session: Optional[Session] = None  # started for this job, prefilled once it is admitted
    result: Optional[GenerationResult] = None
    started: float = 0.0
    layout: Any = None  # its session's `layout`: a stream runs jobs of one layout together (None: any)

    def start(self, model: TokenModel, config: SamplerConfig) -> Session:
        self.session = start_session(model, unwrap(self.cond)[0], 1, config)
        self.layout = getattr(self.session, "layout", None)
        return self.session

    def cells(self, model: TokenModel) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """The job's given cells as its one row (`GivenCells.rows`), at the size its session started at."""
        given = unwrap(self.cond)[1]
        return None if given is None else given.rows(model.num_tokens, 1)


class _Queue:
    """The jobs, read lazily with one job of look-ahead (to know whether any are left)."""

    def __init__(self, jobs: Iterable[tuple[Any, int]], config: SamplerConfig) -> None:
        self._jobs, self._config = enumerate(jobs), config
        self._next = self._read()

    def _read(self) -> Optional[_Job]:
        for index, job in self._jobs:
            try:
                cond, seed = job
            except (TypeError, ValueError):
                raise ValueError(f"job {index} must be a (conditioning, seed) pair, got {job!r}") from None
            dataclasses.replace(self._config, seed=seed)  # a bad seed is reported before the job starts
            if unwrap(cond)[1] is not None and not couplers.coupler(self._config.coupler).width_free:
                free = " or ".join(couplers.names_where("width_free"))
                raise ValueError(f"job {index} has given cells, which a stream of jobs takes with the {free} "
                                 f"coupler only: calls widen over the kept cells of every row, so with the "
                                 f"{self._config.coupler} coupler a job's tokens would depend on its neighbours; "
                                 f"use {free}, or run the job with generate")
            return _Job(index, cond, seed)
        return None

    def __bool__(self) -> bool:
        return self._next is not None

    def peek(self) -> Optional[_Job]:
        return self._next

    def take(self, count: int) -> list[_Job]:
        taken = []
        while self._next is not None and len(taken) < count:
            taken.append(self._next)
            self._next = self._read()
        return taken


def generate_many(model: TokenModel, jobs: Iterable[tuple[Any, int]], config: SamplerConfig, slots: int = 16, *,
                  refill_at: Optional[int] = None) -> Iterator[tuple[int, GenerationResult]]:
    """Run `jobs`, (conditioning, seed) pairs read lazily, up to `slots` at a time; yields (job index, result) as
    each job finishes.  A job's tokens equal `generate(model, cond, dataclasses.replace(config, seed=seed))`'s.
    A conditioning may be a `GivenCells` of one row (scd_core.decoding.given) with a width-free coupler (faithful).

    Finished rows' slots are refilled once `refill_at` are free (default 1: a refill folded into a decoding call
    costs no call, and waiting leaves slots idle) or none is busy.  Each result's `nfe` counts the calls its job
    took part in, its prefill included; a refill's prefill is shared by the whole group.  A model whose session
    has no `admit` runs `generate` per group of consecutive jobs with the same conditioning object and consecutive
    seeds (rows at their own pace) or per job; its results then carry their group's statistics.  So does a
    model loaded with compile=True (static shapes: no row joins a running batch).  Jobs of another key layout
    than the running rows' (a prompt in another bucket of slots, `RowSession.layout`) wait for a group of their
    own: in bfloat16 / float16 a job's logits stay its own only beside jobs of its layout.
    """
    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
        raise ValueError(f"slots must be an integer >= 1, got {slots!r}")
    refill_at = 1 if refill_at is None else refill_at
    if not isinstance(refill_at, int) or not 1 <= refill_at <= slots:
        raise ValueError(f"refill_at must be an integer in 1..slots={slots}, got {refill_at!r}")
    if window_policies.per_call(config.window) and not couplers.coupler(config.coupler).width_free:
        free = " or ".join(couplers.names_where("width_free"))
        raise ValueError(f"a stream of jobs needs a pinned window with the {config.coupler} coupler: the "
                         f"{config.window} window's widths change from call to call, so a job's tokens would "
                         f"depend on its neighbours; pin the window, or use the {free} coupler, whose tokens "
                         f"do not depend on the widths")
    queue = _Queue(jobs, config)
    first = queue.peek()
    if first is None:
        return
    first.start(model, config)
    independent = getattr(first.session, "rows_per_cache", None) == 1
    # a compiled model's calls have static shapes: rows joining or leaving a running batch would change them
    streams = not getattr(first.session, "static_shapes", False)
    if streams and independent and all(callable(getattr(first.session, name, None)) for name in ("admit", "keep_rows")):
        yield from _Stream(model, first.session, config, slots, refill_at).generate(queue)
    else:
        yield from _by_groups(model, queue, config, slots if independent else 1)


def _by_groups(model: TokenModel, queue: _Queue, config: SamplerConfig, largest: int
               ) -> Iterator[tuple[int, GenerationResult]]:
    """`generate` per group of up to `largest` consecutive jobs with one conditioning object and seeds s, s + 1, ...:
    row i of a batch with seed s is the image of seed s + i."""
    while queue:
        group = queue.take(1)
        while (queue and len(group) < largest and queue.peek().cond is group[0].cond
               and queue.peek().seed == (group[-1].seed + 1) % 2**64):
            group += queue.take(1)
        result = generate(model, group[0].cond, dataclasses.replace(config, seed=group[0].seed),
                          batch_size=len(group))
        for row, job in enumerate(group):
            yield job.index, dataclasses.replace(result, tokens=result.tokens[row:row + 1])


class _Admitting:
    """A stream's session as its run sees it: while jobs are joining, the decoding call prefills them too (`admit`
    with the rows' window), and the rewind after it leaves their prompts alone."""

    rows_per_cache = 1

    def __init__(self, session: Optional[Session]) -> None:
        self.session = session  # None while no row decodes
        self.joining: list[_Job] = []  # jobs the next decoding call prefills too
        self.admitted: Optional[Logits] = None  # their logits, once a call prefilled them

    def prefill_joining(self, decoding: bool) -> Logits:
        """A call that prefills the joining jobs only; without rows `decoding`, the first one's session is the
        stream's from now on."""
        sessions = [job.session for job in self.joining]
        if not decoding:
            self.session, sessions = sessions[0], sessions[1:]
        return self.session.admit(sessions)[1]

    def forward(self, inputs: torch.Tensor, *branches: int) -> Logits:
        if not self.joining:
            return self.session.forward(inputs, *branches)
        logits, self.admitted = self.session.admit([job.session for job in self.joining], inputs)
        return logits

    def rewind(self, counts: torch.Tensor) -> None:
        if self.admitted is not None:
            counts = torch.cat([counts, counts.new_zeros(len(self.joining))])
        self.session.rewind(counts)

    @property
    def keep_branch(self) -> Optional[Callable[..., None]]:
        return getattr(self.session, "keep_branch", None)

    @property
    def keep_rows(self) -> Optional[Callable[..., None]]:
        return getattr(self.session, "keep_rows", None)


class _Stream:
    """Jobs through the rows of one `Run`: finished rows leave after every call, new jobs join through `admit`.

    The rows decoding together are jobs of one `layout` (a session's key layout, `RowSession.layout`: in bfloat16
    and float16 a job's logits stay its own only beside jobs of its layout).  Jobs of another layout read from
    the queue wait aside, at most `slots` of them, and start a group of their own, oldest first, once no row
    decodes; while that many wait, the running layout takes no more jobs from the queue.
    """

    def __init__(self, model: TokenModel, session: Session, config: SamplerConfig, slots: int,
                 refill_at: int) -> None:
        self.model, self.slots, self.refill_at = model, slots, refill_at
        self.session = _Admitting(session)
        self.run = Run(model, self.session, config, slots, rows_leave=True)
        self.shape = _image_shape(model)  # a family that takes several sizes switches to each prompt's in start
        self.rows: list[_Job] = []  # the job in each batch row
        self.layout: Any = None  # the rows' layout
        self.aside: list[_Job] = []  # started jobs of another layout, in the order read
        self.joining_prefix: Optional[torch.Tensor] = None
        self.joining_cells: Optional[tuple[torch.Tensor, torch.Tensor]] = None

    def generate(self, queue: _Queue) -> Iterator[tuple[int, GenerationResult]]:
        try:
            while queue or self.aside or self.rows:
                free = self.slots - len(self.rows)
                group = self._taken(queue, free) if free >= self.refill_at or not self.rows else []
                if group:
                    self.session.joining = self._started(group)
                    if not self.rows or self.run.branches > 1:  # nothing to fold into, or a tree call: its own call
                        started = time.perf_counter()
                        logits = self.session.prefill_joining(bool(self.rows))
                        yield from self._leave([False] * len(self.rows)
                                               + self._join(logits, time.perf_counter() - started))
                if self.rows:
                    yield from self._decode()
            self.run.policy.finish()
        finally:  # finished, cancelled (the caller stopped reading) or failed: the cache goes now, as generate's
            self.run.close()
            self.session.session, self.rows = None, []

    def _taken(self, queue: _Queue, free: int) -> list[_Job]:
        """Up to `free` started jobs of the rows' layout (of the first one's where no row decodes): those waiting
        aside first, then the queue's, while fewer than `slots` jobs of other layouts wait."""
        layout = self.layout if self.rows else None
        taken: list[_Job] = []
        for job in list(self.aside):
            if len(taken) < free and layout in (None, job.layout):
                self.aside.remove(job)
                taken.append(job)
                layout = job.layout
        while queue and len(taken) < free and len(self.aside) < self.slots:
            job = self._start(queue.take(1)[0])
            if layout in (None, job.layout):
                taken.append(job)
                layout = job.layout
            else:
                self.aside.append(job)
        self.layout = layout
        return taken

    def _start(self, job: _Job) -> _Job:
        """`job` with its session, started as it is read (the model takes each prompt's size in `start`)."""
        if job.session is None:
            job.start(self.model, self.run.config)
        if _image_shape(self.model) != self.shape:
            raise ValueError(f"job {job.index} asks for an image of {_image_shape(self.model)} (tokens, grid) "
                             f"where the stream makes {self.shape}: give generate_many jobs of one image size")
        return job

    def _started(self, group: list[_Job]) -> list[_Job]:
        """`group`, and the tokens before their position 0 (`prefix_tokens`)."""
        cells = [job.cells(self.model) for job in group]
        self.joining_prefix = _prefixes([job.session for job in group])  # before admit changes the sessions
        self.joining_cells = _stacked_cells(cells, self.model.num_tokens)
        return group

    def _join(self, logits: Logits, seconds: float) -> list[bool]:
        """Give the joining jobs, prefilled by a call that took `seconds`, their first token (a batch of one's
        first call) and rows after the others; returns which of them are done (one-token images)."""
        group, self.session.joining, self.session.admitted = self.session.joining, [], None
        decoder = self.run.new_decoder([job.seed for job in group], logits[0].device, self.joining_prefix,
                                       self.joining_cells)
        probs = decoder.probs(logits, 1)
        decoder.step(probs, 0)
        if torch.isnan(probs).any():
            raise ModelOutputError("model returned NaN logits in a prefill; float16 overflow is a common cause: "
                                   "try bfloat16 or float32")
        _, forced = decoder.cells.read_commits(decoder.committed)
        started = time.perf_counter() - seconds
        for job, job_forced in zip(group, forced.tolist()):
            job.session, job.started = None, started
            job.result = GenerationResult(tokens=torch.empty(0), nfe=1, committed=[1], forced=[job_forced],
                                          acceptance=[1.0], draft_changes=[0.0], windows=[1], fed=[1],
                                          prefill_s=seconds)
        self.run.join(decoder)
        self.rows += group
        return [self.run.n == 1] * len(group)  # each new row holds one token

    def _decode(self) -> Iterator[tuple[int, GenerationResult]]:
        """One call for every row (prefilling the joining jobs too), then the finished ones leave."""
        call = self.run.feed(self.run.choose_window())
        sampled = time.perf_counter()
        outcome = self.run.verify(call)
        joined = self.session.admitted
        self.run.settle_cache(call, outcome)
        sample_s = time.perf_counter() - sampled
        acceptance = sum(outcome.acceptance) / len(outcome.acceptance) if outcome.acceptance else 1.0
        changes = outcome.changed / outcome.carried if outcome.carried else 0.0
        shared, live = torch.stack([outcome.shared, outcome.live.long()]).tolist()  # after verify's synchronisation
        for job, shared, forced in zip(self.rows, shared, outcome.forced_rows):
            result = job.result
            result.nfe += 1
            result.committed.append(shared)
            result.forced.append(forced)
            result.windows.append(call.width)
            result.fed.append(call.fed + call.pad)
            result.acceptance.append(acceptance)
            result.draft_changes.append(changes)
            result.forward_s += call.forward_s
            result.sample_s += sample_s
        self.run.observe(call, outcome)  # the automatic window learns from the whole call, as in `Run.record`
        finished = [not row_live for row_live in live]
        if joined is not None:
            finished += self._join(joined, call.forward_s)
        yield from self._leave(finished)

    def _leave(self, finished: list[bool]) -> Iterator[tuple[int, GenerationResult]]:
        """Yield the results of the `finished` rows (a flag per row) and drop them."""
        done = [row for row, flag in enumerate(finished) if flag]
        if not done:
            return
        tokens = self.run.decoder.tokens(self.run.n)[done].cpu()
        now = time.perf_counter()
        for row, job_tokens in zip(done, tokens):
            job = self.rows[row]
            job.result.tokens, job.result.total_s = job_tokens.unsqueeze(0), now - job.started
        left = [row for row, flag in enumerate(finished) if not flag]
        finished_jobs = [self.rows[row] for row in done]
        self.rows = [self.rows[row] for row in left]
        if left:
            self.run.leave(torch.tensor(left, device=self.run.decoder.device))
        else:
            self.run.leave(None)
            self.session.session = None  # its cache holds finished rows only
        for job in finished_jobs:
            yield job.index, job.result


def _image_shape(model: TokenModel) -> tuple:
    return model.num_tokens, tuple(getattr(model, "grid", None) or ())


def _stacked_cells(cells: list[Optional[tuple[torch.Tensor, torch.Tensor]]], num_tokens: int
                   ) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """The given cells of jobs joining together, (tokens, keep) each (jobs, N); a job without any keeps none."""
    if all(part is None for part in cells):
        return None
    none = (torch.zeros(1, num_tokens, dtype=torch.long), torch.zeros(1, num_tokens, dtype=torch.bool))
    return tuple(torch.cat([(none if part is None else part)[i] for part in cells]) for i in (0, 1))


def _prefixes(sessions: list[Session]) -> Optional[torch.Tensor]:
    """The tokens before position 0 of each session's one row, left-aligned to one width (`prefix_tokens`)."""
    parts = [getattr(session, "prefix_tokens", None) for session in sessions]
    if parts[0] is None:
        return None
    rows = [torch.as_tensor(part).reshape(-1, torch.as_tensor(part).shape[-1])[-1:] for part in parts]
    width = max(row.shape[1] for row in rows)
    return torch.cat([torch.nn.functional.pad(row, (width - row.shape[1], 0)) for row in rows])
