"""Checks shared by several nodes; each failure names the input and what to do."""

from __future__ import annotations

from typing import Any, Optional

import torch
from comfy_api.latest import io

from .sockets import LoadedModel


class CheckedCombo(io.Combo.Input):
    """A combo whose value ComfyUI checks itself before running, reporting a bad one against this input alone.

    ComfyUI 0.3.75 checks only combos typed by their option list (the V1 form), not V3's "COMBO"; and a
    node's validate_inputs reports its one message against every input it names.
    """

    def get_io_type(self) -> list[str]:
        return list(self.options)


def choice_error(name: str, value: Optional[str], options: tuple[str, ...]) -> Optional[str]:
    """Why `value` is not a valid combo choice, or None (for direct calls that skip ComfyUI's validation)."""
    if value is not None and value not in options:
        return f"{name} must be one of {', '.join(options)}, got '{value}'"
    return None


RECOMMENDED_SCALE = -1.0  # a guidance-scale widget's value meaning "the model's recommended value"


def guidance_scale(name: str, value: float) -> Optional[float]:
    """A guidance-scale widget's value as scd_core takes it: None for RECOMMENDED_SCALE, else the number, which
    must lie in 0..100."""
    if value == RECOMMENDED_SCALE:
        return None
    if not 0 <= value <= 100:  # NaN included
        raise ValueError(f"{name} must be -1 (the model's recommended value) or a number in 0..100, got {value}")
    return value


def check_same_model(model: LoadedModel, encoded_by: str, what: str) -> None:
    if encoded_by != model.name:
        raise ValueError(f"the {what} came from model '{encoded_by}' but this node got model '{model.name}'; "
                         "connect the same SCD Model Loader to both nodes")


def check_tokens(model: LoadedModel, tokens: Any) -> torch.Tensor:
    expected = model.model.num_tokens
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.shape[1] != expected:
        shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise ValueError(f"tokens of shape {shape} do not fit model '{model.name}', which decodes "
                         f"(batch, {expected}); connect the tokens of an SCD Sampler that used this model")
    return tokens
