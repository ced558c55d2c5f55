"""The sampler's options on the logits (guidance, temperature, top-k, top-p), each declared once.

An option's entry is what the settings check, what the model recommends in its place, its command-line flag and
help, and the sampler node's widget (its "recommended" value, range and tooltip).  `sampling.Sampling` carries the
resolved values by name to `to_probs`; a new filter is its entry here, its field in `SamplerConfig` and
`Sampling`, and its step in `to_probs` (`sampling.sampler_tensors` carries its value to compiled calls as a host
constant unless it makes it a device tensor too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ..model import FAR_CFG_FACTOR, FAR_TEMPERATURE_FACTOR, joined, model_default
from .sampling import Sampling

MAX_TOP_K = 1_000_000  # the node widget's range


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Option:
    name: str          # the SamplerConfig and Sampling field
    flag: str          # the command-line option
    kind: type         # int or float: the flag's and the widget's type
    allowed: str       # what a set value must be, for messages ("a number in 0..100")
    valid: Callable[[Any], bool]  # whether a set value is allowed
    model_default: str  # the model attribute recommending a value where the settings leave it unset
    fallback: Any      # the value where neither the settings nor the model give one
    help: str          # the command line's help (the default, the model's value, is said after it)
    recommended: float  # the node widget's value meaning "the model's recommended value"
    minimum: float     # the widget's range ...
    maximum: float
    step: Optional[float]  # ... and a float widget's step
    tooltip: Callable[[Sequence[Any]], str]  # the widget's tooltip from the families' declarations
    # (`models.family.Family`, handed in by the node: the core imports no family)

    def resolve(self, model: Any, value: Any) -> Any:
        """The set `value`, or the model's recommended one, or the fallback."""
        return model_default(model, self.model_default, self.fallback) if value is None else value

    def from_widget(self, value: Any) -> Any:
        """The widget's value as the settings take it: None for "recommended"."""
        return None if value == self.recommended else value


def _cfg_tooltip(families: Sequence[Any]) -> str:
    """The recommended scales and notes the families declare."""
    recommended = ", ".join(family.cfg for family in families if family.cfg)
    unguided = [family.label for family in families if not family.cfg]
    if unguided:
        recommended += f"; {joined(unguided)} {'has' if len(unguided) == 1 else 'have'} none"
    notes = " ".join(family.cfg_note for family in families if family.cfg_note)
    return (f"Classifier-free guidance scale; -1 uses the model's recommended value ({recommended}). Far above it "
            f"(more than {FAR_CFG_FACTOR:g}x) images turn to noise: the status line warns. {notes}").rstrip()


def _declared(families: Sequence[Any], field: str, then: str) -> str:
    """The families' declarations of `field` ("; " between them), followed by `then`; "" where none declares."""
    declared = "; ".join(getattr(family, field) for family in families if getattr(family, field))
    return declared + then if declared else ""


def _temperature_tooltip(families: Sequence[Any]) -> str:
    return ("Divides the model's logits before sampling; -1 uses the model's recommended value "
            f"({_declared(families, 'temperature', ', ')}else 1: the model as trained). Lower gives plainer images, "
            f"higher more varied ones and soon noise (above {FAR_TEMPERATURE_FACTOR:g}x the model's value the "
            "status line warns).")


def _top_k_tooltip(families: Sequence[Any]) -> str:
    return f"0 uses the model's recommended value ({_declared(families, 'top_k', '; ')}else none: every token)."


def _top_p_tooltip(families: Sequence[Any]) -> str:
    return f"0 uses the model's recommended value ({_declared(families, 'top_p', ', ')}else 1: no top-p)."


OPTIONS = (
    Option("cfg_scale", "--cfg", float, "a number in 0..100", lambda v: is_real(v) and 0 <= v <= 100,
           "default_cfg_scale", 1.0, "classifier-free guidance scale", -1.0, -1.0, 100.0, 0.1, _cfg_tooltip),
    Option("temperature", "--temperature", float, "a number in (0, 100]", lambda v: is_real(v) and 0 < v <= 100,
           "default_temperature", 1.0, "divides the logits before sampling", -1.0, -1.0, 100.0, 0.01,
           _temperature_tooltip),
    Option("top_k", "--top-k", int, "an integer >= 1", lambda v: is_int(v) and v >= 1, "default_top_k", None,
           "sample among the k likeliest tokens", 0, 0, MAX_TOP_K, None,
           _top_k_tooltip),
    Option("top_p", "--top-p", float, "a number in (0, 1]", lambda v: is_real(v) and 0 < v <= 1, "default_top_p",
           1.0, "sample among the likeliest tokens holding this much probability", 0.0, 0.0, 1.0, 0.01,
           _top_p_tooltip),
)
NAMES = tuple(option.name for option in OPTIONS)


def resolved(model: Any, config: Any) -> Sampling:
    """What a run of `config` on `model` samples with: each option as set, else the model's recommended value; top-k
    and top-p keep at least the model's `min_tokens_kept` tokens (MammothModa2's 3), else one."""
    return Sampling(**{option.name: option.resolve(model, getattr(config, option.name)) for option in OPTIONS},
                    keep_at_least=model_default(model, "min_tokens_kept", 1))
