"""An image in the prompt, as the SCD Image Prompt node adds one to a conditioning.

Two kinds:
- "continue" (every family with `encode_image`): the image's tokens at the conditioning's size become given cells
  (`GivenCells`): the top rows kept and the rest sampled, or, with a mask, the cells outside it kept.  A raster
  model samples each cell from what lies above and to its left only, so a masked region is regenerated from
  what precedes it, never inpainted from what surrounds it; kept cells cost no model calls.
- a task of the family (`model.image_tasks`, e.g. Lumina-mGPT 2.0-Omni's depth control, Janus-4o's edit):
  `model.add_image`.

What fitting the image to the model did (resized, cropped) comes back as a note for the user.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn.functional as F

from ..decoding.given import GivenCells, continuation, from_cell_mask
from .image_input import check_images, no_image_encoder, prepare_images

CONTINUE = "continue"
MASKED = 0.5  # a mask pixel at or above this is masked (ComfyUI's masks are 0..1; soft edges count from half)


@dataclass(frozen=True)
class ImagePrompt:
    cond: Any  # what the sampler takes: a GivenCells, or the family's conditioning with the image in it
    note: str  # what was kept and how the image was fitted, for the user


def image_tasks(model: Any) -> tuple[str, ...]:
    """The tasks `model` takes an image for besides "continue" (its family's `image_tasks`; none for most)."""
    return tuple(getattr(model, "image_tasks", ()) or ())


def add_image(model: Any, cond: Any, images: Any, task: str = CONTINUE, keep_top: float = 0.5,
              mask: Optional[torch.Tensor] = None, image_cfg: Optional[float] = None) -> ImagePrompt:
    """`cond` with `images` (ComfyUI IMAGE (B, H, W, 3) in 0..1) in its prompt for `task`.

    "continue": keep the top `keep_top` share of the image's token rows (rounded to whole rows) and sample the
    rest, or, with `mask` (B or 1, H, W) in 0..1 the image's size, regenerate every cell with a pixel masked
    (>= MASKED) and keep the others.  Another task: the family's `add_image` (no mask), with `image_cfg` where
    the family guides on the image apart from the text (Janus-4o's edit; None: the model's weight)."""
    if isinstance(cond, GivenCells):
        raise ValueError("this conditioning already holds an image (an SCD Image Prompt before this one): give "
                         "each conditioning one image; connect SCD Prompt Encode's output here")
    if task != CONTINUE:
        return _task(model, cond, images, task, mask, image_cfg)
    if image_cfg is not None:
        raise ValueError(f"image_cfg weighs the source image of an edit (Janus-4o); task {CONTINUE!r} keeps the "
                         "image's tokens instead: leave image_cfg at the model's value (-1 on the node)")
    encode = getattr(model, "encode_image", None)
    if encode is None:
        raise no_image_encoder(model)
    images = check_images(images)
    if mask is not None:
        mask = _checked_mask(mask, images)
    elif not 0.0 <= keep_top <= 1.0:
        raise ValueError(f"keep_top must be a share of the image's rows in 0..1, got {keep_top}")
    model.start(cond, 1)  # the size the conditioning was encoded for becomes the model's (Emu3, Lumina-mGPT)
    tokens, notes = _noted(encode, images)
    if tokens.shape[1] != model.num_tokens:
        raise ValueError(f"encode_image gave {tokens.shape[1]} tokens a row where the model generates "
                         f"{model.num_tokens} at the conditioning's size")
    grid = tuple(model.grid)
    rows, cols = grid[0], _image_cols(model)
    if mask is None:
        rows_kept = round(keep_top * rows)
        keep = continuation(tokens, rows_kept, grid)
        kept = f"kept the top {rows_kept} of {rows} token rows, sampling the {rows - rows_kept} below"
    else:
        regenerate = regenerated_cells(fitted_mask(model, mask, rows, cols), rows, cols)
        keep = from_cell_mask(tokens, regenerate, grid)
        per_image = int(regenerate.flatten(1).sum(1).max())
        kept = f"regenerating {per_image} of {rows * cols} cells ({rows} x {cols}), keeping the others"
    return ImagePrompt(GivenCells(cond, tokens, keep), "; ".join([kept, *notes]))


def regenerated_cells(mask: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """A mask (B, H, W) in 0..1 -> (B, rows, cols) bool: True where any pixel of the cell is masked."""
    masked = (mask >= MASKED).float()[:, None]
    return F.adaptive_max_pool2d(masked, (rows, cols))[:, 0] > 0


def _task(model: Any, cond: Any, images: Any, task: str, mask: Optional[torch.Tensor],
          image_cfg: Optional[float]) -> ImagePrompt:
    add = getattr(model, "add_image", None)
    if add is None:
        name = getattr(model, "family", None) or type(model).__name__
        raise ValueError(f"this model ({name}) takes no image task such as {task!r}: use task {CONTINUE!r} to keep "
                         "part of an image and sample the rest (Lumina-mGPT 2.0-Omni takes depth, canny, subject; "
                         "Janus-4o and GLM-Image take edit, Emu3.5 x2i)")
    if mask is not None:
        raise ValueError(f"a mask is for task {CONTINUE!r} (regenerating the masked cells); task {task!r} takes "
                         "the whole image: disconnect the mask")
    guides = "image_cfg" in inspect.signature(add).parameters
    if image_cfg is not None and not guides:
        raise ValueError(f"image_cfg weighs the source image where a model guides on it apart from the text "
                         f"(Janus-4o's edit); task {task!r} of this model does not: leave image_cfg at the model's "
                         "value (-1 on the node)")
    cond, notes = _noted(add, cond, images, task, *([image_cfg] if guides else []))
    return ImagePrompt(cond, "; ".join([f"image added for {task}", *notes]))


def _checked_mask(mask: Any, images: torch.Tensor) -> torch.Tensor:
    """A ComfyUI MASK (B, H, W) (or (H, W)) of the images' size, in 0..1, as float32 on the CPU."""
    if not isinstance(mask, torch.Tensor) or mask.dim() not in (2, 3) or not mask.is_floating_point():
        raise ValueError(f"mask must be a ComfyUI MASK (batch, height, width) in 0..1, got "
                         f"{tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__}")
    mask = (mask[None] if mask.dim() == 2 else mask).detach().float().cpu()
    (mask_h, mask_w), (h, w) = mask.shape[1:], images.shape[1:3]
    if (mask_h, mask_w) != (h, w):
        raise ValueError(f"the mask is {mask_w} x {mask_h} px but the image is {w} x {h} px: give a mask of the "
                         "image's size (e.g. from the same Load Image)")
    if mask.shape[0] not in (1, images.shape[0]):
        raise ValueError(f"the mask batch holds {mask.shape[0]} masks for {images.shape[0]} images: give 1 or "
                         f"{images.shape[0]}")
    return mask


def _image_cols(model: Any) -> int:
    """The grid's columns of image cells: without a row-end column the model forces at every row's end."""
    rows, cols = model.grid[0], model.grid[-1]
    forced = getattr(model, "forced_tokens", None) or {}
    row_ends = cols > 1 and all(row * cols + cols - 1 in forced for row in range(rows))
    return cols - 1 if row_ends else cols


def fitted_mask(model: Any, mask: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """A mask (B, H, W) of the image's size, fitted to the grid's aspect as the model's encoder fits the image
    (`image_encoder.fit`: centre-cropped, or scaled inside and padded, the padding never masked), at about the
    mask's own pixels per cell: (B, rows * k, cols * k)."""
    fit = getattr(getattr(model, "image_encoder", None), "fit", "crop")
    per_cell = max(1, min(mask.shape[1] // rows, mask.shape[2] // cols))
    as_image = mask.unsqueeze(-1).expand(-1, -1, -1, 3)
    fitted = prepare_images(as_image, (rows * per_cell, cols * per_cell), fit, value_range=(0.0, 1.0), fill=0.0)
    return fitted.pixels[:, 0]


@contextmanager
def _captured(notes: list[str]) -> Iterator[None]:
    """Collect what scd_core logs or warns while an image is fitted (the resize notes), still logging it."""
    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            notes.append(record.getMessage().removeprefix("encode_image: "))

    logger, handler = logging.getLogger("scd_core"), Keep(logging.WARNING)
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        logger.removeHandler(handler)
    for warning in caught:  # shown on the node now, so logged rather than warned once and then silenced
        notes.append(str(warning.message))
        logger.warning("%s", warning.message)


def _noted(call: Callable[..., Any], *args: Any) -> tuple[Any, list[str]]:
    notes: list[str] = []
    with _captured(notes):
        result = call(*args)
    return result, list(dict.fromkeys(notes))
