"""The taming-transformers VQGAN encoder that Chameleon's VQGAN and MoVQGAN share (both encode with plain GroupNorm).

Pixels in [-1, 1] -> `encoder` (`conv_in`, one `down.<level>` stage per resolution level: residual blocks,
attention where the level has it, a stride-2 convolution except at the last level; a middle block; `norm_out`,
swish, `conv_out`) -> `quant_conv` -> the nearest codebook vector in squared distance, as both tokenizers'
quantisers pick it.  The layers are `taming.py`'s (the decoder's) with GroupNorm; the architecture is read off the
weights, and a checkpoint either fills the whole encoder or is refused naming the keys that do not fit.  It is
built only when an image is encoded: generation never loads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..weights.checkpoints import ModelLoadError
from .taming import NORM_GROUPS, AttnBlock, GroupNorm, Quantizer, ResnetBlock, read_stages
from .vq16 import Downsample


@dataclass(frozen=True)
class EncoderSpec:
    """What a checkpoint says about its encoder; `widths[level]` is the output width of `down.<level>`."""

    codebook_size: int
    embed_dim: int
    z_channels: int
    base_width: int
    widths: tuple[int, ...]
    num_res_blocks: int
    attn_levels: frozenset[int]

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.widths) - 1)


def _group_norm(channels: int) -> nn.Module:
    return GroupNorm(NORM_GROUPS, channels, eps=1e-6)


class Encoder(nn.Module):
    def __init__(self, spec: EncoderSpec):
        super().__init__()
        self.conv_in = nn.Conv2d(3, spec.base_width, 3, padding=1)
        block_in, stages = spec.base_width, []
        for level, width in enumerate(spec.widths):
            stage = nn.Module()
            stage.block, stage.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(spec.num_res_blocks):
                stage.block.append(ResnetBlock(block_in, width, _group_norm))
                block_in = width
                if level in spec.attn_levels:
                    stage.attn.append(AttnBlock(block_in, _group_norm))
            if level != len(spec.widths) - 1:
                stage.downsample = Downsample(block_in)
            stages.append(stage)
        self.down = nn.ModuleList(stages)
        self.mid = nn.Module()
        self.mid.block_1 = ResnetBlock(block_in, block_in, _group_norm)
        self.mid.attn_1 = AttnBlock(block_in, _group_norm)
        self.mid.block_2 = ResnetBlock(block_in, block_in, _group_norm)
        self.norm_out = _group_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, spec.z_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for stage in self.down:
            for i, block in enumerate(stage.block):
                h = block(h, None)
                if len(stage.attn):
                    h = stage.attn[i](h, None)
            if hasattr(stage, "downsample"):
                h = stage.downsample(h)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h, None), None), None)
        return self.conv_out(F.silu(self.norm_out(h)))


class VQEncoder(nn.Module):
    """Encoder + pre-quantisation conv + codebook: pixels to codes."""

    def __init__(self, spec: EncoderSpec):
        super().__init__()
        self.spec = spec
        self.encoder = Encoder(spec)
        self.quant_conv = nn.Conv2d(spec.z_channels, spec.embed_dim, 1)
        self.quantize = Quantizer(spec)

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) in [-1, 1], H and W multiples of the downsampling -> codes (B, rows*cols),
        row-major, as `pick` chooses them."""
        d = self.spec.downsample
        if images.dim() != 4 or images.shape[1] != 3 or images.shape[2] % d or images.shape[3] % d:
            raise ValueError(f"expected images (batch, 3, H, W) with H and W multiples of {d}, got "
                             f"{tuple(images.shape)}")
        z = self.quant_conv(self.encoder(images.to(self.quant_conv.weight)))  # its device and dtype
        z = z.permute(0, 2, 3, 1).flatten(1, 2)  # (B, rows*cols, dim)
        return self.pick(z, self.quantize.embedding.weight.to(z.dtype))

    @staticmethod
    def pick(z: torch.Tensor, book: torch.Tensor) -> torch.Tensor:
        """Latent vectors (B, N, dim) -> the code of each: the nearest codebook entry in squared distance."""
        distance = z.pow(2).sum(-1, keepdim=True) + book.pow(2).sum(-1) - 2 * z @ book.t()
        return distance.argmin(dim=-1)


def infer_encoder_spec(state: dict[str, torch.Tensor], source: str) -> EncoderSpec:
    """Read the encoder's architecture off its weights; ModelLoadError naming `source` if they do not fit."""
    try:
        z_channels = state["quant_conv.weight"].shape[1]
        base_width = state["encoder.conv_in.weight"].shape[0]
    except KeyError as err:
        raise ModelLoadError(f"{source} does not hold a VQGAN encoder in the expected layout (missing {err})") from err
    codebook_size, embed_dim, widths, blocks, attn_levels = read_stages(state, "encoder.down", source)
    return EncoderSpec(codebook_size=codebook_size, embed_dim=embed_dim, z_channels=z_channels,
                       base_width=base_width, widths=widths, num_res_blocks=blocks, attn_levels=attn_levels)


def load_encoder(state: dict[str, torch.Tensor], source: str, kind: type[VQEncoder] = VQEncoder) -> VQEncoder:
    """A `kind` (VQEncoder or a subclass choosing codes its own way) holding the encoder part of `state` (every
    encoder weight present with its shape); the decoder's and training entries are not its business and are
    left alone."""
    spec = infer_encoder_spec(state, source)
    model = kind(spec)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    misshaped = [f"{key} {list(state[key].shape)} (expected {list(value.shape)})" for key, value in expected.items()
                 if key in state and state[key].shape != value.shape]
    if missing or misshaped:
        problems = [f"{what} {keys[:4]}" for what, keys in (("missing", missing), ("wrong shape", misshaped)) if keys]
        raise ModelLoadError(f"{source}: the weights do not fit the VQGAN encoder ({', '.join(problems)}); "
                             "is this the right file?")
    model.load_state_dict({key: state[key] for key in expected}, strict=True)
    return model.eval().requires_grad_(False)
