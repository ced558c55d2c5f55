"""SCD VQ Decode: SCD_TOKENS -> IMAGE."""

from __future__ import annotations

import comfy.model_management as mm
import torch
from comfy_api.latest import io

from .checks import check_tokens
from .sockets import LoadedModel, SCDModel, SCDTokens


class SCDVQDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SCDVQDecode",
            display_name="SCD VQ Decode",
            category="SCD",
            description="Decodes image tokens to pixels with the model's VQ decoder.",
            inputs=[SCDModel.Input("model"), SCDTokens.Input("tokens")],
            outputs=[io.Image.Output(display_name="image")],
        )

    @classmethod
    def execute(cls, model: LoadedModel, tokens: torch.Tensor) -> io.NodeOutput:
        tokens = check_tokens(model, tokens)
        model.to_compute_device()
        images = model.model.decode(tokens)
        return io.NodeOutput(images.to(device=mm.intermediate_device(), dtype=torch.float32))
