"""The automatic window: the width of each call that maximises expected tokens per second.

Two numbers decide it.  cost(L): the seconds of one call at width L on this
device (the model's forward plus sampling: turning its logits into the sampling
distribution, verifying, re-drafting).  E[c(L)]: the tokens a call at width L
is expected to commit, estimated from the commit counts observed so far in the
run.

Costs are kept per process (a ComfyUI server lives for hours), and saved for the next one when
a run finishes (scd_core.windows.window_memory), for each model
and cost key (`cost_key`: dtype, device, batch, candidates, precision, compile
and offload mode) in a `CallCosts`.  A few timed calls right after the first
prefill (the narrowest, middle and widest widths; the others interpolated) seed
them; from then on every call of an automatic run adds its own measured seconds,
read as the load of the moment times what its width costs relative to the others,
each width compared with the calls made around its own (medians throughout).
One noisy measurement, in the timing pass or in a run,
therefore decides nothing, load that comes and goes weighs on every width
alike, and a change of conditions (compiled calls, another process on the
device) is followed within a few dozen calls.  Widths a run does not use would
drift out of date, so one call in EXPLORE_EVERY tries a neighbour of the best
width (one step narrower or wider, whichever was called least recently): a
bounded cost (5% of the calls, at a width close to the best) that keeps the
costs and commit counts around the best known.  While a neighbour of the best
has not yet been compared TRUSTED times (its cost is still only the timed
pass's), one call in EARLY_EVERY explores instead, so a process learns the
widths around its best within its first few dozen calls, and again when the
best moves next to a width it has not compared.

A call at width L commits c = min(K, L) tokens, K being the slot of the first
rejection plus one, so a call that accepted every draft only says K >= L (a
censored count).  The chooser estimates the survival S(k) = P(K > k) from the
counts with the Kaplan-Meier product, each hazard shrunk towards the pooled one
so that widths never observed are extrapolated geometrically, and picks

    argmax_L  E[min(K, L)] (L / L_seen)^REFINEMENT / cost(L),   E[min(K, L)] = S(0) + ... + S(L-1).

The last factor corrects what the counts cannot see: K itself grows with the
width, because in a wider window every draft is refined for more calls before
it reaches the front.  Counts gathered at width L_seen (the geometric mean width
of the observed calls) therefore undervalue wider windows and overvalue narrower
ones; without the factor the chooser drifts to narrow widths.  The exponent
(commits per call at 2L over what the counts at L predict, and the reverse) is
0.02-0.38 on the demo, by width, and mostly 0.4-0.6 upwards on the synthetic grids
(`bench.auto.refinement_rows`, "Commit growth with width" in
scd_core/bench/README.md).  REFINEMENT = 0.35 lies between: replaying whole
processes under fixed cost profiles (`bench.auto.process_replay_rows`) it took
auto from 1.08x to 1.05x the best pinned window on average over eight model and
profile cases, and the worst case from 1.30x to 1.12x, against 0.25.  The
exponent belongs to the model and is not learned.

Only whole-call commit counts are used: the acceptance of slots after the first
rejection is correlated with the drafts they carry into the next call and would
bias the estimate.  With no counts yet a run starts from the pooled hazard of
the last run under the same costs (images of one model are alike, so a later
image's first call is no shot in the dark); the first run of all starts from
S = 1 (optimism): its first call tries the widest window the costs favour, and
the counts then pull it back.

The chooser runs on the host between two calls, so its reading is kept short: an automatic run keeps a best
width chosen twice in a row for HOLD calls (exploration still keeps its clock), and the widths' relative
costs are read again every READ_EVERY calls or after a comparison, the load of the moment every call.

Exactness does not depend on any of this: the width of a call is fixed before
the call from earlier calls only (their counts and measured seconds), and every
call's verification is exact for any width given that history.
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
import operator
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy
import torch

from . import window_memory

CANDIDATES = (1, 2, 4, 8, 16, 32, 64)  # few distinct widths: few kernels to warm up or graphs to capture
TIMED_ROUNDS = 2       # passes over the timed widths after one warm-up call; each width's fastest call counts
COST_WINDOW = 16       # a cost is the median of this many recent calls (or ratios) ...
COST_AGE = 240         # ... made within this many calls of the process: older ones tell of other conditions
                       # (a neighbour explored once in 40 calls keeps about six comparisons: one noisy call
                       # does not move its cost)
PAIR_SPAN = 4          # a call is compared with the calls this many before and after it
READ_EVERY = 8         # what widths cost relative to each other is read again after this many calls, and at
                       # once while a call of another width than the anchor's is within PAIR_SPAN; in between,
                       # only the load of the moment is read
TRUSTED = 3            # comparisons a width needs before they alone tell its cost (its seed votes till then)
EXPLORE_EVERY = 20     # one call in this many tries a neighbour of the best width: 5% of the calls ...
EARLY_EVERY = 5        # ... one in 5 while a neighbour's cost is only its timed seed (compared < TRUSTED times)
PRIOR_WEIGHT = 2.0     # pseudo-observations pulling each slot's hazard towards the pooled hazard
HOLD = 4               # an automatic run's best width, chosen again and the same, is kept for this many calls: the
                       # chooser's reading, repeated every call, costs a few percent of a small model's call on a CPU
REFINEMENT = 0.35      # commits grow like width**REFINEMENT beyond what the counts at one width show

# model -> {cost_key: CallCosts}; a model that cannot be weakly referenced is not cached
_COSTS: "weakref.WeakKeyDictionary[Any, dict[tuple, CallCosts]]" = weakref.WeakKeyDictionary()


def candidate_widths(num_tokens: int, largest: int = CANDIDATES[-1]) -> list[int]:
    """The widths the chooser considers for a sequence of `num_tokens`."""
    return [w for w in CANDIDATES if w <= min(largest, num_tokens)] or [1]


def cost_of_width(costs: dict[int, float], width: int) -> float:
    """A call of a width between candidates costs what the next candidate costs (as with fixed shapes)."""
    return costs[min((w for w in costs if w >= width), default=max(costs))]


def widths_used(windows: Sequence[int]) -> str:
    """"40 calls at width 16, 5 at width 8": the widths of a run's calls after the prefill
    (`GenerationResult.windows`), the most used first."""
    used = sorted(collections.Counter(windows[1:]).items(), key=lambda item: -item[1])
    return ", ".join(f"{calls}{' calls' if i == 0 else ''} at width {width}" for i, (width, calls) in enumerate(used))


def measure_costs(call: Callable[[int], torch.Tensor], widths: Sequence[int],
                  rounds: int = TIMED_ROUNDS) -> dict[int, float]:
    """Seconds of `call(width)` for each width: the narrowest, the middle and the widest are timed (one warm-up at
    the widest, then `rounds` passes over the three, interleaved so that a burst of load elsewhere hits one pass,
    not one width, the fastest counting) and the widths between them interpolated linearly in the width.

    A call costs about a constant plus a part growing with the tokens it feeds (flat on a GPU up to ~150 rows),
    and a process's first image pays for the pass: timing every width (15 calls, a fifth of the demo's first
    image) gave relative costs no closer, a pass's error (about 7%) being its moment's whatever the rounds.
    Early exploration then compares the best width's neighbours with the run's own calls.
    A narrower call never needs more work than a wider one, so each timed cost is then lowered to the cheapest
    wider one's: a stall during one timing cannot make a width look dearer than it is.  `call` returns a tensor
    computed on the device; reading one element back waits for it, on any backend.
    """
    def timed(width: int) -> float:
        started = time.perf_counter()
        call(width).flatten()[:1].tolist()
        return time.perf_counter() - started

    widths = sorted(widths)
    timed_widths = sorted({widths[0], widths[len(widths) // 2], widths[-1]})
    timed(timed_widths[-1])
    samples = [[timed(width) for width in timed_widths] for _ in range(rounds)]
    fastest = [min(column) for column in zip(*samples)]
    known = [min(fastest[i:]) for i in range(len(timed_widths))]
    return dict(zip(widths, numpy.interp(widths, timed_widths, known).tolist()))


def lower_median(values: Sequence[float]) -> float:
    """The median; of an even count the lower middle value (of two timings the faster: a stall only slows)."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


