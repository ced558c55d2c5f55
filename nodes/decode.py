"""SCD VQ Decode: SCD_TOKENS -> IMAGE."""

from __future__ import annotations

from typing import Optional

import comfy.model_management as mm
import torch
from comfy_api.latest import io

from .checks import check_same_model, check_tokens
from .sockets import EncodedPrompt, LoadedModel, SCDCond, SCDModel, SCDTokens


class SCDVQDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SCDVQDecode",
            display_name="SCD VQ Decode",
            category="SCD",
            description="Decodes image tokens to pixels with the model's VQ decoder; a video model's "
                        "frames come out in order as one IMAGE batch.",
            inputs=[SCDModel.Input("model"), SCDTokens.Input("tokens"),
                    SCDCond.Input("conditioning", optional=True,
                                  tooltip="Video models: connect the context to decode the whole clip, "
                                          "context frames first; unconnected, only the continuation.")],
            outputs=[io.Image.Output(display_name="image")],
        )

    @classmethod
    def execute(cls, model: LoadedModel, tokens: torch.Tensor,
                conditioning: Optional[EncodedPrompt] = None) -> io.NodeOutput:
        tokens = check_tokens(model, tokens)
        context = ()
        if conditioning is not None:
            check_same_model(model, conditioning.model_name, "conditioning")
            if not getattr(model.model, "decodes_context", False):
                raise ValueError(f"model '{model.name}' decodes its tokens alone; disconnect 'conditioning' "
                                 "(it is for video models, whose context frames are decoded in front)")
            context = (conditioning.cond,)
        model.to_compute_device()
        images = model.model.decode(tokens, *context)
        return io.NodeOutput(images.to(device=mm.intermediate_device(), dtype=torch.float32))
