"""What a two-stage family's diffusion decoder takes besides the tokens (GLM-Image's and MammothModa2's DiTs): its
step count, its guidance scale and the seed of its starting noise.

A model with such a decoder holds `decoding` (the settings its next decode runs with) and `default_decoding` (its
published pipeline's); hosts change them through `set_decoding`, so a value left out is the pipeline's, not
whatever an earlier run set.  The sampled tokens never depend on them: only the pixels do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Optional

from .family import diffusion_decoders

MAX_STEPS = 1000
MAX_GUIDANCE = 100.0
MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed's range


@dataclass(frozen=True)
class DecoderSettings:
    """A diffusion decoder's steps, guidance scale (1 or less: unguided) and noise seed."""

    steps: int
    guidance: float
    seed: int = 0


def checked_settings(settings: DecoderSettings, steps: Optional[int] = None, guidance: Optional[float] = None,
                     seed: Optional[int] = None) -> DecoderSettings:
    """`settings` with the given values in place of its own, each checked (one ValueError naming the value)."""
    if steps is not None and not (isinstance(steps, int) and not isinstance(steps, bool) and 1 <= steps <= MAX_STEPS):
        raise ValueError(f"the decoder's steps must be a whole number in 1..{MAX_STEPS}, got {steps!r}")
    if guidance is not None and not (isinstance(guidance, (int, float)) and not isinstance(guidance, bool)
                                     and math.isfinite(guidance) and 0 <= guidance <= MAX_GUIDANCE):
        raise ValueError(f"the decoder's guidance must be a number in 0..{MAX_GUIDANCE:g}, got {guidance!r}")
    if seed is not None and not (isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed <= MAX_SEED):
        raise ValueError(f"the decoder's seed must be a whole number in 0..2**64 - 1, got {seed!r}")
    changes = {name: value for name, value in (("steps", steps), ("guidance", guidance), ("seed", seed))
               if value is not None}
    return replace(settings, **changes)


def set_decoding(model: Any, steps: Optional[int] = None, guidance: Optional[float] = None,
                 seed: Optional[int] = None) -> None:
    """The model's next decodes run its published pipeline's settings with the given ones in their place.  A model
    whose decoder takes no such settings (a VQ decoder) refuses any given value in one line."""
    given = [name for name, value in (("steps", steps), ("guidance", guidance), ("seed", seed)) if value is not None]
    if not hasattr(model, "default_decoding"):
        if given:
            raise ValueError(f"this model's decoder is a VQ decoder, which takes no {', '.join(given)} (a diffusion "
                             f"decoder's: {diffusion_decoders()[0]})")
        return
    model.decoding = checked_settings(model.default_decoding, steps, guidance, seed)
