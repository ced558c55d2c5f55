"""The window settings: a pinned width, or a named policy choosing each call's width, each declared once.

`SamplerConfig.window` is an integer in 1..MAX_WINDOW (every call at that width) or the name of a policy in
POLICIES.  A policy's entry is all the settings, the command line, the sampler node, the memory estimate, the
reports and the stream of jobs know of it: adding one is one entry here (and its `WindowPolicy` class).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from .auto_window import AutoWindow, PinnedWindow, WindowPolicy, widths_used

MAX_WINDOW = 1024
AUTO_WINDOW = "auto"


@dataclass(frozen=True)
class Policy:
    name: str          # the setting's value, and its spelling on the command line
    node_value: int    # the sampler node's window widget value for it (below 1: the pinned widths start at 1)
    help: str          # what it does, for `--help` and the node's tooltip (a clause after "<name>:")
    # the run's policy: (model, batch size, branches, a timed call of a width as the run makes them)
    make: Callable[[Any, int, int, Callable[[int], torch.Tensor]], WindowPolicy]
    widest: Callable[[int], int]  # the widest call it asks for in an image of that many tokens (memory)
    # its widths change from call to call with what the batch's earlier calls did: in a stream of jobs, a
    # row's widths would then depend on its neighbours (and so its tokens, but with a width-free coupler)
    per_call: bool = True


POLICIES = (
    Policy(AUTO_WINDOW, 0, "chosen per call, the width with the most tokens per second, from the measured cost "
           "of a call and the acceptance", AutoWindow, AutoWindow.widest_for),
)
NAMES = tuple(policy.name for policy in POLICIES)
_BY_NAME = {policy.name: policy for policy in POLICIES}
_BY_NODE_VALUE = {policy.node_value: policy.name for policy in POLICIES}
NODE_MIN = min(_BY_NODE_VALUE)  # the node widget's range starts at the lowest policy's value


def _is_width(window: object) -> bool:
    return isinstance(window, int) and not isinstance(window, bool)


def named(window: int | str) -> Optional[Policy]:
    """The named policy of a (validated) setting; None for a pinned width."""
    return None if _is_width(window) else _BY_NAME[window]


def valid(window: object) -> bool:
    return window in _BY_NAME or (_is_width(window) and 1 <= window <= MAX_WINDOW)


def allowed() -> str:
    """What a window setting must be: one message wherever it is checked (the settings, the command line)."""
    return f"{' or '.join(repr(name) for name in NAMES)} or an integer in 1..{MAX_WINDOW}"


def from_text(text: str) -> int | str:
    """A command line's window: a policy by its name or node value, else an integer (checked with the settings)."""
    if text in _BY_NAME:
        return text
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"must be {allowed()}, got {text!r}") from None
    return _BY_NODE_VALUE.get(value, value)


def from_widget(value: int) -> int | str:
    """The node's window widget value as the settings take it."""
    return _BY_NODE_VALUE.get(value, value)


def help_text(spelling: str = "cli", separator: str = "; ") -> str:
    """Every policy and what it does, for `--help` (each with its number, as the node spells it) or a tooltip."""
    return separator.join((f"{policy.name} (or {policy.node_value})" if spelling == "cli"
                           else f"{policy.node_value} ({policy.name})") + f": {policy.help}" for policy in POLICIES)


def policy_for(window: int | str, model: Any, batch_size: int, branches: int,
               timed_call: Callable[[int], torch.Tensor]) -> WindowPolicy:
    """The policy of a `SamplerConfig.window` setting for one run (see `auto_window.AutoWindow` for the rest)."""
    policy = named(window)
    if policy is None:
        return PinnedWindow(min(window, model.num_tokens))
    return policy.make(model, batch_size, branches, timed_call)


def widest(window: int | str, num_tokens: int) -> int:
    """The widest call a run of this setting makes in an image of `num_tokens`: what its memory is sized for."""
    policy = named(window)
    return min(window, num_tokens) if policy is None else policy.widest(num_tokens)


def per_call(window: int | str) -> bool:
    """Whether the setting's widths change from call to call (never those of a pinned width)."""
    policy = named(window)
    return policy is not None and policy.per_call


def column(window: int | str, windows: Sequence[int]) -> str:
    """A run's window in a table's column: a policy's name, or the widest call of a pinned width."""
    return str(window) if named(window) is not None else str(max(windows))


def report(window: int | str, windows: Sequence[int]) -> str:
    """The window a run used (`GenerationResult.windows`): "auto (40 calls at width 16, ...)", the pinned width,
    or the width actually used where the pinned one is wider than the image."""
    if named(window) is not None:
        return f"{window} ({widths_used(windows)})"
    widest_used = max(windows[1:], default=window)
    return f"{widest_used} (set to {window}: wider than the image)" if widest_used < window else str(window)
