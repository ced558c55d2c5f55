"""The taming VQGAN decoder (`taming.Decoder` with GroupNorm: IBQ's, Chameleon's) run in tiles for large images,
with the whole decode's pixels up to float32 rounding.

Its receptive field is the whole image, twice over: the middle block and any level with attention attend over every
position, and every GroupNorm normalises each channel group with statistics of the whole map.  Tiles decoded on
their own (overlap and blend) would therefore differ everywhere, not only at the seams.  So here what sees the whole
image still does:
- the decoder up to its last level with attention (the middle block and, in IBQ, the coarsest level: at the code
  grid, 32 MiB for 128 x 128 codes of 512 channels) runs whole, as `Decoder.forward` runs it;
- after it, each convolution runs tile by tile over its whole input map, every tile read with the convolution's
  halo (one position for 3x3; zeros past the map's edge, as its padding) and nearest-neighbour upsampled where the
  layer upsamples, so each output position sees exactly the inputs it sees in the whole decode;
- each GroupNorm uses its whole map's statistics, summed in float64 over the tiles of the layer that wrote the map;
- between layers the full maps wait on `store` (the CPU): the compute device holds one tile's activations at a
  time, and the host at most two full maps of the finest level (a residual block writes its sum into its input).
What still differs from the whole decode is float32 rounding: the norms' statistics are summed in another order,
and the convolutions run at tile shapes (tests/test_ibq_tiles.py measures it).
"""

from __future__ import annotations

from typing import Callable, Iterator, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .taming import NORM_GROUPS, Decoder, ResnetBlock, VQDecoder

PerPosition = Callable[[torch.Tensor], torch.Tensor]
# a tile's residual term, given the rows and columns of the tile (on the compute device)
Residual = Callable[[slice, slice], torch.Tensor]


