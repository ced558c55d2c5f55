"""Images in the prompt: ComfyUI IMAGE tensors made ready for a family's VQ encoder.

A ComfyUI IMAGE is (B, H, W, 3) float in 0..1.  A tokenizer wants (B, 3, h, w) at its own pixel size, in its
own value range (every VQ here takes -1..1).  An image of another size is fitted as the family's authors fit
theirs: "crop" scales it to cover the size and cuts the middle out (LlamaGen's centre crop; Emu3 after its
resize to a multiple of 8 px), "pad" scales it to fit inside and pads the rest with a fill colour (Janus's
square padding in grey).  Resampling is bicubic with antialiasing, as PIL's, clamped back to 0..1 as PIL's 8-bit
result is; an image already at the size is used as given.

`encode_images(model, images)` is what callers use: the family's `encode_image`, or one clear error for a
family without an image encoder.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

LOG = logging.getLogger("scd_core")
FITS = ("crop", "pad")


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
    how = {"crop": "scaled to cover it and centre-cropped", "pad": "scaled to fit inside it and padded"}[fit]
    aspect = "" if h * tw == w * th else f" ({how})"
    return f"the {w} x {h} px image was resized to the model's {tw} x {th} px{aspect}"


def _resized(pixels: torch.Tensor, height: int, width: int) -> torch.Tensor:
    if tuple(pixels.shape[-2:]) == (height, width):
        return pixels
    return F.interpolate(pixels, size=(height, width), mode="bicubic", align_corners=False,
                         antialias=True).clamp(0, 1)


def _centre_crop(pixels: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The middle of `pixels` (B, 3, H, W) at the aspect of height x width, as large as it fits."""
    h, w = pixels.shape[-2:]
    if h * width > w * height:  # taller than the target aspect: cut rows
        keep_h, keep_w = max(1, round(w * height / width)), w
    else:
        keep_h, keep_w = h, max(1, round(h * width / height))
    top, left = (h - keep_h) // 2, (w - keep_w) // 2
    return pixels[..., top:top + keep_h, left:left + keep_w]


def _padded(pixels: torch.Tensor, height: int, width: int, fill: float) -> torch.Tensor:
    """`pixels` scaled to fit inside height x width (each side rounded down, as Janus's processor does) and
    centred on a `fill` background."""
    h, w = pixels.shape[-2:]
    scale = min(height / h, width / w)
    inner_h, inner_w = max(1, min(height, int(h * scale))), max(1, min(width, int(w * scale)))
    inner = _resized(pixels, inner_h, inner_w)
    canvas = torch.full((*pixels.shape[:2], height, width), float(fill))
    top, left = (height - inner_h) // 2, (width - inner_w) // 2
    canvas[..., top:top + inner_h, left:left + inner_w] = inner
    return canvas


def prepare_images(images: Any, size: tuple[int, int], fit: str = "crop",
                   value_range: tuple[float, float] = (-1.0, 1.0), fill: float = 0.5) -> PreparedImages:
    """ComfyUI IMAGE (B, H, W, 3) in 0..1 -> (B, 3, height, width) float32 pixels in `value_range`, fitted to
    `size` = (height, width) by `fit` ("crop" or "pad", whose background is `fill` in 0..1 units), with a note
    when the size changed."""
    if fit not in FITS:
        raise ValueError(f"fit must be one of {', '.join(FITS)}, got {fit!r}")
    height, width = (int(side) for side in size)
    if height < 1 or width < 1:
        raise ValueError(f"size must be positive (height, width) pixels, got {tuple(size)}")
    images = check_images(images)
    pixels = images.permute(0, 3, 1, 2)
    if fit == "crop":
        fitted = _resized(_centre_crop(pixels, height, width), height, width)
    else:
        fitted = _padded(pixels, height, width, fill) if tuple(pixels.shape[-2:]) != (height, width) else pixels
    low, high = value_range
    scaled = fitted * (high - low) + low
    return PreparedImages(pixels=scaled.contiguous(), note=fit_note(tuple(images.shape[1:3]), (height, width), fit))


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