class CallCosts:
    """Seconds per call by width for one model and cost key, kept for the process and learned from its calls.

    The timed pass seeds them; each call of an automatic run then adds its measured seconds, and the calls
    within the process's last COST_AGE are read as (load now) x (what a width costs relative to the others).
    The load around a call is the (lower) median of the calls of other widths within PAIR_SPAN of it, each
    divided by its width's relative cost, so a width is compared with the calls made around its own and load
    that comes and goes weighs on both sides alike (a call votes only where its width is no more common there
    than the others); a width's relative cost is the median of its last
    COST_WINDOW calls over the load around them, the width called most of late being the anchor (its seed).
    Until a width has TRUSTED such comparisons its seed makes up the rest of the votes, scaled as the nearest
    other width measured differs from its seed (a burst during the timed pass skews a range of widths); a width
    whose calls aged out keeps what they said as its seed (and stays in `compared`).  cost = load now x
    relative cost.  `fixed` costs are not learned from (a cost profile to replay, `remember_costs`).  `clock`
    counts the widths chosen under this key, so that exploration keeps its rhythm from one run to the next.
    """

    def __init__(self, seeds: dict[int, float], fixed: bool = False) -> None:
        self.seeds: dict[int, float] = {}
        self.add_seeds(seeds)
        self.fixed = fixed
        self.calls: collections.deque = collections.deque(maxlen=COST_AGE)  # (clock, width, seconds)
        self.last_called: dict[int, int] = {}  # width -> the clock at its last call
        self.compared: set[int] = set()  # widths compared TRUSTED times: their seeds are what calls said
        self.clock = 0
        self.hazard: Optional[float] = None  # the pooled rejection hazard of the last run's calls (`survival`)
        self._estimates: Optional[dict[int, float]] = None  # cached until the next call is learned
        # the last full read: each width's relative cost and the anchor, and the calls learned since
        self._relative: Optional[dict[int, float]] = None
        self._reference, self._unread = 0, 0

    def add_seeds(self, seeds: dict[int, float]) -> None:
        """Timed costs of (more) widths."""
        if not seeds or min(seeds.values()) <= 0:
            raise ValueError(f"window costs must be positive seconds per width, got {seeds}")
        self.seeds = dict(sorted({**self.seeds, **seeds}.items()))
        self._estimates = self._relative = None

    def learn(self, width: int, seconds: float) -> None:
        """One call of `width` took `seconds`; widths without a seed (a narrowed last call) are not costed."""
        if width not in self.seeds:
            return
        self.last_called[width] = self.clock
        if self.fixed or not seconds > 0:
            return
        while self.calls and self.clock - self.calls[0][0] >= COST_AGE:
            self.calls.popleft()  # made under other conditions
        self.calls.append((self.clock, width, seconds))
        self._estimates = None
        self._unread += 1

    def learn_hazard(self, hazard: float) -> None:
        """The pooled rejection hazard of the run under way: the next run starts from it."""
        self.hazard = hazard

    def estimates(self) -> dict[int, float]:
        """cost(width) for every seeded width, from the calls where there are any (read again only once a call
        was learned since: the chooser asks on every call)."""
        if self.fixed or not self.calls:
            return dict(self.seeds)
        if self._estimates is None:
            self._estimates = self._read()
        return self._estimates

    def _read(self) -> dict[int, float]:
        """Costs: the load of the last calls times each width's relative cost."""
        latest = list(itertools.islice(reversed(self.calls), COST_WINDOW))
        if (self._relative is None or self._unread >= READ_EVERY
                or any(width != self._reference for _, width, _ in latest[:PAIR_SPAN + 1])):
            self._relative = self._read_relative()
            self._unread = 0
        relative = self._relative
        load_now = lower_median([taken / relative[width] for _, width, taken in latest])
        return {width: load_now * cost for width, cost in relative.items()}

    def _read_relative(self) -> dict[int, float]:
        """What each width costs relative to the anchor, from the recent calls and the seeds; the widths compared
        TRUSTED times or more keep it as their seed."""
        _, widths, seconds = zip(*self.calls)
        count = collections.Counter(widths[-COST_WINDOW:])
        reference = max(count, key=lambda w: (count[w], w))  # called most of late: its relative cost is its seed
        seeds = self.seeds
        ratios: dict[int, list[float]] = {}
        for index in [i for i, width in enumerate(widths) if width != reference]:
            width = widths[index]
            # the load around a call: the calls of other widths within PAIR_SPAN of it, each its seconds over its
            # width's seed (a call compared with calls of its own width says nothing of its width).  A call votes
            # only where its width is no more common around it than the others: beside one exploration, each of
            # the usual width's calls would vote on that one call's seconds, and once another width became the
            # anchor those repeated votes would outnumber the explorations' for hundreds of calls
            around = range(max(index - PAIR_SPAN, 0), min(index + PAIR_SPAN + 1, len(widths)))
            near = [seconds[i] / seeds[widths[i]] for i in around if widths[i] != width]
            if near and 2 * len(near) >= len(around) - 1:
                ratios.setdefault(width, []).append(seconds[index] / lower_median(near))
        measured = {width: lower_median(values[-COST_WINDOW:]) for width, values in ratios.items()
                    if len(values) >= TRUSTED}
        measured[reference] = self.seeds[reference]
        self.compared.add(reference)  # the others are compared with it
        relative = {reference: self.seeds[reference]}
        skew = {w: cost / self.seeds[w] for w, cost in measured.items()}  # measured over seed
        for width, seed in self.seeds.items():
            if width != reference:
                votes = ratios.get(width, [])[-COST_WINDOW:]
                if len(votes) < TRUSTED:
                    votes += [seed * self._nearest_skew(width, skew)] * (TRUSTED - len(votes))
                relative[width] = lower_median(votes)
        for width, votes in ratios.items():
            if len(votes) >= TRUSTED:
                self.seeds[width] = relative[width]  # what the calls said outlives them
                self.compared.add(width)
        self._reference = reference
        return relative

    @staticmethod
    def _nearest_skew(width: int, skew: dict[int, float]) -> float:
        """How much the nearest other measured width's relative cost differs from its seed (the mean of two as
        near; 1 before another width was measured): a burst during the timed pass skews a range of widths, and
        a width's own calls cannot vouch for its seed."""
        distance = {w: abs(math.log(w / width)) for w in skew if w != width}
        closest = min(distance.values(), default=None)
        nearest = [skew[w] for w in distance if distance[w] == closest]
        return sum(nearest) / len(nearest) if nearest else 1.0

    def explores(self, neighbours: Sequence[int]) -> bool:
        """Advance the clock by one choice; True for the one in EXPLORE_EVERY that tries one of the best width's
        `neighbours` (one in EARLY_EVERY while one of them was not compared TRUSTED times as of the last read of
        the costs, unless the costs are a fixed profile rather than a timed pass's: then there is nothing to
        compare)."""
        self.clock += 1
        early = not self.fixed and not self.compared.issuperset(neighbours)
        return self.clock % (EARLY_EVERY if early else EXPLORE_EVERY) == 0

    def stalest(self, widths: Sequence[int]) -> int:
        """The width called least recently (never called first; the wider on a tie)."""
        return min(widths, key=lambda w: (self.last_called.get(w, -1), -w))


