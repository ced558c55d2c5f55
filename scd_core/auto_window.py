"""The automatic window: the width of each call that maximises expected tokens per second.

Two numbers decide it.  cost(L): the seconds of one call at width L on this
device (the model's forward plus turning its logits into the sampling
distribution), measured once per model, dtype, device and batch with a few
timed calls right after the prefill and kept for the process.  E[c(L)]: the
tokens a call at width L is expected to commit, estimated from the commit
counts observed so far in the run.

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
ones; without the factor the chooser drifts to narrow widths.  REFINEMENT = 0.25
is the exponent measured on the demo and on synthetic grids (commits per call at
2L over what the counts at L predict, and the reverse).

Only whole-call commit counts are used: the acceptance of slots after the first
rejection is correlated with the drafts they carry into the next call and would
bias the estimate.  With no counts yet S = 1 (optimism): the first call tries
the widest window the costs favour, and the counts then pull it back.

Exactness does not depend on any of this: the width of a call is fixed before
the call from earlier calls only, and every call's verification is exact for
any width given that history.
"""

from __future__ import annotations

import collections
import math
import time
import weakref
from typing import Any, Callable, Optional, Sequence

import torch

from .config import AUTO_WINDOW

CANDIDATES = (1, 2, 4, 8, 16, 32, 64)  # few distinct widths: few kernels to warm up or graphs to capture
TIMED_ROUNDS = 2       # passes over the widths after one warm-up call; each width's fastest call counts
PRIOR_WEIGHT = 2.0     # pseudo-observations pulling each slot's hazard towards the pooled hazard
REFINEMENT = 0.25      # commits grow like width**REFINEMENT beyond what the counts at one width show

# model -> {(dtype, device, batch): {width: seconds}}; a model that cannot be weakly referenced is not cached
_COSTS: "weakref.WeakKeyDictionary[Any, dict[tuple, dict[int, float]]]" = weakref.WeakKeyDictionary()


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


def window_report(window: int | str, windows: Sequence[int]) -> str:
    """The window a run used: "auto (40 calls at width 16, ...)", the pinned width, or the width actually used
    where the pinned one is wider than the image."""
    if window == AUTO_WINDOW:
        return f"{AUTO_WINDOW} ({widths_used(windows)})"
    widest = max(windows[1:], default=window)
    return f"{widest} (set to {window}: wider than the image)" if widest < window else str(window)


def measure_costs(call: Callable[[int], torch.Tensor], widths: Sequence[int],
                  rounds: int = TIMED_ROUNDS) -> dict[int, float]:
    """Seconds of `call(width)` for each width: one warm-up at the widest, then `rounds` passes over all
    widths (interleaved, so a burst of load elsewhere hits one pass, not one width), the fastest counting.

    A narrower call never needs more work than a wider one, so each cost is then lowered to the cheapest
    wider width's: a stall during one timing cannot make a width look dearer than it is.  `call` returns
    a tensor computed on the device; reading one element back waits for it, on any backend.
    """
    def timed(width: int) -> float:
        started = time.perf_counter()
        call(width).flatten()[:1].tolist()
        return time.perf_counter() - started

    widths = sorted(widths)
    timed(widths[-1])
    samples = [[timed(width) for width in widths] for _ in range(rounds)]
    fastest = [min(column) for column in zip(*samples)]
    return {width: min(fastest[i:]) for i, width in enumerate(widths)}


def cost_key(model: Any, batch_size: int, branches: int = 1) -> tuple:
    """What a call's cost depends on besides the model: its dtype, its device, the batch and the chains of a
    tree of candidates (a call of width L then feeds 1 + branches (L - 1) tokens)."""
    return str(getattr(model, "dtype", None)), str(getattr(model, "device", None)), batch_size, branches


def remember_costs(model: Any, batch_size: int, costs: dict[int, float], branches: int = 1) -> None:
    """Use `costs` (seconds per call by width) for `model` from now on instead of measuring them,
    e.g. costs measured on another model of the same shape."""
    _COSTS.setdefault(model, {})[cost_key(model, batch_size, branches)] = dict(costs)


def call_costs(model: Any, key: tuple, widths: Sequence[int], call: Callable[[int], torch.Tensor]
               ) -> dict[int, float]:
    """cost(width) for `model` under `key` (`cost_key`), measured with `call` on a cache miss."""
    try:
        per_model = _COSTS.setdefault(model, {})
    except TypeError:
        per_model = {}
    known = per_model.get(key, {})
    if any(w not in known for w in widths):
        known = per_model[key] = {**known, **measure_costs(call, widths)}
    return {w: known[w] for w in widths}


def session_chooser(model: Any, call: Callable[[int], torch.Tensor], batch_size: int, largest: int,
                    branches: int = 1) -> "WindowChooser":
    """A chooser for one run, with costs measured by `call(width)` when not cached: a call of that width as the
    run makes them (a tree with `branches` > 1) that leaves the session as it found it (rewound)."""
    widths = candidate_widths(model.num_tokens, largest)
    return WindowChooser(call_costs(model, cost_key(model, batch_size, branches), widths, call))


class WindowChooser:
    """Picks each call's width from the costs and the commit counts seen so far in one run."""

    def __init__(self, costs: dict[int, float]) -> None:
        if not costs or min(costs.values()) <= 0:
            raise ValueError(f"window costs must be positive seconds per width, got {costs}")
        self.costs = dict(sorted(costs.items()))
        self.largest = max(self.costs)
        # events[k]: calls whose first rejection made them commit exactly k; at_risk[k]: calls that got to
        # slot k, i.e. committed >= k (censored calls count as at risk up to their width)
        self.events = [0.0] * (self.largest + 1)
        self.at_risk = [0.0] * (self.largest + 1)
        self.observed, self.log_width_sum = 0.0, 0.0  # rows counted, and their widths' log sum

    def observe(self, width: int, counts: Sequence[int]) -> None:
        """Record one call at `width`: counts[c] = how many rows (or row groups) committed c tokens."""
        for committed, number in enumerate(counts):
            if committed == 0 or not number:
                continue  # a finished row commits nothing: no information
            for k in range(1, committed + 1):
                self.at_risk[k] += number
            if committed < width:
                self.events[committed] += number
            self.observed += number
            self.log_width_sum += number * math.log(width)

    def survival(self) -> list[float]:
        """S(k) = P(K > k) for k = 0 .. largest - 1."""
        exposure = sum(self.at_risk)
        pooled = sum(self.events) / exposure if exposure else 0.0
        survival, alive = [1.0], 1.0
        for k in range(1, self.largest):
            hazard = (self.events[k] + PRIOR_WEIGHT * pooled) / (self.at_risk[k] + PRIOR_WEIGHT)
            alive *= 1.0 - hazard
            survival.append(alive)
        return survival

    def expected_commits(self, remaining: Optional[int] = None) -> dict[int, float]:
        """E[min(K, width, remaining)] for each candidate width, K's law scaled to the width (REFINEMENT)."""
        survival = self.survival()
        limit = self.largest if remaining is None else remaining
        seen = math.exp(self.log_width_sum / self.observed) if self.observed else None
        expected = {}
        for width in self.costs:
            counted = sum(survival[:min(width, limit)])
            scale = (width / seen) ** REFINEMENT if seen else 1.0
            expected[width] = min(counted * scale, width, limit)
        return expected

    def choose(self, remaining: Optional[int] = None) -> int:
        """The width with the most expected tokens per second (the narrower one on a tie)."""
        expected = self.expected_commits(remaining)
        return max(self.costs, key=lambda w: (expected[w] / self.costs[w], -w))
