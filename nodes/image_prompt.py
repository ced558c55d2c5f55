"""SCD Image Prompt: SCD_COND + IMAGE (+ MASK) -> SCD_COND with the image in the prompt."""

from __future__ import annotations

from typing import Optional

import torch
from comfy_api.latest import io
from scd_core.images.image_prompt import CONTINUE, MASKED, add_image
from scd_core.models.families.emu3p5_auto import AutoSize
from scd_core.models.family import families
from server import PromptServer

from .checks import RECOMMENDED_SCALE, CheckedCombo, check_same_model, guidance_scale
from .sockets import EncodedPrompt, LoadedModel, SCDCond, SCDModel

DEFAULT_KEEP_TOP = 0.5


def task_choices() -> list[str]:
    """continue (any family with an image encoder), then the tasks the families declare, each once."""
    return [CONTINUE, *dict.fromkeys(task for family in families() for task in family.image_tasks)]


def task_tooltip() -> str:
    declared = "; ".join(f"{family.label}: {', '.join(family.image_tasks)}" for family in families()
                         if family.image_tasks)
    return (f"{CONTINUE}: keep part of the image (the top rows, or what the mask leaves) and sample the rest, on "
            f"any model with an image encoder. The others are the image-conditioned tasks a checkpoint was "
            f"trained for ({declared}; on Lumina-mGPT 2.0-Omni and Janus-4o, not on the plain checkpoints); a "
            f"model refuses a task it was not trained for.")


class SCDImagePrompt(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SCDImagePrompt",
            display_name="SCD Image Prompt",
            category="SCD",
            description="Puts an image into the conditioning. continue keeps the image's top rows (or the cells "
                        "outside a mask) as given tokens and samples the rest, exactly as the model would given "
                        "them; kept cells cost no model calls. A raster model sees only what lies above and to "
                        "the left of a cell, so a masked region is regenerated from what precedes it: there is "
                        "no exact masked inpainting for these models. Other tasks (depth, canny, subject on "
                        "Lumina-mGPT 2.0-Omni; edit on Janus-4o and GLM-Image) put the image in the prompt as "
                        "the authors do.",
            inputs=[
                SCDModel.Input("model"),
                SCDCond.Input("cond", tooltip="From SCD Prompt Encode; the image is fitted to its size."),
                io.Image.Input("image", tooltip="Resized and cropped (or padded) to the model's size as its "
                                                "authors' preprocessing does; the status line says so."),
                io.Mask.Input("mask", optional=True,
                              tooltip=f"continue only: the cells to regenerate. A cell is regenerated where any "
                                      f"of its pixels is masked ({MASKED:g} or more); the others keep the image's "
                                      "tokens. Same size as the image; fitted to the model's grid as the image is "
                                      "(cropped or padded). Unconnected: keep_top decides."),
                CheckedCombo("task", options=task_choices(), default=CONTINUE, tooltip=task_tooltip()),
                io.Float.Input("keep_top", default=DEFAULT_KEEP_TOP, min=0.0, max=1.0, step=0.05, optional=True,
                               tooltip="continue without a mask: the share of the image's token rows kept from "
                                       "the top (0.5: the upper half, rounded to whole rows); the rows below "
                                       "are sampled."),
                io.Float.Input("image_cfg", default=RECOMMENDED_SCALE, min=-1.0, max=100.0, step=0.5,
                               optional=True,
                               tooltip="Janus-4o edit: how strongly the source image guides, apart from the "
                                       "text (the sampler's cfg_scale); -1 is the authors' 5. Other tasks take "
                                       "none."),
            ],
            outputs=[SCDCond.Output(display_name="conditioning")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, model: LoadedModel, cond: EncodedPrompt, image: torch.Tensor, task: str,
                mask: Optional[torch.Tensor] = None, keep_top: float = DEFAULT_KEEP_TOP,
                image_cfg: float = RECOMMENDED_SCALE) -> io.NodeOutput:
        check_same_model(model, cond.model_name, "conditioning")
        if isinstance(cond.cond, AutoSize):
            raise ValueError("size auto is for text to image (the model writes its size); with an image prompt "
                             "set SCD Prompt Encode's size to 'width x height' (0 x 0: the reference's grid)")
        model.to_compute_device()  # the image encoder computes where the model does
        prompt = add_image(model.model, cond.cond, image, task, keep_top, mask,
                           guidance_scale("image_cfg", image_cfg))
        PromptServer.instance.send_progress_text(prompt.note, str(cls.hidden.unique_id))
        return io.NodeOutput(EncodedPrompt(model_name=model.name, cond=prompt.cond))