def cost_key(model: Any, batch_size: int, branches: int = 1) -> tuple:
    """What a call's cost depends on besides the model: its dtype, its device, the batch, the chains of a
    tree of candidates (a call of width L then feeds 1 + branches (L - 1) tokens), and what the model
    reports of how it runs: optional attributes `precision` (e.g. "int8", "nf4"; absent: the dtype's),
    `compiled` (true once its forward is compiled or graph-captured; absent: eager) and `offload` (e.g.
    "cpu"; absent: none)."""
    return (str(getattr(model, "dtype", None)), str(getattr(model, "device", None)), batch_size, branches,
            str(getattr(model, "precision", None)), bool(getattr(model, "compiled", False)),
            str(getattr(model, "offload", None)))


def remember_costs(model: Any, batch_size: int, costs: "dict[int, float] | CallCosts", branches: int = 1
                   ) -> None:
    """Use `costs` (seconds per call by width) for `model` from now on instead of measuring and learning
    them, e.g. costs measured on another model of the same shape: the runs' own calls do not move them.  A
    `CallCosts` is used as it is (it may learn)."""
    known = costs if isinstance(costs, CallCosts) else CallCosts(costs, fixed=True)
    _COSTS.setdefault(model, {})[cost_key(model, batch_size, branches)] = known


