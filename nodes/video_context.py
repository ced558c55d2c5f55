"""SCD Video Context: context frames (an IMAGE batch from any video or image loader) -> SCD_COND."""

from __future__ import annotations

from typing import Optional

import torch
from comfy_api.latest import io
from scd_core.models.family import families

from .sockets import EncodedPrompt, LoadedModel, SCDCond, SCDModel

MAX_NEW_FRAMES = 64  # the widget's bound; the model refuses more than its positions hold (Cosmos: 32)


class SCDVideoContext(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SCDVideoContext",
            display_name="SCD Video Context",
            category="SCD",
            description="Turns the frames a video model continues "
                        f"({'; '.join(f'{family.label}: {family.video}' for family in families() if family.video)}) "
                        "into conditioning for the SCD Sampler.",
            inputs=[
                SCDModel.Input("model"),
                io.Image.Input("frames", tooltip="Context frames in order, e.g. from Load Video + Get Video "
                                                 "Components + Image From Batch (9 frames) or Load Image (1)."),
                io.String.Input("prompt", multiline=True, default="", optional=True,
                                tooltip="What happens next; only the Video2World models read a prompt."),
                io.Int.Input("new_frames", default=0, min=0, max=MAX_NEW_FRAMES, step=8, optional=True,
                             tooltip="Frames to generate after the context. 0: all the model has room for, as "
                                     "NVIDIA's pipeline does (Cosmos: 32 after 1 frame, 33 in all; 24 after 9). "
                                     "Fewer: a multiple of 8, e.g. 24 after 1 frame (25 in all)."),
            ],
            outputs=[SCDCond.Output(display_name="conditioning")],
        )

    @classmethod
    def execute(cls, model: LoadedModel, frames: torch.Tensor, prompt: Optional[str] = None,
                new_frames: int = 0) -> io.NodeOutput:
        encode_video = getattr(model.model, "encode_video", None)
        if encode_video is None:
            raise ValueError(f"model '{model.name}' is not a video model; use SCD Prompt Encode for it")
        model.to_compute_device()
        cond = encode_video(frames[..., :3].float().cpu(), prompt if prompt and prompt.strip() else None, new_frames)
        return io.NodeOutput(EncodedPrompt(model_name=model.name, cond=cond))
