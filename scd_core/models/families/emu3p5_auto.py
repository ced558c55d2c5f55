"""Text-to-image at the size Emu3.5 writes itself: the authors' aspect "auto".

With no target size, the authors' processor (src/utils/logits_processor.py, in_image_logits_processor with no
target_height / target_width; configs/example_config_t2i.py, aspect "auto") lets the model write the header after
<|image start|> under its format mask (emu3p5_header), unguided but with the image temperature / top-k / top-p; the
unconditional context is fed the same tokens, then the grid is sampled at the size written (parse_hw).

Here the header is drawn by emu3p5_steps.PlainSteps (the story's machinery: inverse CDF, uniform keyed by
(seed, position), so the size is the same at any window), then the grid is one `engine.generate` on the prompt that
ends with the written header in both branches.  One batch samples one grid, and each row could write another size,
so a batch is refused: run the seeds one at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

from ...decoding.config import SamplerConfig
from ...decoding.engine import GenerationResult, IterationStats, generate
from ...decoding.run_settings import sampling_settings
from ..sessions.kept_rows import KeptRows
from .emu3p5 import Emu3p5Model, Emu3p5Prompt
from .emu3p5_header import HEADER_STEPS
from .emu3p5_steps import PlainSteps


@dataclass(frozen=True)
class AutoSize:
    """A T2I prompt whose size the model writes at each run, for that run's seed (`for_run`)."""

    prompt: Emu3p5Prompt


def check_batch(batch_size: int) -> None:
    if batch_size != 1:
        raise ValueError(f"aspect auto samples one image at a time (each could write another size, and one batch "
                         f"samples one grid), got a batch of {batch_size}; run the seeds one after another")


def auto_size(model: Any, prompt: Any) -> AutoSize:
    """`prompt` (from `model.encode`) marked for the model's own size; refused on a model that writes none."""
    if not isinstance(model, Emu3p5Model):
        raise ValueError(f"aspect auto is Emu3.5's (the model writes its image size), not "
                         f"{getattr(model, 'family', type(model).__name__)}'s; give a width and height")
    check_prompt(prompt)
    return AutoSize(prompt)


def for_run(model: Any, cond: Any, config: SamplerConfig, batch_size: int) -> Any:
    """What one run of `config` samples: an `AutoSize` prompt with the header written for its seed; any other
    conditioning as it is."""
    if not isinstance(cond, AutoSize):
        return cond
    check_batch(batch_size)
    return with_written_size(model, cond.prompt, config)


def before_header(ids: tuple[int, ...], image_start: int) -> list[int]:
    """`ids` up to and including its last <|image start|> (the header the prompt was encoded with dropped)."""
    return list(ids[:len(ids) - ids[::-1].index(image_start)])


def check_prompt(prompt: Any) -> None:
    if not isinstance(prompt, Emu3p5Prompt):
        raise ValueError(f"aspect auto takes an Emu3.5 prompt (Emu3p5Model.encode()), got {type(prompt).__name__}")
    if prompt.references:
        raise ValueError("aspect auto is for text-to-image: with reference images the authors use the last one's "
                         "grid (leave width and height 0) or the size given")


def with_written_size(model: Emu3p5Model, prompt: Emu3p5Prompt, config: SamplerConfig) -> Emu3p5Prompt:
    """`prompt` (a T2I prompt from `model.encode`) with the header the model writes for seed `config.seed` in both
    branches, and its size; the model is set to that size."""
    check_prompt(prompt)
    start = model._image_start
    cond, uncond = before_header(prompt.cond, start), before_header(prompt.uncond, start)
    rows = KeptRows(model.module, 1, len(cond) + HEADER_STEPS, model.device)
    steps = PlainSteps(rows, cond, model.module.size_head, config.seed, HEADER_STEPS)
    size = steps.write_header(model.size_mask, replace(sampling_settings(model, config), cfg_scale=1.0))
    model._set_grid(*size)  # as `start` will: progress bars and decode see its grid
    return replace(prompt, cond=(*cond, *steps.tokens), uncond=(*uncond, *steps.tokens), size=size, size_asked=True)


def generate_auto(model: Emu3p5Model, prompt: Emu3p5Prompt, config: SamplerConfig, *, batch_size: int = 1,
                  callback: Optional[Callable[[IterationStats], None]] = None,
                  should_cancel: Optional[Callable[[], bool]] = None) -> tuple[GenerationResult, Emu3p5Prompt]:
    """One image at the size the model writes, and the prompt with that header (its `size`); the model is left
    at that size, so `model.decode` takes the result."""
    check_batch(batch_size)
    written = with_written_size(model, prompt, config)
    return generate(model, written, config, callback=callback, should_cancel=should_cancel), written