def recalled_costs(model: Any, key: tuple) -> Optional[CallCosts]:
    """The costs an earlier process saved for `model` under `key` (`window_memory`), or None."""
    saved = window_memory.recall(model, key)
    if saved is None:
        return None
    seeds, compared, hazard = saved
    known = CallCosts(seeds)
    known.compared, known.hazard = compared, hazard
    return known


def call_costs(model: Any, key: tuple, widths: Sequence[int], call: Callable[[int], torch.Tensor]
               ) -> CallCosts:
    """The process's costs for `model` under `key` (`cost_key`), seeded by timing `call` when a width has none."""
    try:
        per_model = _COSTS.setdefault(model, {})
    except TypeError:
        per_model = {}
    known = per_model.get(key)
    if known is None:  # what an earlier process learned, if it saved any (scd_core.windows.window_memory)
        known = recalled_costs(model, key)
        if known is not None:
            per_model[key] = known
    if known is None or any(w not in known.seeds for w in widths):
        measured = measure_costs(call, widths)
        if known is None:
            known = per_model[key] = CallCosts(measured)
        else:
            known.add_seeds(measured)
    window_memory.track(model, key, known)
    return known


def session_chooser(model: Any, call: Callable[[int], torch.Tensor], batch_size: int, largest: int,
                    branches: int = 1) -> "WindowChooser":
    """A chooser for one run, with costs measured by `call(width)` when not cached: a call of that width as the
    run makes them (a tree with `branches` > 1) that leaves the session as it found it (rewound)."""
    widths = candidate_widths(model.num_tokens, largest)
    return WindowChooser(call_costs(model, cost_key(model, batch_size, branches), widths, call), widths, batch_size)


