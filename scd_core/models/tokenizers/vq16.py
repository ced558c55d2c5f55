"""LlamaGen's VQ image tokenizer (the "VQ-16" design), written from its published facts.

A taming-style convolutional encoder/decoder around an L2-normalised codebook.
Parameter names match the original `vq_ds16_*.pt` checkpoints, so their state
dicts load unchanged; channel multipliers, base width, residual blocks and the
GroupNorm group count are configurable so a small variant (the demo's) uses the
same code.  The encoder is optional: generation only needs the decoder, so loading leaves it out
(`vq_from_state_dict(..., with_encoder=False)`) and `VQEncoder` reads it when an image is first encoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..weights.checkpoints import ModelLoadError

# Buffers of the original training code that inference does not need.
IGNORED_KEYS = ("quantize.codebook_used",)


@dataclass(frozen=True)
class VQConfig:
    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    z_channels: int = 256
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    norm_groups: int = 32
    with_encoder: bool = True

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)


def _swish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


class ResnetBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, groups: int):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, in_ch, eps=1e-6)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, out_ch, eps=1e-6)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        if in_ch != out_ch:
            self.nin_shortcut = nn.Conv2d(in_ch, out_ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(_swish(self.norm1(x)))
        h = self.conv2(_swish(self.norm2(h)))
        shortcut = self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x
        return shortcut + h


class AttnBlock(nn.Module):
    """Single-head self-attention over all pixels (1x1 conv projections)."""

    def __init__(self, channels: int, groups: int):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels, eps=1e-6)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        y = self.norm(x)
        q, k, v = (proj(y).flatten(2).transpose(1, 2) for proj in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v)
        return x + self.proj_out(out.transpose(1, 2).reshape(b, c, h, w))


class Downsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))  # asymmetric padding, as trained


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Encoder(nn.Module):
    def __init__(self, cfg: VQConfig):
        super().__init__()
        levels, g = len(cfg.ch_mult), cfg.norm_groups
        self.conv_in = nn.Conv2d(3, cfg.ch, 3, padding=1)
        self.conv_blocks = nn.ModuleList()
        block_in = cfg.ch
        for level, mult in enumerate(cfg.ch_mult):
            block = nn.Module()
            block.res, block.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(cfg.num_res_blocks):
                block.res.append(ResnetBlock(block_in, cfg.ch * mult, g))
                block_in = cfg.ch * mult
                if level == levels - 1:
                    block.attn.append(AttnBlock(block_in, g))
            if level != levels - 1:
                block.downsample = Downsample(block_in)
            self.conv_blocks.append(block)
        self.mid = nn.ModuleList([ResnetBlock(block_in, block_in, g), AttnBlock(block_in, g),
                                  ResnetBlock(block_in, block_in, g)])
        self.norm_out = nn.GroupNorm(g, block_in, eps=1e-6)
        self.conv_out = nn.Conv2d(block_in, cfg.z_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for block in self.conv_blocks:
            h = _level(block, h)
            if hasattr(block, "downsample"):
                h = block.downsample(h)
        for layer in self.mid:
            h = layer(h)
        return self.conv_out(_swish(self.norm_out(h)))


def _level(block: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """One resolution level's residual blocks, each followed by its attention block where the level has them."""
    for i, res in enumerate(block.res):
        h = res(h)
        if len(block.attn):
            h = block.attn[i](h)
    return h


