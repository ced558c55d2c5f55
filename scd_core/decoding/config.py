"""Sampler settings, validated once so the engine can trust them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from . import couplers, sampler_options
from ..windows import window_policies
from .sampler_options import is_int as _is_int, is_real as _is_real

COUPLERS = couplers.NAMES
DEFAULT_COUPLER = "faithful"  # the seed decides the image, whatever the widths
DRAFT_INITS = ("random", "left", "above", "previous_frame")
VERIFICATIONS = ("token", "block")
MAX_WINDOW, AUTO_WINDOW = window_policies.MAX_WINDOW, window_policies.AUTO_WINDOW
MAX_SEED = 2**64 - 1
MAX_CANDIDATES = 8


def _check(ok: bool, field: str, allowed: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{field} must be {allowed}, got {value!r}")


@dataclass(frozen=True)
class SamplerConfig:
    """How to sample.  None means "the model's recommended value".

    coupler: how the next drafts are made, one of COUPLERS (scd_core.decoding.couplers says what each does).
      faithful (the default) gives for a seed the plain-AR image of that seed whatever the window, the automatic
      widths, the batch, the slot of generate_many, the worker or a resume (bit for bit in float32); the others
      may save the last few percent of calls where a seed need not reproduce: their tokens follow the widths.
    window: positions decoded per model call; 1 is plain autoregressive sampling.  A policy's name
      (scd_core.windows.window_policies) chooses it per call: "auto" from the model's measured cost of each window size
      and the commit counts observed so far (scd_core.windows.auto_window).
    fixed_shapes: feed every call after the first at the full window width, re-feeding committed tokens
      where the window would shrink at the end, so that a captured CUDA graph or a compiled model sees one
      input shape per window size.  Same tokens; one rewind more per call at the end.  A model loaded with
      compile=True needs none of it: it pads its calls itself (scd_core.compiled.compiled_regions), whatever this says.
    draft_init: the first draft of a position entering the window -- "random", "left", "above" (same
      column, previous row) or "previous_frame" (same place one frame earlier; video models); None uses the
      model's `default_draft_init`, else "above".
    alpha: probability of using the coupled draft instead of an independent one
      (the couplers with `alpha`; 0 is SJD, 1 is full SCD).
    verification: "token" (modified rejection sampling draft by draft, stopping at the first rejection) or
      "block" (block verification: a joint rule over the whole window that accepts at least as many drafts
      in expectation; the couplers with `block`: independent drafts only).
    candidates: how many candidates the first draft of each call gets (1 = just the draft).  The others are
      the next tokens of the draft's proposal, drawn without replacement, each followed by the window's later
      drafts as a chain of its own; one call scores the tree and recursive rejection sampling picks at most
      one chain, so the law stays exact.  Needs a session that scores trees (`keep_branch`; every family here)
      and a coupler with `candidates`.
    """

    # what a captured CUDA graph does not read (its device copies, or the seed keys, it does): a kept graph serves
    # a later generation whatever these are (scd_core.compiled.graph_state)
    per_generation: ClassVar[frozenset[str]] = frozenset({"seed", *sampler_options.NAMES})

    coupler: str = DEFAULT_COUPLER
    window: int | str = 32
    cfg_scale: Optional[float] = None
    temperature: Optional[float] = None
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    seed: int = 0
    draft_init: Optional[str] = None
    alpha: float = 1.0
    verification: str = "token"
    fixed_shapes: bool = False
    candidates: int = 1

    def __post_init__(self) -> None:
        _check(self.coupler in COUPLERS, "coupler", f"one of {', '.join(COUPLERS)}", self.coupler)
        _check(window_policies.valid(self.window), "window", window_policies.allowed(), self.window)
        for option in sampler_options.OPTIONS:
            value = getattr(self, option.name)
            _check(value is None or option.valid(value), option.name, f"None or {option.allowed}", value)
        _check(_is_int(self.seed) and 0 <= self.seed <= MAX_SEED, "seed", f"an integer in 0..{MAX_SEED}", self.seed)
        _check(self.draft_init is None or self.draft_init in DRAFT_INITS, "draft_init",
               f"None or one of {', '.join(DRAFT_INITS)}", self.draft_init)
        _check(_is_real(self.alpha) and 0 <= self.alpha <= 1, "alpha", "a number in 0..1", self.alpha)
        spec = couplers.coupler(self.coupler)
        _check(self.alpha == 1 or spec.alpha, "alpha",
               f"1 unless coupler is {' or '.join(couplers.names_where('alpha'))}", self.alpha)
        _check(self.verification in VERIFICATIONS, "verification", f"one of {', '.join(VERIFICATIONS)}",
               self.verification)
        # Block verification decides on every draft of the window, so a carried draft coupled to its old value
        # is no longer distributed as its proposal given that decision: exact with independent drafts only
        # (tests/test_lossless.py shows the coupled variants biased).
        _check(self.verification == "token" or spec.block, "verification",
               f"'token' unless coupler is {' or '.join(couplers.names_where('block'))}", self.verification)
        _check(isinstance(self.fixed_shapes, bool), "fixed_shapes", "True or False", self.fixed_shapes)
        _check(_is_int(self.candidates) and 1 <= self.candidates <= MAX_CANDIDATES, "candidates",
               f"an integer in 1..{MAX_CANDIDATES}", self.candidates)
        refused = " or ".join(couplers.names_where("candidates", False))
        _check(self.candidates == 1 or (spec.candidates and self.verification == "token" and not self.fixed_shapes),
               "candidates", f"1 with the {refused} coupler, block verification or fixed shapes", self.candidates)