class WindowChooser:
    """Picks each call's width from the costs and the commit counts seen so far in one run."""

    def __init__(self, costs: "dict[int, float] | CallCosts", widths: Optional[Sequence[int]] = None,
                 batch: Optional[int] = None) -> None:
        """`costs`: the process's `CallCosts`, or seconds per width to seed costs of this chooser's own;
        `widths`: the candidates (default: every costed width); `batch`: the rows of the calls to learn from."""
        self.call_costs = costs if isinstance(costs, CallCosts) else CallCosts(costs)
        self.widths = sorted(self.call_costs.seeds if widths is None else widths)
        self.batch = batch
        self.largest = max(self.widths)
        # events[k]: calls whose first rejection made them commit exactly k; at_risk[k]: calls that got to
        # slot k, i.e. committed >= k (censored calls count as at risk up to their width)
        self.events = [0.0] * (self.largest + 1)
        self.at_risk = [0.0] * (self.largest + 1)
        self.observed, self.log_width_sum = 0.0, 0.0  # rows counted, and their widths' log sum

    @property
    def costs(self) -> dict[int, float]:
        """Seconds per call of each candidate width, as estimated now."""
        estimates = self.call_costs.estimates()
        return {width: estimates[width] for width in self.widths}

    def observe_cost(self, width: int, seconds: float, rows: Optional[int] = None) -> None:
        """One call of `width` took `seconds` (forward and sampling) on `rows` rows; a batch regrouped to fewer
        rows costs less per call, so its calls are not learned from."""
        if rows is None or self.batch is None or rows == self.batch:
            self.call_costs.learn(width, seconds)

    def observe(self, width: int, counts: Sequence[int]) -> None:
        """Record one call at `width`: counts[c] = how many rows (or row groups) committed c tokens."""
        for committed in itertools.compress(range(len(counts)), counts):  # the counts that are not 0
            if committed == 0:
                continue  # a finished row commits nothing: no information
            number = counts[committed]
            for k in range(1, committed + 1):
                self.at_risk[k] += number
            if committed < width:
                self.events[committed] += number
            self.observed += number
            self.log_width_sum += number * math.log(width)
        pooled = self.pooled_hazard()
        if pooled is not None:
            self.call_costs.learn_hazard(pooled)

    def pooled_hazard(self) -> Optional[float]:
        """Rejections per slot at risk over the run's calls so far; None before any count."""
        exposure = sum(self.at_risk)
        return sum(self.events) / exposure if exposure else None

    def survival(self) -> list[float]:
        """S(k) = P(K > k) for k = 0 .. largest - 1; before the run's first counts, the geometric law of the
        last run's pooled hazard under the same costs (none: S = 1)."""
        pooled = self.pooled_hazard()
        if pooled is None:
            pooled = self.call_costs.hazard or 0.0
        # slots no call reached have the pooled hazard: past the last slot at risk (at_risk never grows with the
        # slot), S goes on geometrically
        reached = min(len(self.at_risk) - self.at_risk.count(0.0) + 1, self.largest)
        alive = (1.0 - (events + PRIOR_WEIGHT * pooled) / (at_risk + PRIOR_WEIGHT)  # 1 - the slot's hazard
                 for events, at_risk in zip(self.events[1:reached], self.at_risk[1:reached]))
        observed = list(itertools.accumulate(alive, operator.mul, initial=1.0))
        beyond = itertools.repeat(1.0 - (PRIOR_WEIGHT * pooled) / PRIOR_WEIGHT, self.largest - len(observed))
        return observed + list(itertools.accumulate(beyond, operator.mul, initial=observed[-1]))[1:]

    def expected_commits(self, remaining: Optional[int] = None) -> dict[int, float]:
        """E[min(K, width, remaining)] for each candidate width, K's law scaled to the width (REFINEMENT)."""
        up_to = list(itertools.accumulate(self.survival()))  # up_to[k] = S(0) + ... + S(k)
        limit = self.largest if remaining is None else remaining
        seen = math.exp(self.log_width_sum / self.observed) if self.observed else None
        expected = {}
        for width in self.widths:
            counted = up_to[min(width, limit) - 1]
            scale = (width / seen) ** REFINEMENT if seen else 1.0
            expected[width] = min(counted * scale, width, limit)
        return expected

    def choose(self, remaining: Optional[int] = None) -> int:
        """The width with the most expected tokens per second (the narrower one on a tie); one call in
        EXPLORE_EVERY its neighbour called least recently instead."""
        return self.around(self.best(remaining), remaining)

    def best(self, remaining: Optional[int] = None) -> int:
        """The width with the most expected tokens per second (the narrower one on a tie)."""
        expected, costs = self.expected_commits(remaining), self.costs
        return max(self.widths, key=lambda w: (expected[w] / costs[w], -w))

    def around(self, best: int, remaining: Optional[int] = None) -> int:
        """`best`, or one call in EXPLORE_EVERY its neighbour called least recently: the exploration clock's
        choice."""
        index = self.widths.index(best)
        neighbours = self.widths[max(index - 1, 0):index]
        if index + 1 < len(self.widths) and (remaining is None or best < remaining):
            neighbours.append(self.widths[index + 1])  # wider only while it could commit more
        if not self.call_costs.explores(neighbours) or not neighbours:
            return best
        return self.call_costs.stalest(neighbours)


