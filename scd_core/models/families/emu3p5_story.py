"""Interleaved generation on the base Emu3.5 (the authors' tasks story, howto, explore): text with its images.

The authors' loop (github.com/baaivision/Emu3.5 at 8fcf1da: inference.py, src/utils/generation_utils.py,
src/utils/logits_processor.py's differential-sampling processor with unconditional_type "no_text",
configs/config.py, example_config_visual_narrative.py, example_config_visual_guidance.py) samples one sequence:
- text steps: no guidance, the visual ids masked (every other id stays possible: <|image start|>, EOS, ...), then
  text temperature 1.0, top-k 1024, top-p 0.9;
- an <|image start|> the model writes opens an image: its header (emu3p5_header: a given size forced, else written
  under the format mask), then H rows of W codes, EOL between and <|image end|> after the last (forced), each code
  guided as cfg * (log_softmax(c) - log_softmax(u)) + log_softmax(u), then image temperature / top-k / top-p;
- the unconditional context is the uncond prompt, every earlier image from <|image start|> to <|image end|>, then
  this image's header: it is fed in image mode and at <|image end|> only, never the text between (an <|image end|>
  written as text reaches it too: their exit_image feeds it);
- their processor keeps the first image's height / width for every later image (force_same_image_size, the
  default; it does so even when the flag is off, since the size stays set: `force_same_image_size=False` here
  lets the model write each image's size, which is not their law);
- reference images (emu3p5_story_prompt) go into both prompts, and every image then takes the last one's grid
  (a size given wins with one reference only);
- the run stops at EOS or after max_new_tokens.

Here each text token or size digit is drawn by emu3p5_steps.PlainSteps: inverse CDF from that law on the cond row
alone (one plain AR call, tokens the law forces fed with the next call), with a uniform keyed by (seed, position):
the same tokens at any window.  Each image is one `engine.generate` on an `Emu3p5Prompt` of the sequence so far
and its unconditional context, so every coupler and window samples it exactly under the authors' law.  Both cache
rows (cond, uncond: sessions.kept_rows) are kept for the whole run: each switch between text and image feeds only
the tokens a row lacks (the image's header, the uncond context's new image; the last image token), never the
sequence again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence, Union

import torch

from ...decoding.config import SamplerConfig
from ...decoding.engine import GenerationCancelled, IterationStats, generate
from ...decoding.run_settings import sampling_settings
from ...decoding.sampling import Sampling
from .emu3p5 import DOWNSAMPLE, IMAGE_END, IMAGE_START, IMAGE_TOKEN, Emu3p5Model, Emu3p5Prompt
from .emu3p5_header import HEADER_STEPS, SizeMask, forced_header
from .emu3p5_steps import PlainSteps
from .emu3p5_story_prompt import IMAGE_AREA, encode_references, story_prompts, story_size
from ..sessions.kept_rows import KeptRows

TASKS = ("story", "howto", "explore")
EOS, END_OF_ANSWER = "<|extra_204|>", "<|extra_101|>"  # multimodal_decode drops both from the text
STORY_CFG = 3.0  # configs/config.py: classifier_free_guidance 3.0 for the interleaved tasks
SMALLEST_WRITTEN = (10, 10)  # the format mask's smallest size: two digits a side, the first not 0
SEED_STEP = 0x9E3779B97F4A7C15  # image k draws with seed + (k + 1) * this (mod 2**64): apart from the text's keys


@dataclass(frozen=True)
class StoryOptions:
    """What the authors' configs set for an interleaved run (configs/config.py, sampling_params)."""

    task: str = "story"
    max_new_tokens: int = 32768
    size: Optional[tuple[int, int]] = None  # (rows, cols) in 16 px codes; None: the model writes the first's
    force_same_image_size: bool = True
    image_area: int = IMAGE_AREA  # pixels a reference image is resized to, about (their image_area)
    text_temperature: float = 1.0
    text_top_k: int = 1024
    text_top_p: float = 0.9

    def check(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if self.size is not None and not (len(self.size) == 2 and all(isinstance(s, int) and s > 0
                                                                      for s in self.size)):
            raise ValueError(f"size must be (rows, cols) of positive code counts or None, got {self.size!r}")
        if not isinstance(self.image_area, int) or self.image_area < 1:
            raise ValueError(f"image_area must be a positive pixel count, got {self.image_area!r}")
        if not (self.text_temperature > 0 and isinstance(self.text_top_k, int) and self.text_top_k >= 1
                and 0 < self.text_top_p <= 1):
            raise ValueError("text sampling needs temperature > 0, top-k >= 1 and top-p in (0, 1], got "
                             f"{self.text_temperature}, {self.text_top_k}, {self.text_top_p}")


@dataclass
class StoryEvent:
    """Progress: after each text token (`image` None), each call of image `image` (`stats`), and each finished
    image (`finished`: its ids)."""

    new_tokens: int
    image: Optional[int] = None
    stats: Optional[IterationStats] = None
    finished: Optional[torch.Tensor] = None


@dataclass
class StoryResult:
    """The new tokens as the authors' loop returns them, the text and images in order, and the calls."""

    tokens: list[int]
    parts: list[Union[str, int]]  # text, and the index of each image, in order
    images: list[torch.Tensor] = field(default_factory=list)  # each image's (1, N) ids after <|image token|>
    sizes: list[tuple[int, int]] = field(default_factory=list)  # (rows, cols) of each
    text_calls: int = 0  # calls for the text and the written sizes, the prompt's first
    image_calls: int = 0  # the engine's calls for the images, each one's first (its header fed) included
    stop: str = ""  # "eos", "max_new_tokens" (an image the budget cuts is not sampled) or "positions"

    @property
    def text(self) -> str:
        return "".join(part if isinstance(part, str) else f"\n[image {part + 1}]\n" for part in self.parts)


def check_story_model(model: object) -> Emu3p5Model:
    """The base Emu3.5, which writes text (Emu3.5-Image keeps the visual rows of its head only)."""
    if not isinstance(model, Emu3p5Model):
        raise ValueError(f"interleaved generation takes the base Emu3.5 (BAAI/Emu3.5), got a "
                         f"{getattr(model, 'family', type(model).__name__)} model")
    if getattr(model.module, "text_head", None) is None:
        raise ValueError("interleaved generation needs the base Emu3.5 (BAAI/Emu3.5); this folder is Emu3.5-Image "
                         "(its name holds 'Image'), which the authors use for T2I and X2I only")
    return model


def image_seed(seed: int, index: int) -> int:
    """The engine's seed for image `index` of a story of seed `seed`."""
    return (seed + (index + 1) * SEED_STEP) % 2**64


class StoryRun:
    """One interleaved sequence, token by token outside the images, image by image through the engine."""

    def __init__(self, model: Emu3p5Model, question: str, config: SamplerConfig, options: StoryOptions,
                 references: Sequence[torch.Tensor] = ()) -> None:
        self.model, self.options = check_story_model(model), options
        options.check()
        reference_ids, grids = encode_references(model, references, options.image_area)
        self.size = story_size(options.size, options.force_same_image_size, grids)  # None: the model writes it
        self.config = replace(config, cfg_scale=STORY_CFG if config.cfg_scale is None else config.cfg_scale)
        ids = model._tokenizer.ids
        self.boi, self.img, self.eoi, self.eos, self.ess = (ids[t] for t in (IMAGE_START, IMAGE_TOKEN, IMAGE_END,
                                                                                EOS, END_OF_ANSWER))
        self.mask = SizeMask.for_tokenizer(model._tokenizer.encode, self.img)
        self.prompt, self.uncond = story_prompts(model, question, options.task, reference_ids)
        self.budget = min(options.max_new_tokens, model.module.config.max_position_embeddings - len(self.prompt))
        self._check_budget()
        self.text_sampling = Sampling(temperature=options.text_temperature, top_k=options.text_top_k,
                                      top_p=options.text_top_p)
        self.size_sampling = replace(sampling_settings(model, self.config), cfg_scale=1.0)  # not guided
        capacity = max(len(self.prompt), len(self.uncond)) + self.budget
        self.rows = KeptRows(model.module, 2, capacity, model.device)  # cond, uncond: kept across segments
        self.steps = PlainSteps(self.rows, self.prompt, model.module.text_head, config.seed, self.budget)
        self.result = StoryResult(tokens=self.steps.tokens, parts=[])
        self.text: list[int] = []  # the text since the last image

    def _check_budget(self) -> None:
        size = self.size or SMALLEST_WRITTEN
        header = 1 + (len(forced_header(self.model._tokenizer.encode, size, self.img)) if self.size
                      else HEADER_STEPS)
        smallest = header + size[0] * (size[1] + 1)
        if self.budget <= 0:
            limit = self.model.module.config.max_position_embeddings
            raise ValueError(f"the prompt takes {len(self.prompt)} tokens (reference images included), the model's "
                             f"{limit} positions or more: leave room for the story (smaller or fewer references)")
        if self.budget < smallest:
            room = (f"max_new_tokens {self.options.max_new_tokens}" if self.budget == self.options.max_new_tokens
                    else f"the {self.budget} positions the prompt leaves the model")
            raise ValueError(f"{room} cannot hold one image: the smallest takes {smallest} tokens (its header and "
                             f"{size[0]} rows of {size[1]} codes with their ends); give at least {smallest}")

    def left(self) -> int:
        return self.steps.left()

    def run(self, callback: Optional[Callable[[StoryEvent], None]] = None,
            should_cancel: Optional[Callable[[], bool]] = None) -> StoryResult:
        """Sample until EOS or the budget; the model's image size is what it was before."""
        before = self.model.size
        try:
            self.result.stop = self._loop(callback, should_cancel)
        finally:
            self.model.set_image_size(before[1] * DOWNSAMPLE, before[0] * DOWNSAMPLE)
            self.result.text_calls = self.steps.calls
        self._flush_text()
        return self.result

    def _loop(self, callback: Optional[Callable[[StoryEvent], None]],
              should_cancel: Optional[Callable[[], bool]]) -> str:
        while self.left() > 0:
            if should_cancel is not None and should_cancel():
                raise GenerationCancelled(f"story cancelled after {len(self.result.tokens)} tokens")
            token = self.steps.draw(self.steps.logits(), self.text_sampling)
            self.steps.append(token)
            if callback is not None:
                callback(StoryEvent(len(self.result.tokens)))
            if token == self.eos:
                return "eos"
            if token == self.eoi:  # their exit_image feeds it to the unconditional context, image or not
                self.uncond.append(token)
            if token != self.boi:
                self.text.append(token)
                continue
            self._flush_text()
            size = self._header()
            if size is None or not self._image(size, callback, should_cancel):
                break
        return "positions" if self.budget < self.options.max_new_tokens else "max_new_tokens"

    def _header(self) -> Optional[tuple[int, int]]:
        """The tokens after <|image start|> up to <|image token|>, forced or written; the size, None where the
        budget ends first."""
        sizes = self.result.sizes
        size = self.size or (sizes[0] if sizes and self.options.force_same_image_size else None)
        if size is not None:
            header = forced_header(self.model._tokenizer.encode, size, self.img)
            if len(header) > self.left():
                return None
            for token in header:
                self.steps.append(token)
            return size
        return self.steps.write_header(self.mask, self.size_sampling)

    def _image(self, size: tuple[int, int], callback: Optional[Callable[[StoryEvent], None]],
               should_cancel: Optional[Callable[[], bool]]) -> bool:
        """Image k through the engine; False where the budget cannot hold it (then it is not sampled, as the
        authors' decode drops an unfinished image)."""
        rows, cols = size
        if rows * (cols + 1) > self.left():
            return False
        index = len(self.result.images)
        start = len(self.result.tokens) - self.result.tokens[::-1].index(self.boi) - 1
        header = self.result.tokens[start:]
        prompt = Emu3p5Prompt(cond=tuple(self.prompt + self.result.tokens), uncond=tuple(self.uncond + header),
                              size=size, kept=self.rows)
        report = None if callback is None else (
            lambda stats: callback(StoryEvent(len(self.result.tokens), index, stats)))
        image = generate(self.model, prompt, replace(self.config, seed=image_seed(self.config.seed, index)),
                         callback=report, should_cancel=should_cancel)
        tokens = image.tokens[0].tolist()
        self.result.tokens += tokens
        self.uncond += header + tokens
        self.result.images.append(image.tokens)
        self.result.sizes.append(size)
        self.result.image_calls += image.nfe
        self.result.parts.append(index)
        if callback is not None:
            callback(StoryEvent(len(self.result.tokens), index, finished=image.tokens))
        return True

    def _flush_text(self) -> None:
        """The text since the last image as a part, without the end marks multimodal_decode drops."""
        kept = [token for token in self.text if token not in (self.eos, self.ess)]
        if kept:
            self.result.parts.append(self.model._tokenizer.bpe.decode(kept))
        self.text = []


def generate_story(model: Emu3p5Model, question: str, config: SamplerConfig,
                   options: StoryOptions = StoryOptions(), *, references: Sequence[torch.Tensor] = (),
                   callback: Optional[Callable[[StoryEvent], None]] = None,
                   should_cancel: Optional[Callable[[], bool]] = None) -> StoryResult:
    """An interleaved run of `options.task` on `question`, with the `references` (each one picture, a ComfyUI
    IMAGE) in its prompts, the last one's grid for every image unless one reference and a size are given;
    `config` samples the images (cfg_scale None: 3, the authors' interleaved value; top-k None: the model's
    10240)."""
    return StoryRun(model, question, config, options, references).run(callback, should_cancel)


def decode_images(model: Emu3p5Model, result: StoryResult) -> list[torch.Tensor]:
    """Each image of `result` as float32 (H, W, 3) in 0..1; the model's image size is what it was before."""
    before, images = model.size, []
    try:
        for tokens, (rows, cols) in zip(result.images, result.sizes):
            model.set_image_size(cols * DOWNSAMPLE, rows * DOWNSAMPLE)
            images.append(model.decode(tokens)[0])
    finally:
        model.set_image_size(before[1] * DOWNSAMPLE, before[0] * DOWNSAMPLE)
    return images
