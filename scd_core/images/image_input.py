"""Images in the prompt: ComfyUI IMAGE tensors made ready for a family's VQ encoder.

A ComfyUI IMAGE is (B, H, W, 3) float in 0..1.  A tokenizer wants (B, 3, h, w) at its own pixel size, in its
own value range (every VQ here takes -1..1).  Each image is fitted as the family's authors fit theirs, with
their own tool: 8-bit RGB (a loaded picture's pixels, which a ComfyUI IMAGE holds divided by 255) resized by
Pillow, then scaled to the value range:
- "crop": halved with Pillow's box filter while both sides are at least twice the size, resized by Pillow's
  bicubic to cover it (sides rounded), the middle cut out: ADM's centre crop, which LlamaGen's
  `center_crop_arr` and Lumina-mGPT's `center_crop` are;
- "pad" (a square): the longer side resized to the square's (each side rounded down, at least PAD_MIN_SIDE px)
  by Pillow's bicubic and pasted in the middle of a `fill` square: Janus's `VLMImageProcessor`;
- "stretch": Pillow's bicubic straight to the size, aspect and all: Emu3.5's `smart_resize`.
An image already at the size is used as given (Pillow copies it; one finer than 8 bits is not rounded).

`encode_images(model, images)` is what callers use: the family's `encode_image`, or one clear error for a
family without an image encoder.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

LOG = logging.getLogger("scd_core")
FITS = ("crop", "pad", "stretch")
PAD_MIN_SIDE = 14  # Janus's VLMImageProcessor min_size: the shorter side of a padded image, at least


@dataclass(frozen=True)
class PreparedImages:
    """Pixels for an encoder and what was done to get them."""

    pixels: torch.Tensor  # (B, 3, height, width) float32 on the CPU, in the requested value range
    note: str  # "" when the images already had the size; else what was resized / cropped / padded


def check_images(images: Any) -> torch.Tensor:
    """A ComfyUI IMAGE, (B, H, W, 3) float in 0..1 (one image (H, W, 3) is taken as a batch of one), as float32;
    anything else is refused naming its shape or values."""
    if not isinstance(images, torch.Tensor):
        raise ValueError(f"images must be a ComfyUI IMAGE tensor (batch, height, width, 3), got "
                         f"{type(images).__name__}")
    if images.dim() == 3:
        images = images[None]
    if images.dim() != 4 or images.shape[-1] != 3 or min(images.shape[:3]) < 1:
        raise ValueError(f"images must be (batch, height, width, 3) RGB, got shape {tuple(images.shape)}")
    if not images.is_floating_point():
        raise ValueError(f"images must be float in 0..1 (a ComfyUI IMAGE), got {images.dtype}")
    images = images.detach().float().cpu()
    if not torch.isfinite(images).all() or images.min() < 0 or images.max() > 1:
        raise ValueError(f"image values must lie in 0..1 (a ComfyUI IMAGE), got {float(images.min()):g}.."
                         f"{float(images.max()):g}")
    return images


def fit_note(source: tuple[int, int], size: tuple[int, int], fit: str) -> str:
    """What fitting a `source` (height, width) image to `size` (height, width) does, for the user; "" when the
    sizes agree."""
    if tuple(source) == tuple(size):
        return ""
    (h, w), (th, tw) = source, size
    how = {"crop": "scaled to cover it and centre-cropped", "pad": "scaled to fit inside it and padded",
           "stretch": "stretched to it"}[fit]
    aspect = "" if h * tw == w * th else f" ({how})"
    return f"the {w} x {h} px image was resized to the model's {tw} x {th} px{aspect}"


def eight_bit(images: torch.Tensor) -> np.ndarray:
    """(B, H, W, 3) floats in 0..1 -> (B, H, W, 3) uint8: the picture a ComfyUI IMAGE was loaded from."""
    return (images.clamp(0, 1) * 255).round().to(torch.uint8).numpy()


def centre_crop(picture: Any, width: int, height: int) -> Any:
    """A PIL image cut to width x height as ADM's centre crop does (box-halved while both sides are at least
    twice the size, bicubic by the larger scale, sides rounded, the middle kept)."""
    from PIL import Image

    while picture.size[0] >= 2 * width and picture.size[1] >= 2 * height:
        picture = picture.resize((picture.size[0] // 2, picture.size[1] // 2), resample=Image.BOX)
    scale = max(width / picture.size[0], height / picture.size[1])
    picture = picture.resize(tuple(round(side * scale) for side in picture.size), resample=Image.BICUBIC)
    left, top = (picture.size[0] - width) // 2, (picture.size[1] - height) // 2
    return picture.crop((left, top, left + width, top + height))


def padded_square(picture: Any, side: int, fill: int) -> Any:
    """A PIL image scaled so its longer side is `side` (each side rounded down, at least PAD_MIN_SIDE) and
    centred on a `side` square of grey level `fill` (0..255), as Janus's processor pads."""
    from PIL import Image

    width, height = picture.size
    longest = max(width, height)
    inner = tuple(max(int(length / longest * side), PAD_MIN_SIDE) for length in (width, height))
    picture = picture.resize(inner, resample=Image.BICUBIC)
    if inner == (side, side):
        return picture
    canvas = Image.new("RGB", (side, side), (fill,) * 3)
    canvas.paste(picture, ((side - inner[0]) // 2, (side - inner[1]) // 2))
    return canvas


def _fitted(picture: Any, height: int, width: int, fit: str, fill: float) -> Any:
    from PIL import Image

    if fit == "crop":
        return centre_crop(picture, width, height)
    if fit == "pad":
        return padded_square(picture, width, int(round(fill * 255)))
    return picture.resize((width, height), resample=Image.BICUBIC)


def prepare_images(images: Any, size: tuple[int, int], fit: str = "crop",
                   value_range: tuple[float, float] = (-1.0, 1.0), fill: float = 0.5) -> PreparedImages:
    """ComfyUI IMAGE (B, H, W, 3) in 0..1 -> (B, 3, height, width) float32 pixels in `value_range`, fitted to
    `size` = (height, width) by `fit` (FITS; "pad" takes a square, its background `fill` in 0..1 rounded to 8
    bits), with a note when the size changed.  Values: the 8-bit level / 255 scaled to the range in float64,
    then float32 (so -1..1 is level / 127.5 - 1, as Emu3.5's authors compute it); an image finer than 8 bits
    at the size is scaled as it is, and one to resize is first rounded to 8 bits, as Pillow takes it."""
    from PIL import Image

    if fit not in FITS:
        raise ValueError(f"fit must be one of {', '.join(FITS)}, got {fit!r}")
    height, width = (int(side) for side in size)
    if height < 1 or width < 1:
        raise ValueError(f"size must be positive (height, width) pixels, got {tuple(size)}")
    if fit == "pad" and height != width:
        raise ValueError(f"fit 'pad' makes a square, got {width} x {height} px")
    images = check_images(images)
    levels = eight_bit(images)
    if tuple(images.shape[1:3]) == (height, width) and not torch.equal(torch.from_numpy(levels) / 255, images):
        unit = images.double()  # finer than 8 bits (not a loaded picture) and at the size: used as given
    else:
        unit = torch.from_numpy(np.stack([np.asarray(_fitted(Image.fromarray(image, "RGB"), height, width, fit,
                                                             fill)) for image in levels])).double() / 255
    low, high = value_range
    pixels = unit.permute(0, 3, 1, 2) * (high - low) + low
    return PreparedImages(pixels=pixels.float().contiguous(),
                          note=fit_note(tuple(images.shape[1:3]), (height, width), fit))


def log_note(prepared: PreparedImages) -> None:
    """Tell the user (the log, which ComfyUI's console shows) that the image was resized, if it was."""
    if prepared.note:
        LOG.warning("encode_image: %s", prepared.note)


def no_image_encoder(model: Any) -> ValueError:
    """The error for a model whose family cannot turn images into its tokens."""
    name = getattr(model, "family", None) or type(model).__name__
    return ValueError(f"this model ({name}) has no image encoder: its tokenizer only decodes, so it cannot take an "
                      "image in the prompt; use a family with one (demo/LlamaGen, Janus-Pro, Emu3, Lumina-mGPT)")


def encode_images(model: Any, images: Any) -> torch.Tensor:
    """`model.encode_image(images)`: (B, num_tokens) model ids of a ComfyUI IMAGE; a clear ValueError for a
    family without an image encoder."""
    encode = getattr(model, "encode_image", None)
    if encode is None:
        raise no_image_encoder(model)
    return encode(images)
