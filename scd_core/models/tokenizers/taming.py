"""The taming-transformers VQGAN decoder that Chameleon's VQGAN and MoVQGAN share, written from its published structure.

Codes -> codebook vectors -> `post_quant_conv` -> decoder: `conv_in`, a middle
block (residual, attention, residual), one `up.<level>` stage per resolution
level (residual blocks, attention where the level has it, nearest-neighbour
upsampling except at level 0), `norm_out`, swish, `conv_out`.  The two image
tokenizers differ only in their normalisation layers: plain GroupNorm
(Chameleon) or MoVQ's "spatial norm", whose scale and shift are predicted from
the quantised latent.  Parameter names follow the original checkpoints, and the
architecture is read off the weights, so a checkpoint either fills the whole decoder
or is refused with the keys that do not fit; entries it does not use are set aside,
named in a warning.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..weights.checkpoints import ModelLoadError
from .vq16 import Upsample

NORM_GROUPS = 32  # not stored in the checkpoints; 32 in every published VQGAN of this design
# Set aside on purpose: the encoder side (generation only decodes) and training-only loss modules.
UNUSED_PREFIXES = ("encoder.", "quant_conv.", "loss.")


@dataclass(frozen=True)
class DecoderSpec:
    """What a checkpoint says about its decoder; `widths[level]` is the output width of `up.<level>`."""

    codebook_size: int
    embed_dim: int
    z_channels: int
    widths: tuple[int, ...]
    num_res_blocks: int
    attn_levels: frozenset[int]
    spatial_norm: bool       # MoVQ: norms conditioned on the quantised latent
    norm_conv: bool = False  # MoVQ's optional 3x3 conv on the latent inside each spatial norm

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.widths) - 1)


class GroupNorm(nn.GroupNorm):
    """GroupNorm with the spatial norm's call signature; the latent is not used."""

    def forward(self, x: torch.Tensor, zq: Optional[torch.Tensor] = None) -> torch.Tensor:
        return super().forward(x)


class SpatialNorm(nn.Module):
    """MoVQ's norm: GroupNorm(x) * conv_y(zq) + conv_b(zq), zq resized to x by nearest neighbour."""

    def __init__(self, channels: int, zq_channels: int, with_conv: bool):
        super().__init__()
        self.norm_layer = nn.GroupNorm(NORM_GROUPS, channels, eps=1e-6)
        if with_conv:
            self.conv = nn.Conv2d(zq_channels, zq_channels, 3, padding=1)
        self.conv_y = nn.Conv2d(zq_channels, channels, 1)
        self.conv_b = nn.Conv2d(zq_channels, channels, 1)

    def forward(self, x: torch.Tensor, zq: Optional[torch.Tensor] = None) -> torch.Tensor:
        zq = F.interpolate(zq, size=x.shape[-2:], mode="nearest")
        if hasattr(self, "conv"):
            zq = self.conv(zq)
        return self.norm_layer(x) * self.conv_y(zq) + self.conv_b(zq)


MakeNorm = Callable[[int], nn.Module]


class ResnetBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, make_norm: MakeNorm):
        super().__init__()
        self.norm1 = make_norm(in_ch)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.norm2 = make_norm(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        if in_ch != out_ch:
            self.nin_shortcut = nn.Conv2d(in_ch, out_ch, 1)

    def forward(self, x: torch.Tensor, zq: Optional[torch.Tensor]) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x, zq)))
        h = self.conv2(F.silu(self.norm2(h, zq)))
        shortcut = self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x
        return shortcut + h


class AttnBlock(nn.Module):
    """Single-head self-attention over all pixels (1x1 conv projections)."""

    def __init__(self, channels: int, make_norm: MakeNorm):
        super().__init__()
        self.norm = make_norm(channels)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor, zq: Optional[torch.Tensor]) -> torch.Tensor:
        b, c, h, w = x.shape
        y = self.norm(x, zq)
        q, k, v = (proj(y).flatten(2).transpose(1, 2) for proj in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v)
        return x + self.proj_out(out.transpose(1, 2).reshape(b, c, h, w))


