"""SCD Prompt Encode: a text prompt (or class index) -> SCD_COND."""

from __future__ import annotations

from typing import Optional

from comfy_api.latest import io

from scd_core import own_size_prompt
from scd_core.model import set_image_size
from scd_core.models.family import families, joined

from .checks import CheckedCombo
from .sockets import EncodedPrompt, LoadedModel, SCDCond, SCDModel

GIVEN, AUTO = "width x height", "auto"  # the image size: as given (0: the model's own), or written by the model


def size_tooltip(side: str) -> str:
    sizes = joined(size for family in families() for size in family.sizes)
    return (f"Image {side} in pixels; 0 = the model's own size. {sizes} take other sizes; the prompt carries the "
            "size, as these models expect.")


class SCDPromptEncode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SCDPromptEncode",
            display_name="SCD Prompt Encode",
            category="SCD",
            description="Turns a prompt into conditioning for the SCD Sampler. Class-conditional models "
                        f"({', '.join(filter(None, (family.class_index for family in families())))}) take a "
                        "class index such as 7.",
            inputs=[
                SCDModel.Input("model"),
                io.String.Input("prompt", multiline=True, default="7",
                                tooltip="Text prompt, or a class index for class-conditional models."),
                io.String.Input("negative_prompt", multiline=True, default="", optional=True,
                                tooltip="Used as the unconditional branch of CFG where the model supports it."),
                io.Int.Input("width", default=0, min=0, max=4096, step=8, optional=True,
                             tooltip=size_tooltip("width")),
                io.Int.Input("height", default=0, min=0, max=4096, step=8, optional=True,
                             tooltip=size_tooltip("height")),
                # optional and last: workflows saved before it existed keep their widgets' values
                CheckedCombo("size", options=[GIVEN, AUTO], default=GIVEN, optional=True,
                     tooltip="Text to image on a model that writes its own image size: auto lets it "
                             "write the size for each seed (the authors' aspect auto: two digits, '*', "
                             "two digits under their mask, 10..99 codes a side); width and height 0, "
                             "batch 1."),
            ],
            outputs=[SCDCond.Output(display_name="conditioning")],
        )

    @classmethod
    def execute(cls, model: LoadedModel, prompt: str, negative_prompt: Optional[str] = None, width: int = 0,
                height: int = 0, size: str = GIVEN) -> io.NodeOutput:
        if not prompt.strip():
            raise ValueError("prompt is empty; type a prompt (or a class index such as 7 for class models)")
        if size == AUTO and (width or height):
            raise ValueError("size auto lets the model write the image size: set width and height to 0")
        set_image_size(model.model, width, height)
        cond = model.model.encode(prompt, negative_prompt if negative_prompt and negative_prompt.strip() else None)
        if size == AUTO:
            cond = own_size_prompt(model.model, cond)
        return io.NodeOutput(EncodedPrompt(model_name=model.name, cond=cond))
