"""What the `python -m scd_core` subcommands share: their model and sampler arguments, the model they open,
and images as PIL."""

from __future__ import annotations

import argparse
from typing import Any, Optional

import torch
from PIL import Image

from ..decoding import couplers, sampler_options
from ..windows import window_policies
from ..decoding.config import COUPLERS, DRAFT_INITS, VERIFICATIONS, SamplerConfig
from ..models.family import compilable, diffusion_decoders, families, joined
from ..models.decoder_settings import DecoderSettings, checked_settings, set_decoding
from ..models.loading import DTYPES, load_model, pick_device
from ..models.two_stage import keep_stages_apart
from ..models.weights.quantize import PRECISIONS
from ..model import set_image_size

DEFAULTS = SamplerConfig()
# SamplerConfig's fields as the command line names them, for its messages ("cfg_scale must be None or ...":
# on a command line None is leaving the option out)
SAMPLER_OPTIONS = {"coupler": "--coupler", "window": "--window", "seed": "--seed", "draft_init": "--draft-init",
                   "verification": "--verification", "candidates": "--candidates",
                   **{option.name: option.flag for option in sampler_options.OPTIONS}}


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def _pixels(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a pixel count >= 0 (0: the model's size), got {text}")
    return value


def _window(text: str) -> int | str:
    try:
        return window_policies.from_text(text)  # the range is SamplerConfig's to check
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _dtype(text: str) -> str:
    """A --dtype name; a weight precision there is pointed at --quantize (the dtype stays the compute dtype)."""
    if text in PRECISIONS and text != "none":
        raise argparse.ArgumentTypeError(f"{text} is a weight precision, not a compute dtype: use --quantize {text}")
    return text


def dtype_names() -> str:
    """Every name --dtype takes, each type once with its short names after it: "float32 (fp32), ... or float64"."""
    names: dict[torch.dtype, list[str]] = {}
    for name, dtype in DTYPES.items():
        names.setdefault(dtype, []).append(name)
    return joined((f"{first} ({', '.join(short)})" if short else first for first, *short in names.values()),
                  last="or")


def add_model_arguments(group: argparse._ArgumentGroup) -> None:
    """The model and where it runs: what `generate` and `batch` share."""
    group.add_argument("--model", required=True, help='"demo" (the embedded digit model) or a model folder')
    group.add_argument("--device", help="cpu, cuda, cuda:1, mps (default: the best available)")
    group.add_argument("--dtype", type=_dtype, choices=DTYPES, metavar="DTYPE",
                       help=f"{dtype_names()} (default: bfloat16 on CUDA, else float32)")
    group.add_argument("--quantize", choices=PRECISIONS, default="none",
                       help="store the backbone's weights in 8 or 4 bits (nf4 needs bitsandbytes); exact either way")
    group.add_argument("--compile", action="store_true",
                       help="static-shape window calls through torch.compile (CUDA graphs on CUDA); the first "
                            f"call of each window width compiles ({compilable()}; candidates 1)")
    sized = ", ".join(family.label for family in families() if family.sizes)
    group.add_argument("--width", type=_pixels, default=0,
                       help=f"image width in pixels ({sized}); 0: the model's size")
    group.add_argument("--height", type=_pixels, default=0,
                       help=f"image height in pixels ({sized}); 0: the model's size")
    decoding, defaults = diffusion_decoders()
    group.add_argument("--decoder-steps", type=int, metavar="N",
                       help=f"diffusion decoders ({decoding}): the DiT's steps (default: the published pipeline's: "
                            f"{defaults})")
    group.add_argument("--decoder-guidance", type=float, metavar="SCALE",
                       help="diffusion decoders: the DiT's guidance scale, 1 for none (default: the pipeline's)")
    group.add_argument("--decoder-seed", type=int, metavar="SEED",
                       help="diffusion decoders: the seed of the DiT's starting noise (default 0)")
    group.add_argument("--offload-stages", action="store_true",
                       help=f"two-stage models ({decoding}): one stage on the device at a time, the sampling "
                            "stage moved to the CPU while the DiT decodes (the peak is the larger stage; each "
                            "decode moves both stages' weights twice)")


def decoder_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The --decoder-* values given, checked before any weight is read (the family refuses them after, if its
    decoder takes none)."""
    given = {name: getattr(args, f"decoder_{name}") for name in ("steps", "guidance", "seed")}
    given = {name: value for name, value in given.items() if value is not None}
    try:
        checked_settings(DecoderSettings(1, 1.0), **given)
    except ValueError as err:
        raise ValueError(str(err).replace("the decoder's ", "--decoder-")) from None
    return given


def add_sampler_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The sampler settings but the seed, which `generate` takes once and `batch` per image."""
    sampler = parser.add_argument_group("sampler (unset: the model's recommended values)")
    sampler.add_argument("--coupler", choices=COUPLERS, default=DEFAULTS.coupler,
                         help=f"how the next drafts are made: {couplers.help_text()}")
    sampler.add_argument("--window", type=_window, default=DEFAULTS.window,
                         help="positions decoded per model call; 1 is plain autoregressive sampling; "
                              f"{window_policies.help_text()} (with faithful the window changes the calls, never "
                              "the image)")
    for option in sampler_options.OPTIONS:
        sampler.add_argument(option.flag, dest=option.name, type=option.kind, help=f"{option.help} (default: the "
                             "model's)")
    sampler.add_argument("--draft-init", choices=DRAFT_INITS, default=DEFAULTS.draft_init,
                         help="initial draft of a position entering the window (default: the model's, "
                              "previous_frame for video, else above)")
    sampler.add_argument("--verification", choices=VERIFICATIONS, default=DEFAULTS.verification,
                         help="token: draft by draft; block: a joint rule over the window (independent coupler)")
    sampler.add_argument("--candidates", type=int, default=DEFAULTS.candidates,
                         help="candidates for the first draft of each call, each with a chain of the later drafts "
                              f"(1..8; 1 = just the draft); {couplers.candidates_refused(DEFAULTS.coupler)}")
    return sampler


def sampler_config(args: argparse.Namespace, seed: int) -> SamplerConfig:
    """The settings from the sampler arguments, with `seed`; a bad one is named by its option."""
    try:
        return SamplerConfig(coupler=args.coupler, window=args.window, seed=seed, draft_init=args.draft_init,
                             verification=args.verification, candidates=args.candidates,
                             **{option.name: getattr(args, option.name) for option in sampler_options.OPTIONS})
    except ValueError as err:
        raise ValueError(as_options(str(err))) from None


def as_options(message: str) -> str:
    """SamplerConfig's "top_p must be None or a number in (0, 1], got 1.5" as "--top-p must be a number in
    (0, 1], got 1.5"."""
    field, must, rest = message.partition(" must be ")
    if not must or field not in SAMPLER_OPTIONS:
        return message
    return f"{SAMPLER_OPTIONS[field]} must be {rest.removeprefix('None or ')}"


def check_device(name: Optional[str]) -> None:
    """Reject a device this machine lacks before the weights are read."""
    try:
        pick_device(name)
    except ValueError as err:
        raise ValueError(f"--{err}") from err


def check_image_size(width: int, height: int) -> None:
    if (width == 0) != (height == 0):
        raise ValueError(f"give both --width and --height, or neither (got {width} x {height})")


def open_model(path: str, device: Optional[str], dtype: Optional[str], quantize: str, width: int, height: int,
               compile: bool = False, decoding: Optional[dict[str, Any]] = None, offload_stages: bool = False) -> Any:
    """The model in `path` at `quantize` precision (compiled with `compile`), asked for width x height images
    (0 x 0: its own size), its diffusion decoder run with `decoding` (`decoder_settings`), apart from the sampling
    stage with `offload_stages` (`keep_stages_apart`)."""
    model = load_model(path, device=device, dtype=dtype, quantize=quantize, compile=compile)
    set_image_size(model, width, height)
    set_decoding(model, **(decoding or {}))
    if offload_stages:
        keep_stages_apart(model)
    return model


def to_pil(images: torch.Tensor, vertical: bool = False) -> Image.Image:
    """(batch, H, W, 3) floats in 0..1 as one RGB image, the batch side by side (or stacked)."""
    joined = torch.cat(list(images), dim=0 if vertical else 1)
    pixels = (joined.float().clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()
    return Image.fromarray(pixels, "RGB")