class Decoder(nn.Module):
    def __init__(self, spec: DecoderSpec):
        super().__init__()
        if spec.spatial_norm:
            def make_norm(channels: int) -> nn.Module:
                return SpatialNorm(channels, spec.embed_dim, spec.norm_conv)
        else:
            def make_norm(channels: int) -> nn.Module:
                return GroupNorm(NORM_GROUPS, channels, eps=1e-6)
        block_in = spec.widths[-1]
        self.conv_in = nn.Conv2d(spec.z_channels, block_in, 3, padding=1)
        self.mid = nn.Module()
        self.mid.block_1 = ResnetBlock(block_in, block_in, make_norm)
        self.mid.attn_1 = AttnBlock(block_in, make_norm)
        self.mid.block_2 = ResnetBlock(block_in, block_in, make_norm)
        stages: list[nn.Module] = []
        for level in reversed(range(len(spec.widths))):  # built coarsest first, stored by level
            stage = nn.Module()
            stage.block, stage.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(spec.num_res_blocks + 1):
                stage.block.append(ResnetBlock(block_in, spec.widths[level], make_norm))
                block_in = spec.widths[level]
                if level in spec.attn_levels:
                    stage.attn.append(AttnBlock(block_in, make_norm))
            if level != 0:
                stage.upsample = Upsample(block_in)
            stages.insert(0, stage)
        self.up = nn.ModuleList(stages)
        self.norm_out = make_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, 3, 3, padding=1)

    def middle(self, z: torch.Tensor, zq: Optional[torch.Tensor]) -> torch.Tensor:
        """`conv_in` and the middle block (residual, attention, residual), at the code grid."""
        h = self.conv_in(z)
        return self.mid.block_2(self.mid.attn_1(self.mid.block_1(h, zq), zq), zq)

    def stage(self, level: int, h: torch.Tensor, zq: Optional[torch.Tensor]) -> torch.Tensor:
        """`up.<level>`: its residual blocks (each followed by attention where the level has it), then its
        upsampling except at level 0."""
        stage = self.up[level]
        for i, block in enumerate(stage.block):
            h = block(h, zq)
            if len(stage.attn):
                h = stage.attn[i](h, zq)
        return stage.upsample(h) if level != 0 else h

    def forward(self, z: torch.Tensor, zq: Optional[torch.Tensor]) -> torch.Tensor:
        h = self.middle(z, zq)
        for level in reversed(range(len(self.up))):
            h = self.stage(level, h, zq)
        return self.conv_out(F.silu(self.norm_out(h, zq)))


class Quantizer(nn.Module):
    """The codebook, shared by the decoder and the encoder (`taming_encoder`): any spec with its two sizes."""

    def __init__(self, spec: DecoderSpec):
        super().__init__()
        self.embedding = nn.Embedding(spec.codebook_size, spec.embed_dim)


