"""A family's VQ encoder side, read from its checkpoint files on the first `encode_image`, never at load.

Generation only decodes, so loading leaves the encoder out (`generation_only`).  An image in the prompt needs
it: `LazyImageEncoder` builds it on first use at the VQ's dtype, unquantised (as the decoder), and keeps it in
CPU memory between encodes; each encode moves it to the model's compute device for that call only, so a model
ComfyUI streams or quantises encodes as well and no hidden copy stays on the GPU.  What it adds is logged when
it loads and given beforehand by `note()` (from the files' headers, nothing read).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ..weights.generation_only import drop_modules
from ..weights.memory import checkpoint_shapes
from ..weights.quantize import bytes_per_weight
from ..weights.streaming import fill_from_safetensors, parameters_on_meta
from ...images.image_input import log_note, prepare_images

LOG = logging.getLogger("scd_core")


class LazyImageEncoder:
    """Turns ComfyUI images into VQ codes (batch, rows, cols) with an encoder loaded on first use.

    `build(dtype)` returns the encoder as a module whose forward takes pixels (batch, 3, height, width) in the
    VQ's value range (-1..1) at `dtype` and returns the codes; `stored` are the name prefixes of the tensors it
    reads from `files` (for `note`).  Images are fitted by `fit` / `fill` (`image_input.prepare_images`).  `part`
    names it in messages (another image tower than a VQ encoder, e.g. Janus's understanding encoder)."""

    def __init__(self, label: str, files: Sequence[Path], stored: tuple[str, ...],
                 build: Callable[[torch.dtype], nn.Module], dtype: torch.dtype, fit: str = "crop",
                 fill: float = 0.5, part: str = "VQ encoder") -> None:
        self.label, self.files, self.stored, self.part = label, [Path(f) for f in files], stored, part
        self._build, self.dtype, self.fit, self.fill = build, dtype, fit, fill
        self.module: nn.Module | None = None  # None until the first encode

    def weight_count(self) -> int:
        """Parameters the encoder loads, from the files' headers."""
        shapes = checkpoint_shapes(self.files)
        return sum(math.prod(shape) for name, shape in shapes.items() if name.startswith(self.stored))

    def note(self) -> str:
        """What the first image in the prompt will add in memory."""
        return (f"{self.label}'s {self.part} loads on the first image given to the prompt "
                f"(+{_mib(self.weight_count() * bytes_per_weight('none', self.dtype))} MiB of CPU memory, "
                "moved to the compute device while it encodes)")

    def load(self) -> nn.Module:
        """The encoder, built on the first call."""
        if self.module is None:
            module = self._build(self.dtype).eval().requires_grad_(False)
            size = sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))
            LOG.info("loaded %s's %s for an image in the prompt: %s MiB (%s), kept in CPU memory",
                     self.label, self.part, _mib(size), str(self.dtype).removeprefix("torch."))
            self.module = module
        return self.module

    @torch.no_grad()
    def codes(self, images: Any, size: tuple[int, int], device: torch.device) -> torch.Tensor:
        """ComfyUI IMAGE (B, H, W, 3) in 0..1, fitted to `size` (height, width) pixels (the resize logged) ->
        the encoder's codes on the CPU, computed on `device`."""
        prepared = prepare_images(images, size, self.fit, fill=self.fill)
        log_note(prepared)
        module = self.load()
        module.to(device)
        try:
            return module(prepared.pixels.to(device, self.dtype)).cpu()
        finally:
            module.to("cpu")


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f}"


def hf_vq_encoder(vq_class: type, vq_config: Any, files: Sequence[Path], renames: tuple[tuple[str, str], ...],
                  dtype: torch.dtype, hint: str) -> nn.Module:
    """A transformers VQ-VAE (`vq_class(vq_config)`) without its decoder side, its encoder, quant_conv and
    codebook filled from the safetensors `files`, whose names reach the VQ's own through `renames`."""
    with parameters_on_meta():
        vq = vq_class(vq_config)
    drop_modules(vq, "decoder", "post_quant_conv")
    fill_from_safetensors(vq, list(files), "", "none", dtype, hint, renames)
    return vq
