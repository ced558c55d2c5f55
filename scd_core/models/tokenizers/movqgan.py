"""MoVQGAN-270M's decoder: the image tokenizer of Lumina-mGPT 2.0.

The taming decoder structure (see `taming.py`) with every GroupNorm replaced by
MoVQ's spatial norm, whose scale and shift are 1x1 convolutions of the quantised
latent resized to the feature map.  270M: codebook 16384 x 4, 4 latent channels,
channel multipliers 1, 2, 2, 4 on 256 base channels, two residual blocks per level,
attention at the coarsest level and in the middle block, 8x downsampling.  The
published `movqgan_270M.ckpt` is a flat tensor dict (read with
`torch.load(weights_only=True)`).  The upstream code loads it non-strictly; here
every decoder weight must be present with its shape, and entries the decoder does
not use are set aside with a warning that names them.  Lumina-mGPT 2.0's authors
decode in float32, and so does `lumina.py`, whatever the model's dtype.
"""

from __future__ import annotations

from pathlib import Path

from ..weights.checkpoints import read_weights
from .taming import VQDecoder, load_decoder

CHECKPOINT = "movqgan_270M.ckpt"


def load_movqgan(path: Path) -> VQDecoder:
    """The MoVQGAN decoder from `movqgan_270M.ckpt`; ModelLoadError naming the file if it does not fit."""
    return load_decoder(read_weights(Path(path)), spatial_norm=True, source=str(path))
