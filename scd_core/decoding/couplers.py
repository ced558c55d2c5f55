"""The couplers: how a call makes the next drafts of the window, each declared once.

After a call verified its drafts, every slot past a row's first rejection needs a new draft for the next
call, drawn from the slot's new distribution p (which becomes the draft's proposal).  A coupler decides how
that draw relates to the token the slot would have committed: the same token (maximal coupling), a token
tied to the position by fixed Gumbel noise, or a fresh one.  Any such draft keeps the output law exact (see
`docs/algorithm.md`); the tighter the coupling, the more drafts survive the next call.

A coupler's entry is all the engine, the settings, the node and the CLI know of it: adding one is one entry
in COUPLERS (and a README line).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .sampling import gumbel_argmax


@dataclass(frozen=True)
class Draws:
    """What a coupler may draw on for the next drafts of a window's T slots (`Coupler.draft`)."""

    probs: torch.Tensor              # (B, T, V) each slot's new distribution p
    verified: Optional[torch.Tensor]  # (B, T) the token each slot commits if no earlier slot was rejected
    gumbel: Optional[torch.Tensor]   # (B, T, V) position-fixed noise, where the coupler asks for it
    fresh: Callable[[], torch.Tensor]  # (B, T) independent draws from p


@dataclass(frozen=True)
class Coupler:
    name: str                   # the setting's value
    label: str                  # its column in tables and `--compare`
    help: str                   # what it does, for the node's tooltip and `--help` (a clause after "which")
    draft: Callable[[Draws], torch.Tensor]  # the next drafts (B, T), each distributed as p
    position_noise: bool = False  # draws on position-fixed Gumbel noise (`Draws.gumbel`)
    # verifies the drafts by modified rejection sampling against their proposals; without, a draft is
    # accepted when it equals its slot's next draft (`draft` is then a deterministic function of p and the
    # noise: Gumbel-max sampling), and proposals are never kept
    reads_proposals: bool = True
    alpha: bool = False          # `alpha` mixes its drafts with independent ones
    block: bool = False          # allows block verification (exact with independent drafts only)
    candidates: bool = True      # allows candidates for the first draft
    compared: bool = True        # a column of its own in `--compare`
    width_free: bool = False     # its tokens for a seed do not depend on the window widths (nor on the batch)


def _position_argmax(draws: Draws) -> torch.Tensor:
    """Gumbel-max sampling with the position's fixed noise: a draft that only moves where p moves."""
    return gumbel_argmax(draws.probs, draws.gumbel)


COUPLERS = (
    Coupler("maximal", "SCD-maximal", "couples each next draft to the token its slot would commit "
            "(maximal coupling, SCD)", lambda draws: draws.verified, alpha=True),
    Coupler("gumbel", "SCD-gumbel", "couples the drafts through Gumbel noise fixed per position (SCD)",
            _position_argmax, position_noise=True, alpha=True),
    Coupler("independent", "SJD", "draws each next draft afresh (SJD)", lambda draws: draws.fresh(), block=True),
    # its tokens are those of window 1 for the same seed: its --compare column shows AR's image in fewer calls
    Coupler("faithful", "SCD-faithful", "reproduces plain autoregressive sampling token for token (Gumbel-max "
            "sampling solved by Jacobi iteration): a seed gives the plain-AR image of that seed whatever the "
            "window (auto included), the batch (row i = seed + i), the worker or a resume (bit for bit in "
            "float32)", _position_argmax, position_noise=True, reads_proposals=False, candidates=False,
            width_free=True),
)
NAMES = tuple(coupler.name for coupler in COUPLERS)
BASELINE = "independent"  # uncoupled drafts (SJD): what comparisons measure the others against
_BY_NAME = {coupler.name: coupler for coupler in COUPLERS}


def coupler(name: str) -> Coupler:
    """The coupler of a (validated) setting."""
    return _BY_NAME[name]


def names_where(flag: str, value: bool = True) -> tuple[str, ...]:
    """The couplers whose `flag` is `value`, e.g. names_where("alpha")."""
    return tuple(c.name for c in COUPLERS if getattr(c, flag) == value)


def candidates_refused(default: str) -> str:
    """Which couplers refuse candidates, for `--help` and a tooltip: "refused with faithful, the default coupler
    (choose maximal, gumbel or independent)", `default` being the settings' default coupler."""
    refused, allowed = names_where("candidates", False), names_where("candidates")
    named = " or ".join(f"{name}, the default coupler" if name == default else name for name in refused)
    return f"refused with {named} (choose {', '.join(allowed[:-1])} or {allowed[-1]})"


def help_text(separator: str = "; ") -> str:
    """Every coupler and what it does, for a tooltip or `--help`."""
    return separator.join(f"{c.name}: {c.help}" for c in COUPLERS)
