"""SCD Emu3.5 Story: SCD_MODEL (the base Emu3.5) + prompt (+ reference images) -> the story's images (IMAGE) and
text (STRING)."""

from __future__ import annotations

from dataclasses import replace

import comfy.model_management as mm
import torch
from comfy_api.latest import io
from scd_core.decoding.config import MAX_SEED
from scd_core.models.families.emu3p5 import grid_for
from scd_core.models.families.emu3p5_story import STORY_CFG, TASKS, StoryEvent, StoryOptions, decode_images, \
    generate_story
from server import PromptServer

from .progress import ProgressReporter
from .sampler import DEFAULT_WINDOW, sampler_config
from .sockets import LoadedModel, SCDModel

OPTIONS = StoryOptions()  # the authors' defaults; the node's inputs replace some


class StoryReporter:
    """The story's callback: a progress bar and previews per image, a status line, Cancel within a call."""

    def __init__(self, node_id: str, model: LoadedModel) -> None:
        self.node_id, self.model = node_id, model
        self.image: ProgressReporter | None = None
        self.index = -1

    def __call__(self, event: StoryEvent) -> None:
        mm.throw_exception_if_processing_interrupted()
        if event.stats is None:
            if event.finished is None:
                PromptServer.instance.send_progress_text(f"story: {event.new_tokens} tokens, {self.index + 1} "
                                                         "images", self.node_id)
            return
        if event.image != self.index:  # the model has this image's size now: a bar of its tokens
            self.index, self.image = event.image, ProgressReporter(self.node_id, self.model.model,
                                                                   (f"image {event.image + 1}",))
        self.image(event.stats)


class SCDEmu3p5Story(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SCDEmu3p5Story",
            display_name="SCD Emu3.5 Story",
            category="SCD",
            description="Interleaved text and images from the base Emu3.5 (the authors' story, howto and explore "
                        "tasks): the text drawn as the authors draw it, every image sampled exactly by SCD.",
            inputs=[
                SCDModel.Input("model", tooltip="The base Emu3.5 (BAAI/Emu3.5); Emu3.5-Image writes no text."),
                io.String.Input("prompt", multiline=True, default="Tell a story about a hedgehog who is afraid of "
                                "the dark.", tooltip="What the story, how-to or exploration is about."),
                io.Combo.Input("task", options=list(TASKS), default=OPTIONS.task,
                               tooltip="The authors' interleaved task; howto asks for text and images."),
                io.Int.Input("window", default=DEFAULT_WINDOW, min=0, max=256,
                             tooltip="Image tokens per model call (0 = automatic, 1 = plain AR); with the faithful "
                                     "coupler the window changes the calls, never the story."),
                io.Float.Input("cfg_scale", default=STORY_CFG, min=1.0, max=20.0, step=0.1,
                               tooltip="Guidance of the image tokens (the authors' interleaved value: 3)."),
                io.Int.Input("seed", default=0, min=0, max=MAX_SEED, control_after_generate=True),
                io.Int.Input("max_new_tokens", default=OPTIONS.max_new_tokens, min=1, max=131072,
                             tooltip="The sequence's new tokens at most (text and images)."),
                io.Int.Input("width", default=0, min=0, max=4096, step=16,
                             tooltip="Every image's width in pixels; 0 (with height 0) = the model writes the "
                                     "first image's size, which the later ones keep."),
                io.Int.Input("height", default=0, min=0, max=4096, step=16, tooltip="See width."),
                io.Image.Input("references", optional=True,
                               tooltip="Reference images (a batch: one reference each) in the prompt, as the "
                                       "authors give them; every image then takes the last one's size (or width "
                                       "x height with one reference)."),
            ],
            outputs=[io.Image.Output(display_name="images"), io.String.Output(display_name="text")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, model: LoadedModel, prompt: str, task: str, window: int, cfg_scale: float, seed: int,
                max_new_tokens: int, width: int, height: int,
                references: torch.Tensor | None = None) -> io.NodeOutput:
        if (width == 0) != (height == 0):
            raise ValueError(f"give both width and height, or 0 for both (the model writes the size); got "
                             f"{width} x {height}")
        options = replace(OPTIONS, task=task, max_new_tokens=max_new_tokens,
                          size=grid_for(width, height) if width else None)
        config = sampler_config("faithful", window, seed, "auto", cfg_scale=cfg_scale)
        model.to_compute_device(model.run_memory(1, config.window))
        result = generate_story(model.model, prompt, config, options,
                                references=() if references is None else list(references),
                                callback=StoryReporter(str(cls.hidden.unique_id), model))
        images = decode_images(model.model, result)
        batch = torch.stack(images) if images else torch.zeros(0, 64, 64, 3)
        return io.NodeOutput(batch, result.text.strip())