class Decoder(nn.Module):
    def __init__(self, cfg: VQConfig):
        super().__init__()
        levels, g = len(cfg.ch_mult), cfg.norm_groups
        block_in = cfg.ch * cfg.ch_mult[-1]
        self.conv_in = nn.Conv2d(cfg.z_channels, block_in, 3, padding=1)
        self.mid = nn.ModuleList([ResnetBlock(block_in, block_in, g), AttnBlock(block_in, g),
                                  ResnetBlock(block_in, block_in, g)])
        self.conv_blocks = nn.ModuleList()
        for level in reversed(range(levels)):
            block = nn.Module()
            block.res, block.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(cfg.num_res_blocks + 1):
                block.res.append(ResnetBlock(block_in, cfg.ch * cfg.ch_mult[level], g))
                block_in = cfg.ch * cfg.ch_mult[level]
                if level == levels - 1:
                    block.attn.append(AttnBlock(block_in, g))
            if level != 0:
                block.upsample = Upsample(block_in)
            self.conv_blocks.append(block)
        self.norm_out = nn.GroupNorm(g, block_in, eps=1e-6)
        self.conv_out = nn.Conv2d(block_in, 3, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        for layer in self.mid:
            h = layer(h)
        for block in self.conv_blocks:
            h = _level(block, h)
            if hasattr(block, "upsample"):
                h = block.upsample(h)
        return self.conv_out(_swish(self.norm_out(h)))


class VectorQuantizer(nn.Module):
    def __init__(self, cfg: VQConfig):
        super().__init__()
        self.embedding = nn.Embedding(cfg.codebook_size, cfg.codebook_embed_dim)

    def codebook(self) -> torch.Tensor:
        return F.normalize(self.embedding.weight, dim=-1)

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """The normalised codebook vectors of `codes`, read through the embedding's forward (so that a
        layer that casts its weights per call, as ComfyUI's streamed ones do, works too)."""
        return F.normalize(self.embedding(codes), dim=-1)

    def nearest(self, z: torch.Tensor) -> torch.Tensor:
        """Code index of each latent vector (..., dim) by cosine similarity (both sides L2-normalised)."""
        return cosine_nearest(z, self.embedding.weight)


def cosine_nearest(latents: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """Index of the codebook row (codes, dim) nearest each latent (..., dim) once both are L2-normalised: the
    VQ-16 quantiser's rule (LlamaGen's and Janus's `codebook_l2_norm`)."""
    return (F.normalize(latents, dim=-1) @ F.normalize(codebook, dim=-1).t().to(latents.dtype)).argmax(dim=-1)


def encode_latent(vq: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """Images (B, 3, H, W) in [-1, 1] -> unquantised latents (B, H/d, W/d, embed_dim), through `vq`'s encoder
    and quant_conv."""
    return vq.quant_conv(vq.encoder(images)).permute(0, 2, 3, 1)


class VQEncoder(nn.Module):
    """The encoder side alone (encoder, quant_conv, codebook; the checkpoint's names): images -> codes."""

    def __init__(self, cfg: VQConfig):
        super().__init__()
        self.config = cfg
        self.encoder = Encoder(cfg)
        self.quant_conv = nn.Conv2d(cfg.z_channels, cfg.codebook_embed_dim, 1)
        self.quantize = VectorQuantizer(cfg)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) in [-1, 1] -> codes (B, H/d, W/d)."""
        return self.quantize.nearest(encode_latent(self, images))


class VQModel(nn.Module):
    def __init__(self, cfg: VQConfig):
        super().__init__()
        self.config = cfg
        if cfg.with_encoder:
            self.encoder = Encoder(cfg)
            self.quant_conv = nn.Conv2d(cfg.z_channels, cfg.codebook_embed_dim, 1)
        self.decoder = Decoder(cfg)
        self.quantize = VectorQuantizer(cfg)
        self.post_quant_conv = nn.Conv2d(cfg.codebook_embed_dim, cfg.z_channels, 1)

    def encode_latent(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) in [-1, 1] -> unquantised latents (B, H/d, W/d, embed_dim)."""
        if not self.config.with_encoder:
            raise ValueError("this VQ model was loaded without its encoder")
        return encode_latent(self, images)

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) in [-1, 1] -> codes (B, H/d * W/d), row-major."""
        return self.quantize.nearest(self.encode_latent(images)).flatten(1)

    def decode_latent(self, latent: torch.Tensor) -> torch.Tensor:
        """Normalised latents (B, h, w, embed_dim) -> images (B, 3, H, W), nominally in [-1, 1]."""
        return self.decoder(self.post_quant_conv(latent.permute(0, 3, 1, 2)))

    def decode(self, codes: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """Codes (B, rows*cols) -> images (B, 3, rows*d, cols*d), nominally in [-1, 1]."""
        rows, cols = grid
        if codes.dim() != 2 or codes.shape[1] != rows * cols:
            raise ValueError(f"expected codes of shape (batch, {rows * cols}), got {tuple(codes.shape)}")
        latent = self.quantize.lookup(codes).view(codes.shape[0], rows, cols, -1)
        return self.decode_latent(latent.to(self.post_quant_conv.weight.dtype))


def _level_count(state: dict[str, torch.Tensor], prefix: str) -> int:
    return len({k[len(prefix):].split(".")[0] for k in state if k.startswith(prefix)})


def infer_vq_config(state: dict[str, torch.Tensor], norm_groups: int = 32,
                    ch_mult: Optional[tuple[int, ...]] = None) -> VQConfig:
    """Read the architecture off a VQ state dict (the group count is not stored; 32 in the originals)."""
    try:
        codebook_size, embed_dim = state["quantize.embedding.weight"].shape
        z_channels = state["post_quant_conv.weight"].shape[0]
        levels = _level_count(state, "decoder.conv_blocks.")
        num_res_blocks = _level_count(state, "decoder.conv_blocks.0.res.") - 1
        # decoder block i runs level (levels - 1 - i); its output width is ch * ch_mult[level]
        widths = [state[f"decoder.conv_blocks.{levels - 1 - level}.res.0.conv2.weight"].shape[0]
                  for level in range(levels)]
    except KeyError as err:
        raise ModelLoadError(f"not a LlamaGen VQ state dict: missing {err}") from err
    with_encoder = "encoder.conv_in.weight" in state
    ch = state["encoder.conv_in.weight"].shape[0] if with_encoder else min(widths)
    if ch_mult is None:
        ch_mult = tuple(w // ch for w in widths)
    return VQConfig(codebook_size=codebook_size, codebook_embed_dim=embed_dim, z_channels=z_channels, ch=ch,
                    ch_mult=tuple(ch_mult), num_res_blocks=num_res_blocks, norm_groups=norm_groups,
                    with_encoder=with_encoder)


ENCODER_KEYS = ("encoder.", "quant_conv.")  # the encoder side's names in the checkpoints


def vq_from_state_dict(state: dict[str, torch.Tensor], source: str, norm_groups: int = 32,
                       with_encoder: bool = True) -> VQModel:
    """Build a VQModel matching `state` and load it strictly; `source` names the file in errors.  Without
    `with_encoder` the encoder side is left out (generation only decodes; see `encoder_from_state_dict`)."""
    state = {k: v for k, v in state.items() if k not in IGNORED_KEYS
             and (with_encoder or not k.startswith(ENCODER_KEYS))}
    return _loaded(VQModel, infer_vq_config(state, norm_groups), state, source)


def encoder_from_state_dict(state: dict[str, torch.Tensor], source: str, norm_groups: int = 32) -> VQEncoder:
    """The encoder side of the VQ in `state` (encoder, quant_conv and codebook), loaded strictly."""
    cfg = infer_vq_config(state, norm_groups)
    if not cfg.with_encoder:
        raise ModelLoadError(f"{source} holds no VQ encoder weights (encoder.*), so it cannot encode images")
    kept = {k: v for k, v in state.items() if k.startswith((*ENCODER_KEYS, "quantize.embedding."))}
    return _loaded(VQEncoder, cfg, kept, source)


def _loaded(kind: type[nn.Module], cfg: VQConfig, state: dict[str, torch.Tensor], source: str) -> nn.Module:
    try:
        model = kind(cfg)
        model.load_state_dict(state, strict=True)
    except (RuntimeError, ValueError) as err:
        raise ModelLoadError(f"{source}: VQ weights do not fit the VQ-16 design "
                             f"({str(err).splitlines()[0]})") from err
    return model.eval()
