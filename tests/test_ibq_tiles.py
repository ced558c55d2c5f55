"""Tiled decoding of the taming VQGAN decoder (IBQ's, Emu3.5's): the whole decode's pixels up to float32 rounding,
with less memory, and the decode setting Emu3.5 exposes (`tile_size`)."""

from __future__ import annotations

import weakref
from pathlib import Path

import pytest
import torch
from emu3p5_fixture import tiny_emu3p5_dir  # noqa: F401  (fixture, one checkpoint per session)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from scd_core import load_model
from scd_core.models.families import emu3p5
from scd_core.models.tokenizers.taming import DecoderSpec, VQDecoder
from scd_core.models.tokenizers.taming_tiles import decode_tiles

CODES, LEVELS, WIDTH = 64, 5, 32
# float32 rounding only: the norms' statistics summed in another order, the convolutions at tile shapes
SEAM_TOLERANCE = 2e-4  # on the decoder's -1..1 scale: 0.03 of an 8-bit level; 7e-5 measured at 256 x 256 px


class PeakTensorMemory(TorchDispatchMode):
    """The most bytes of tensor storage alive at once among the tensors torch ops create under it."""

    def __init__(self) -> None:
        super().__init__()
        self.users: dict[int, int] = {}
        self.current = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self.track(tensor)
        return out

    def track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if not key:
            return
        if key not in self.users:
            self.users[key] = 0
            self.current += size
            self.peak = max(self.peak, self.current)
        self.users[key] += 1
        weakref.finalize(tensor, self.release, key, size)

    def release(self, key: int, size: int) -> None:
        self.users[key] -= 1
        if not self.users[key]:
            del self.users[key]
            self.current -= size


def tiny_decoder(attn_levels: frozenset[int] = frozenset(), spatial_norm: bool = False, seed: int = 0) -> VQDecoder:
    torch.manual_seed(seed)
    decoder = VQDecoder(DecoderSpec(codebook_size=CODES, embed_dim=4, z_channels=4, widths=(WIDTH,) * LEVELS,
                                    num_res_blocks=1, attn_levels=attn_levels, spatial_norm=spatial_norm))
    with torch.no_grad():  # random norms' affine terms: a tile that used its own statistics would show
        for module in decoder.modules():
            if isinstance(module, torch.nn.GroupNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
    return decoder.eval()


def random_codes(batch: int, rows: int, cols: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(CODES, (batch, rows * cols), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("attn_levels", [frozenset(), frozenset({LEVELS - 1})], ids=["mid-attention", "coarse-too"])
@pytest.mark.parametrize("rows, cols, tile", [(8, 12, 64), (9, 7, 40), (6, 6, 16)])
@torch.no_grad()
def test_tiles_give_the_whole_decodes_pixels(attn_levels: frozenset[int], rows: int, cols: int, tile: int) -> None:
    decoder = tiny_decoder(attn_levels)
    codes = random_codes(2, rows, cols)
    whole = decoder.decode(codes, rows, cols)
    tiled = decode_tiles(decoder, codes, rows, cols, tile)
    assert tiled.shape == whole.shape == (2, 3, rows * 16, cols * 16)
    assert (tiled - whole).abs().max().item() <= SEAM_TOLERANCE
    assert whole.abs().max().item() > 0.1  # a decode that reads its inputs, not one that is near zero everywhere


@torch.no_grad()
def test_tiles_hold_less_memory_than_the_whole_decode() -> None:
    decoder, rows = tiny_decoder(), 16
    codes = random_codes(1, rows, rows)
    peaks = []
    for run in (lambda: decoder.decode(codes, rows, rows), lambda: decode_tiles(decoder, codes, rows, rows, 64)):
        with PeakTensorMemory() as meter:
            run()
        peaks.append(meter.peak)
    full_map = WIDTH * (rows * 16) ** 2 * 4  # one float32 map of the finest level
    # the whole decode holds several finest maps at once (input, norm, swish, convolution, sum); tiles hold the
    # block's input and its first convolution's output, plus one tile's work
    assert peaks[0] >= 4 * full_map
    assert peaks[1] <= 2.5 * full_map < peaks[0] / 1.5


def test_spatial_norm_and_fine_attention_are_refused() -> None:
    codes = random_codes(1, 4, 4)
    with pytest.raises(ValueError, match="GroupNorm decoder"):
        decode_tiles(tiny_decoder(spatial_norm=True), codes, 4, 4, 16)
    with pytest.raises(ValueError, match="attention at a finer level"):
        decode_tiles(tiny_decoder(frozenset({1})), codes, 4, 4, 16)


def test_decoding_tile_by_size() -> None:
    assert emu3p5.decoding_tile(64, 64) is None  # 1024 x 1024 px, the default: whole
    assert emu3p5.decoding_tile(80, 48) is None
    assert emu3p5.decoding_tile(99, 99) == emu3p5.DEFAULT_TILE  # the largest size the model writes itself
    assert emu3p5.decoding_tile(128, 128) == emu3p5.DEFAULT_TILE
    assert emu3p5.decoding_tile(65, 64) == emu3p5.DEFAULT_TILE
    assert emu3p5.decoding_tile(128, 128, 256) == 256
    assert emu3p5.decoding_tile(8, 8, 128) is None  # one tile covers the image
    for bad in (-1, 8, True, 2.5, "512"):
        with pytest.raises(ValueError, match="tile_size must be 0"):
            emu3p5.decoding_tile(8, 8, bad)


@torch.no_grad()
def test_emu3p5_decode_in_tiles(tiny_emu3p5_dir: Path) -> None:
    model = load_model(tiny_emu3p5_dir, device="cpu", dtype=torch.float32)
    model._set_grid(5, 7)
    tokens = model.code_ids[random_codes(2, 5, 8)]  # each row and its row-end cell, dropped by decode
    whole = model.decode(tokens)
    tiled = model.decode(tokens, tile_size=32)
    assert tiled.shape == whole.shape == (2, 80, 112, 3)
    assert (tiled - whole).abs().max().item() <= SEAM_TOLERANCE / 2
