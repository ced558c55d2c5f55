"""SCD VQ Decode: SCD_TOKENS -> IMAGE."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Optional

import comfy.model_management as mm
import comfy.utils
import torch
from comfy_api.latest import io
from scd_core import set_decoding
from scd_core.models.decoder_settings import MAX_GUIDANCE, MAX_SEED, MAX_STEPS
from scd_core.models.family import diffusion_decoders
from scd_core.models.weights.quantize import module_bytes

from .checks import RECOMMENDED_SCALE, check_same_model, check_tokens, guidance_scale
from .core_compat import classic_patcher_class
from .loader import module_holder
from .sockets import EncodedPrompt, LoadedModel, SCDCond, SCDModel, SCDTokens, load_fully

MAX_TILE = 4096
DECODING, DECODING_DEFAULTS = diffusion_decoders()


def decoding_stage(model: LoadedModel) -> Any:
    """The patcher of a family's separate decoding stage (its `decoding_modules`: GLM-Image's DiT, VAE, glyph
    encoder), built once per loaded model; None for one-stage families. Its own patcher lets ComfyUI evict it
    for the AR stage and back."""
    if not hasattr(model.model, "decoding_modules"):
        return None
    if model.decoder_patcher is None:
        # built where ComfyUI keeps it offloaded (not next to the AR stage), as it expects a fresh patcher's weights
        parts = model.model.decoding_modules(model.patcher.offload_device)
        model.decoder_patcher = classic_patcher_class()(
            module_holder(parts, f"{model.name} decoder"), load_device=model.patcher.load_device,
            offload_device=model.patcher.offload_device, size=module_bytes(parts))
    return model.decoder_patcher


@contextmanager
def decoder_hooks(model: LoadedModel, stage: Any) -> Iterator[None]:
    """The stages loaded for a decode, and its hooks set for its length.  A decode with steps of its own
    (MammothModa2's DiT: `decode_progress`) moves ComfyUI's progress bar at each step and stops there when the run
    is interrupted.  A decode that re-encodes with the token stage first (MammothModa2's LLM: `stage_switch`) loads
    that stage, then the decoding stage once the re-encode is done, so ComfyUI may offload the LLM for the DiT."""
    inner, hooks = model.model, {}
    if stage is None:
        model.to_compute_device()
    elif hasattr(inner, "stage_switch"):
        model.to_compute_device()
        hooks["stage_switch"] = lambda: load_fully(stage, inner.decoding_memory())
    else:  # only the decoding stage: ComfyUI offloads the AR stage if both do not fit
        load_fully(stage, inner.decoding_memory())
    if hasattr(inner, "decode_progress"):
        bar: list[Any] = []

        def report(done: int, total: int) -> None:
            mm.throw_exception_if_processing_interrupted()
            if not bar:
                bar.append(comfy.utils.ProgressBar(total))
            bar[0].update_absolute(done, total)

        hooks["decode_progress"] = report
    for name, hook in hooks.items():
        setattr(inner, name, hook)
    try:
        yield
    finally:
        for name in hooks:
            setattr(inner, name, None)


def tiling(model: LoadedModel, tile_size: int) -> dict[str, int]:
    """The decode's tile argument: none at 0 (auto) on a model that decodes whole; a tile size it cannot take
    refused."""
    if not getattr(model.model, "decodes_in_tiles", False):
        if tile_size:
            raise ValueError(f"model '{model.name}' decodes whole (tiles are Emu3.5's); set tile_size to 0")
        return {}
    return {"tile_size": tile_size}


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
                                          "context frames first; unconnected, only the continuation."),
                    # optional: workflows saved before it existed decode as they did
                    io.Int.Input("tile_size", default=0, min=0, max=MAX_TILE, step=16, optional=True,
                                 tooltip="Emu3.5: decode in tiles of this many pixels a side, to bound the "
                                         "decoder's memory on large images; 0 = auto (whole up to 1024 x 1024 px, "
                                         "512 px tiles above). Tiles give the whole decode's pixels (the norms and "
                                         "attention still see the whole image), so no overlap is needed."),
                    io.Int.Input("decoder_steps", default=0, min=0, max=MAX_STEPS, optional=True,
                                 tooltip=f"Diffusion decoders ({DECODING}): the DiT's steps; 0 = the published "
                                         f"pipeline's ({DECODING_DEFAULTS})."),
                    io.Float.Input("decoder_guidance", default=RECOMMENDED_SCALE, min=RECOMMENDED_SCALE,
                                   max=MAX_GUIDANCE, step=0.1, optional=True,
                                   tooltip="Diffusion decoders: the DiT's guidance scale (1 = none); -1 = the "
                                           "published pipeline's."),
                    io.Int.Input("decoder_seed", default=0, min=0, max=MAX_SEED, optional=True,
                                 tooltip="Diffusion decoders: the seed of the DiT's starting noise (its only "
                                         "randomness; the tokens fix everything else). VQ decoders draw nothing.")],
            outputs=[io.Image.Output(display_name="image")],
        )

    @classmethod
    def execute(cls, model: LoadedModel, tokens: torch.Tensor, conditioning: Optional[EncodedPrompt] = None,
                tile_size: int = 0, decoder_steps: int = 0, decoder_guidance: float = RECOMMENDED_SCALE,
                decoder_seed: int = 0) -> io.NodeOutput:
        tokens = check_tokens(model, tokens)
        context = ()
        if conditioning is not None:
            check_same_model(model, conditioning.model_name, "conditioning")
            if not getattr(model.model, "decodes_context", False):
                raise ValueError(f"model '{model.name}' decodes its tokens alone; disconnect 'conditioning' "
                                 "(it is for video models, whose context frames are decoded in front)")
            context = (conditioning.cond,)
        # 0, -1 and 0 are the pipeline's own values, which a VQ decoder takes as nothing asked
        set_decoding(model.model, steps=decoder_steps or None, seed=decoder_seed or None,
                     guidance=guidance_scale("decoder_guidance", decoder_guidance))
        with decoder_hooks(model, decoding_stage(model)):
            images = model.model.decode(tokens, *context, **tiling(model, tile_size))
        return io.NodeOutput(images.to(device=mm.intermediate_device(), dtype=torch.float32))