class VQDecoder(nn.Module):
    """Codebook + post-quantisation conv + decoder: codes to pixels."""

    def __init__(self, spec: DecoderSpec):
        super().__init__()
        self.spec = spec
        self.quantize = Quantizer(spec)
        self.post_quant_conv = nn.Conv2d(spec.embed_dim, spec.z_channels, 1)
        self.decoder = Decoder(spec)

    def latent(self, codes: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Code indices (B, rows*cols), row-major -> the decoder's input and, for MoVQ's norms, the quantised
        latent they read."""
        if codes.dim() != 2 or codes.shape[1] != rows * cols:
            raise ValueError(f"expected codes of shape (batch, {rows * cols}), got {tuple(codes.shape)}")
        quant = self.quantize.embedding(codes).view(codes.shape[0], rows, cols, -1).permute(0, 3, 1, 2)
        quant = quant.to(self.post_quant_conv.weight.dtype)
        return self.post_quant_conv(quant), quant if self.spec.spatial_norm else None

    def decode(self, codes: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        """Code indices (B, rows*cols), row-major -> images (B, 3, rows*d, cols*d), nominally in [-1, 1]."""
        return self.decoder(*self.latent(codes, rows, cols))


def _indices(state: dict[str, torch.Tensor], prefix: str) -> list[int]:
    """The numeric children of `prefix` ("decoder.up." -> [0, 1, ...])."""
    found = {key[len(prefix):].split(".")[0] for key in state if key.startswith(prefix)}
    return sorted(int(name) for name in found if name.isdigit())


def read_stages(state: dict[str, torch.Tensor], stack: str, source: str
                ) -> tuple[int, int, tuple[int, ...], int, frozenset[int]]:
    """The codebook's size and width, then the widths of `stack`'s levels ("decoder.up" or "encoder.down"), its
    residual blocks per level and its levels with attention, read off the weights; ModelLoadError naming
    `source` if they do not fit."""
    part = stack.split(".")[0]
    try:
        codebook_size, embed_dim = state["quantize.embedding.weight"].shape
        levels = _indices(state, f"{stack}.")
        blocks = _indices(state, f"{stack}.0.block.")
        widths = tuple(state[f"{stack}.{level}.block.0.conv2.weight"].shape[0] for level in levels)
    except (KeyError, ValueError) as err:
        raise ModelLoadError(f"{source} does not hold a VQGAN {part} in the expected layout "
                             f"(missing or malformed {err})") from err
    if not levels or levels != list(range(len(levels))) or not blocks:
        raise ModelLoadError(f"{source} does not hold a VQGAN {part} in the expected layout (no {stack} stages)")
    attn_levels = frozenset(level for level in levels if f"{stack}.{level}.attn.0.q.weight" in state)
    return codebook_size, embed_dim, widths, len(blocks), attn_levels


def infer_spec(state: dict[str, torch.Tensor], spatial_norm: bool, source: str) -> DecoderSpec:
    """Read the decoder's architecture off its weights; ModelLoadError naming `source` if they do not fit."""
    try:
        z_channels = state["post_quant_conv.weight"].shape[0]
    except KeyError as err:
        raise ModelLoadError(f"{source} does not hold a VQGAN decoder in the expected layout (missing {err})") from err
    codebook_size, embed_dim, widths, blocks, attn_levels = read_stages(state, "decoder.up", source)
    norm_conv = spatial_norm and "decoder.norm_out.conv.weight" in state
    return DecoderSpec(codebook_size=codebook_size, embed_dim=embed_dim, z_channels=z_channels, widths=widths,
                       num_res_blocks=blocks - 1, attn_levels=attn_levels, spatial_norm=spatial_norm,
                       norm_conv=norm_conv)


def load_decoder(state: dict[str, torch.Tensor], spatial_norm: bool, source: str) -> VQDecoder:
    """A VQDecoder holding the decoder part of `state`.

    Every decoder weight must be present with its shape.  Keys under UNUSED_PREFIXES
    are set aside silently; any other key the decoder does not use (published files
    carry training extras; the upstream loads them non-strictly) is set aside too,
    named in one warning.
    """
    kept = {key: value for key, value in state.items() if not key.startswith(UNUSED_PREFIXES)}
    spec = infer_spec(kept, spatial_norm, source)
    model = VQDecoder(spec)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(kept))
    misshaped = [f"{key} {list(kept[key].shape)} (expected {list(value.shape)})" for key, value in expected.items()
                 if key in kept and kept[key].shape != value.shape]
    if missing or misshaped:
        problems = [f"{what} {keys[:4]}" for what, keys in (("missing", missing), ("wrong shape", misshaped)) if keys]
        raise ModelLoadError(f"{source}: the weights do not fit the {'MoVQGAN' if spatial_norm else 'VQGAN'} "
                             f"decoder ({', '.join(problems)}); is this the right file?")
    unused = sorted(set(kept) - set(expected))
    if unused:
        warnings.warn(f"{source}: set aside {len(unused)} entries the decoder does not use: "
                      f"{', '.join(unused[:8])}{', ...' if len(unused) > 8 else ''}", stacklevel=2)
    model.load_state_dict({key: kept[key] for key in expected}, strict=True)
    return model.eval().requires_grad_(False)