class GroupStats:
    """Per (image, channel group) sums of a map written tile by tile, for the GroupNorm that reads it next."""

    def __init__(self, groups: int = NORM_GROUPS) -> None:
        self.groups, self.count = groups, 0
        self.sums: Optional[torch.Tensor] = None

    def add(self, tile: torch.Tensor) -> None:
        flat = tile.reshape(tile.shape[0], self.groups, -1).double()
        part = torch.stack((flat.sum(-1), flat.square().sum(-1)))
        self.sums = part if self.sums is None else self.sums + part
        self.count += flat.shape[-1]

    def norm_silu(self, norm: nn.GroupNorm) -> PerPosition:
        """swish(norm(x)) for any tile x of the map, `norm` normalising with the whole map's statistics."""
        assert self.sums is not None and norm.num_groups == self.groups
        mean = self.sums[0] / self.count
        rstd = ((self.sums[1] / self.count - mean.square()).clamp_min(0) + norm.eps).rsqrt()

        def apply(x: torch.Tensor) -> torch.Tensor:
            b, c = x.shape[:2]
            grouped = x.reshape(b, self.groups, c // self.groups, -1)
            shift, scale = (value.to(x)[:, :, None, None] for value in (mean, rstd))
            y = ((grouped - shift) * scale).view_as(x)
            return F.silu(y * norm.weight[:, None, None] + norm.bias[:, None, None])

        return apply


def tiles(height: int, width: int, side: int) -> Iterator[tuple[slice, slice]]:
    """Rows and columns of each tile of a height x width map, row-major, `side` positions a side (less at the end)."""
    for top in range(0, height, side):
        for left in range(0, width, side):
            yield slice(top, min(top + side, height)), slice(left, min(left + side, width))


def window(source: torch.Tensor, rows: slice, cols: slice, halo: int, scale: int, pre: PerPosition,
           device: torch.device) -> torch.Tensor:
    """What a convolution reads for the tile `rows` x `cols` of its output: `source` nearest-upsampled by `scale`,
    those rows and columns and `halo` more on each side, `pre` applied, zeros past the map's edges."""
    height, width = source.shape[2] * scale, source.shape[3] * scale
    top, bottom, left, right = rows.start - halo, rows.stop + halo, cols.start - halo, cols.stop + halo
    inside = (max(top, 0), min(bottom, height), max(left, 0), min(right, width))
    # the source positions those cover; nearest upsampling by 2 takes output i from input i // 2
    first_row, last_row = inside[0] // scale, (inside[1] - 1) // scale
    first_col, last_col = inside[2] // scale, (inside[3] - 1) // scale
    part = source[:, :, first_row:last_row + 1, first_col:last_col + 1]
    part = pre(part.to(device))
    if scale != 1:
        part = F.interpolate(part, scale_factor=float(scale), mode="nearest")
        part = part[:, :, inside[0] % scale:, inside[2] % scale:][:, :, :inside[1] - inside[0], :inside[3] - inside[2]]
    return F.pad(part, (inside[2] - left, right - inside[3], inside[0] - top, bottom - inside[1]))


def conv_tiles(source: torch.Tensor, conv: nn.Conv2d, tile: int, image_height: int, *,
               pre: PerPosition = nn.Identity(), scale: int = 1, residual: Optional[Residual] = None,
               out: Optional[torch.Tensor] = None, groups: Optional[int] = NORM_GROUPS
               ) -> tuple[torch.Tensor, Optional[GroupStats]]:
    """conv(pre(source) upsampled by `scale`) [+ residual] written tile by tile into `out` (a new map beside
    `source` by default), and the output's GroupNorm statistics (`groups` None: none). Each tile covers `tile`
    pixels a side of the final image (`image_height` high), so fewer positions at the coarser levels."""
    batch, height, width = source.shape[0], source.shape[2] * scale, source.shape[3] * scale
    if out is None:
        out = source.new_empty(batch, conv.out_channels, height, width)
    stats = GroupStats(groups) if groups else None
    side = max(1, tile * height // image_height)
    for rows, cols in tiles(height, width, side):
        y = F.conv2d(window(source, rows, cols, conv.padding[0], scale, pre, conv.weight.device), conv.weight,
                     conv.bias)
        if residual is not None:
            y = y + residual(rows, cols)
        if stats is not None:
            stats.add(y)
        out[:, :, rows, cols] = y.to(out.device)
    return out, stats


def block_tiles(block: ResnetBlock, x: torch.Tensor, stats: GroupStats, tile: int, image_height: int
                ) -> tuple[torch.Tensor, GroupStats]:
    """A residual block over the map x (with its statistics), tile by tile; where its width does not change, the
    sum is written into x (each tile reads its own part of x alone, just before writing it)."""
    device = block.conv1.weight.device
    h, h_stats = conv_tiles(x, block.conv1, tile, image_height, pre=stats.norm_silu(block.norm1))
    shortcut = getattr(block, "nin_shortcut", nn.Identity())
    out, out_stats = conv_tiles(h, block.conv2, tile, image_height, pre=h_stats.norm_silu(block.norm2),
                                residual=lambda rows, cols: shortcut(x[:, :, rows, cols].to(device)),
                                out=None if hasattr(block, "nin_shortcut") else x)
    return out, out_stats


def whole_levels(decoder: Decoder) -> list[int]:
    """The levels run whole, coarsest first: up to the last one with attention.  A level without attention
    before one with it would have to run whole as well: refused, no published decoder has one."""
    levels = list(reversed(range(len(decoder.up))))
    with_attention = [i for i, level in enumerate(levels) if len(decoder.up[level].attn)]
    if with_attention and with_attention != list(range(len(with_attention))):
        raise ValueError("this decoder has attention at a finer level than one without it: decode it whole "
                         "(a tile size of at least the image's)")
    return levels[:len(with_attention)]


def decode_tiles(vq: VQDecoder, codes: torch.Tensor, rows: int, cols: int, tile: int,
                 store: torch.device = torch.device("cpu")) -> torch.Tensor:
    """`vq.decode(codes, rows, cols)` with the layers after the last attention in tiles of `tile` pixels a side,
    returned on `store`."""
    if vq.spec.spatial_norm:
        raise ValueError("tiled decoding takes a GroupNorm decoder (IBQ, Chameleon's VQGAN), not MoVQ's spatial "
                         "norms; decode it whole")
    decoder, image_height = vq.decoder, rows * vq.spec.downsample
    whole = whole_levels(decoder)
    h = decoder.middle(vq.latent(codes, rows, cols)[0], None)
    for level in whole:
        h = decoder.stage(level, h, None)
    stats = GroupStats()
    stats.add(h)
    h = h.to(store)
    for level in reversed(range(len(decoder.up) - len(whole))):
        stage = decoder.up[level]
        for block in stage.block:
            h, stats = block_tiles(block, h, stats, tile, image_height)
        if level != 0:
            h, stats = conv_tiles(h, stage.upsample.conv, tile, image_height, scale=2)
    return conv_tiles(h, decoder.conv_out, tile, image_height, pre=stats.norm_silu(decoder.norm_out), groups=None)[0]