# ---------------------------------------------------------------- window policies: what the engine calls

@dataclass(frozen=True)
class CallRecord:
    """What the engine tells a window policy of each call it chose, read back in the call's one synchronisation."""

    width: int                   # slots verified
    cost_width: int              # the width its cost stands for (a static call's bucket, a fixed-shape call's)
    counts: Sequence[int]        # counts[c]: rows (or row groups sharing a cache) that committed c, c = 0 .. width
    acceptance: Sequence[float]  # the share of drafts accepted, per slot
    rows: int                    # rows in the batch after the call (fewer once finished rows were dropped)


class WindowPolicy(Protocol):
    """How wide each call is.  The engine asks before every call after the prefill and tells the policy what
    came of it after the call's bookkeeping (its callback included); a width must depend on earlier calls only,
    which keeps every call's verification exact."""

    widest: int  # the widest call it may ask for: the decoder's buffers are sized for it

    def choose(self, remaining: int) -> int:
        """The next call's width; `remaining` positions are left to commit."""

    def observe(self, call: CallRecord) -> None:
        """The call made at the last width chosen."""

    def finish(self) -> None:
        """The run is over (every row done): keep what it learned."""


class PinnedWindow:
    """Every call at one width."""

    def __init__(self, width: int) -> None:
        self.widest = width

    def choose(self, remaining: int) -> int:
        return self.widest

    def observe(self, call: CallRecord) -> None:
        pass

    def finish(self) -> None:
        pass


