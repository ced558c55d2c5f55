"""Chameleon's image tokenizer decoder (the VQGAN Lumina-mGPT 1 draws its image codes from).

A taming-style VQGAN (see `taming.py`): codebook 8192 x 256, channel multipliers
1, 1, 2, 2, 4 on 128 base channels, two residual blocks per level, attention in the
middle block only, GroupNorm(32), 16x downsampling; about 68.7M parameters.  The
published `vqgan.ckpt` is a {"state_dict": {...}} of plain tensors, read here with
`torch.load(weights_only=True)`; `vqgan.yaml` beside it restates the architecture,
which is read off the weights instead.
"""

from __future__ import annotations

from pathlib import Path

from ..weights.checkpoints import read_weights
from .taming import VQDecoder, load_decoder

CHECKPOINT = "vqgan.ckpt"


def load_chameleon_vqgan(path: Path) -> VQDecoder:
    """The decoder half of Chameleon's VQGAN from `vqgan.ckpt`; ModelLoadError naming the file if it does not fit."""
    return load_decoder(read_weights(Path(path)), spatial_norm=False, source=str(path))