class AutoWindow:
    """The automatic window: a `WindowChooser` for the run, its costs timed (when the process has none) at the
    first choice, after the prefill; each call's cost is its seconds from its width's choice to its record."""

    @staticmethod
    def widest_for(num_tokens: int) -> int:
        """The widest call it asks for in an image of `num_tokens` (what the run's memory is sized for)."""
        return min(CANDIDATES[-1], num_tokens)

    def __init__(self, model: Any, batch_size: int, branches: int, timed_call: Callable[[int], torch.Tensor]
                 ) -> None:
        """`timed_call(width)`: a call of that width as the run makes them (a tree with `branches` > 1), rewound."""
        self.model, self.batch_size, self.branches, self.timed_call = model, batch_size, branches, timed_call
        self.widest = self.widest_for(model.num_tokens)
        self.started = 0.0  # when the last width was being chosen
        self.held, self.held_for = 0, 0  # the best width, and the calls it is kept for before it is chosen again

    @functools.cached_property
    def chooser(self) -> WindowChooser:
        # once per model, dtype, device, batch and candidates in a process: a few timed calls, each rewound
        return session_chooser(self.model, self.timed_call, self.batch_size, self.widest, self.branches)

    def choose(self, remaining: int) -> int:
        chooser = self.chooser
        self.started = time.perf_counter()
        if self.held_for and self.held <= remaining:
            self.held_for -= 1  # the counts and costs of a few more calls seldom move the best width
        else:
            best = chooser.best(remaining)
            self.held, self.held_for = best, HOLD - 1 if best == self.held else 0
        return chooser.around(self.held, remaining)

    def observe(self, call: CallRecord) -> None:
        self.chooser.observe(call.width, call.counts)
        self.chooser.observe_cost(call.cost_width, time.perf_counter() - self.started, call.rows)

    def finish(self) -> None:
        if "chooser" in self.__dict__:  # a width was chosen: the run learned costs, for the next process too
            window_memory.save()

