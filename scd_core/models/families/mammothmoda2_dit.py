"""MammothModa2's diffusion decoder: the OmniGen2 / Lumina2-style DiT and the Q-Former that condenses the LLM's image
condition, in plain torch under the published names (gen_transformer.*, gen_image_condition_refiner.*).

Each rule, with the authors' file (github.com/bytedance/mammothmoda, `mammothmoda2_dit/` under the model folder:
Dev on main, Preview on branch qwen25vl; the two differ only where said):
- the transformer (diffusion_transformer.py Transformer2DModel.forward, 586-769): the condition tokens through
  caption_embedder (an RMSNorm and a linear from the LLM's width, `reinit_caption_embedder` in
  modeling_mammothmoda2.py) and `context_refiner` (unmodulated blocks); the latent's 2 x 2 patches through
  x_embedder and `noise_refiner`; both joined, condition first, through `layers`; norm_out; the image part
  unpatchified.  Reference images (image editing) are not used for text-to-image: ref_image_* never run here.
- a block (TransformerBlock, 78-216): x + tanh(gate) * norm2(attn(norm1(x) * (1 + scale))), then
  x + tanh(gate') * ffn_norm2(ffn(ffn_norm1(x) * (1 + scale'))), the four values from norm1.linear(silu(temb));
  unmodulated blocks drop the scales and gates.  Attention (attention_processor.py): q/k RMS-normed per head, the
  rotary positions, key/value heads shared by groups, no causal mask (one image at a time: nothing padded).
- rotary positions (rope_real.py 160-300): a condition token i sits at (i, i, i), the latent patch (r, c) at
  (condition length, r, c); each axis rotates its own slice of the head (axes_dim_rope) by pairs (2k, 2k + 1) at
  angles position / 10000^(2k / slice), computed in float64 and rounded to float32 as theirs.  Their table holds
  gen_dit_config's `axes_lens` positions per axis (default 300, 512, 512) and is read by index, so a longer
  condition or a larger image fails there: refused here in one line (`check_rotary_range`).
- the time embedding (block_lumina2.py 183-249, diffusers' Timesteps(256, flip_sin_to_cos=True, shift 0)): cos
  then sin of t * timestep_scale * 10000^(-k / 128), then linear, SiLU, linear; t runs from 0 (noise) to 1.
- the Q-Former (image_refiner.py Dev / image_embedder.py Preview): learned queries, each layer self-attention,
  cross-attention to the projected condition, a SwiGLU feed-forward, each pre-normed and residual.  Preview's
  (gen_image_condition_refiner) stays at the LLM's width and feeds the caption embedder; Dev's
  (gen_transformer.time_caption_embed.image_embedder) projects to the DiT's width and its tokens follow the
  embedded caption.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

FREQUENCY_CHANNELS = 256  # Lumina2CombinedTimestepCaptionEmbedding's frequency_embedding_size
CAPTION_EPS = 1e-5  # reinit_caption_embedder's RMSNorm
ROPE_THETA = 10000


def rms_norm(width: int, eps: float) -> nn.Module:
    """Qwen's RMSNorm (the authors swap every RMSNorm of the DiT for it): float32 statistics, weight after."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    return Qwen2RMSNorm(width, eps=eps)


class FeedForward(nn.Module):
    """LuminaFeedForward: linear_2(silu(linear_1 x) * linear_3 x), its inner width rounded up to `multiple_of`."""

    def __init__(self, dim: int, inner: int, multiple_of: int = 256, multiplier: Optional[float] = None) -> None:
        super().__init__()
        if multiplier is not None:
            inner = int(multiplier * inner)
        inner = multiple_of * ((inner + multiple_of - 1) // multiple_of)
        self.linear_1 = nn.Linear(dim, inner, bias=False)
        self.linear_2 = nn.Linear(inner, dim, bias=False)
        self.linear_3 = nn.Linear(dim, inner, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.linear_1(x)
        return self.linear_2(F.silu(gate.float()).to(gate.dtype) * self.linear_3(x))


def rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """(B, L, heads, D) rotated by pairs (2k, 2k + 1) at (1, L, 1, D / 2) angles, in float32 as theirs."""
    pairs = x.float().unflatten(-1, (-1, 2))
    first, second = pairs[..., 0], pairs[..., 1]
    out = torch.stack([first * cos - second * sin, first * sin + second * cos], dim=-1)
    return out.flatten(-2).to(x.dtype)


class Attention(nn.Module):
    """diffusers' Attention as the DiT configures it: no biases, RMS-normed q/k (eps 1e-5), grouped key/value heads."""

    def __init__(self, dim: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.to_q = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.to_k = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.to_v = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(heads * self.head_dim, dim, bias=False)])
        self.norm_q, self.norm_k = rms_norm(self.head_dim, 1e-5), rms_norm(self.head_dim, 1e-5)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        batch, length = x.shape[:2]
        q = self.norm_q(self.to_q(x).view(batch, length, self.heads, self.head_dim))
        k = self.norm_k(self.to_k(x).view(batch, length, self.kv_heads, self.head_dim))
        v = self.to_v(x).view(batch, length, self.kv_heads, self.head_dim)
        q, k = rotated(q, *rope), rotated(k, *rope)
        groups = self.heads // self.kv_heads
        k, v = (t.transpose(1, 2).repeat_interleave(groups, dim=1) for t in (k, v))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v)
        return self.to_out[0](out.transpose(1, 2).reshape(batch, length, -1))


class Modulation(nn.Module):
    """LuminaRMSNormZero: the normed input scaled by the time embedding, and the block's three other values."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.linear = nn.Linear(min(dim, 1024), 4 * dim)
        self.norm = rms_norm(dim, eps)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> tuple[torch.Tensor, ...]:
        scale, gate, scale_ffn, gate_ffn = self.linear(F.silu(temb)).chunk(4, dim=1)
        return self.norm(x) * (1 + scale[:, None]), gate, scale_ffn, gate_ffn


class Block(nn.Module):
    """TransformerBlock: attention and feed-forward, each sandwiched by RMSNorms; modulated by the time or not."""

    def __init__(self, dim: int, heads: int, kv_heads: int, settings: dict, modulated: bool) -> None:
        super().__init__()
        eps = settings["norm_eps"]
        self.attn = Attention(dim, heads, kv_heads)
        self.feed_forward = FeedForward(dim, 4 * dim, settings["multiple_of"], settings["ffn_dim_multiplier"])
        self.norm1 = Modulation(dim, eps) if modulated else rms_norm(dim, eps)
        self.ffn_norm1, self.norm2, self.ffn_norm2 = rms_norm(dim, eps), rms_norm(dim, eps), rms_norm(dim, eps)
        self.modulated = modulated

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                temb: Optional[torch.Tensor] = None) -> torch.Tensor:
        if not self.modulated:
            x = x + self.norm2(self.attn(self.norm1(x), rope))
            return x + self.ffn_norm2(self.feed_forward(self.ffn_norm1(x)))
        normed, gate, scale_ffn, gate_ffn = self.norm1(x, temb)
        x = x + gate[:, None].tanh() * self.norm2(self.attn(normed, rope))
        out = self.feed_forward(self.ffn_norm1(x) * (1 + scale_ffn[:, None]))
        return x + gate_ffn[:, None].tanh() * self.ffn_norm2(out)


class OutputNorm(nn.Module):
    """LuminaLayerNormContinuous: LayerNorm without weights (eps 1e-6), scaled by the time, then projected."""

    def __init__(self, dim: int, out: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(min(dim, 1024), dim)
        self.linear_2 = nn.Linear(dim, out)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        scale = self.linear_1(F.silu(temb).to(x.dtype))
        return self.linear_2(F.layer_norm(x, x.shape[-1:], eps=1e-6) * (1 + scale)[:, None])


def choose_heads(width: int, proposed: int, preferred_head_dim: int = 128) -> int:
    """The Q-Former's head count: `proposed` where it divides `width`, else the divisor nearest width / 128."""
    if proposed > 0 and width % proposed == 0:
        return proposed
    target = max(1, round(width / preferred_head_dim))
    return min((d for d in range(1, min(128, width) + 1) if width % d == 0), key=lambda d: (abs(d - target), -d))


class QFormer(nn.Module):
    """SimpleQFormerImageEmbedder (Dev) / SimpleQFormerImageRefiner (Preview): `num_queries` learned queries that
    read a variable-length condition; (B, L, input_dim) -> (B, num_queries, width)."""

    def __init__(self, input_dim: int, width: int, num_queries: int = 128, num_layers: int = 2,
                 num_heads: Optional[int] = None, dropout: float = 0.0, norm_eps: float = 1e-5) -> None:
        super().__init__()
        heads = choose_heads(width, num_heads or max(1, width // 128))
        self.input_proj = nn.Sequential(rms_norm(input_dim, norm_eps), nn.Linear(input_dim, width))
        self.query = nn.Parameter(torch.zeros(1, num_queries, width))

        def layer() -> nn.ModuleDict:
            return nn.ModuleDict(dict(
                ln_q1=rms_norm(width, norm_eps), self_attn=nn.MultiheadAttention(width, heads, batch_first=True),
                ln_q2=rms_norm(width, norm_eps), cross_attn=nn.MultiheadAttention(width, heads, batch_first=True),
                ln_ffn=rms_norm(width, norm_eps), ffn=FeedForward(width, 4 * width)))

        self.layers = nn.ModuleList([layer() for _ in range(num_layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kv = self.input_proj(x)
        q = self.query.expand(x.shape[0], -1, -1).to(kv.dtype)
        for layer in self.layers:
            normed = layer["ln_q1"](q)
            q = q + layer["self_attn"](normed, normed, normed, need_weights=False)[0]
            q = q + layer["cross_attn"](layer["ln_q2"](q), kv, kv, need_weights=False)[0]
            q = q + layer["ffn"](layer["ln_ffn"](q))
        return q


class TimeCaptionEmbed(nn.Module):
    """The time embedding, the caption embedder and (Dev) the Q-Former over the image condition."""

    def __init__(self, dim: int, llm_width: int, timestep_scale: float, qformer: Optional[dict]) -> None:
        super().__init__()
        self.timestep_scale = timestep_scale
        self.timestep_embedder = nn.Module()
        self.timestep_embedder.linear_1 = nn.Linear(FREQUENCY_CHANNELS, min(dim, 1024))
        self.timestep_embedder.linear_2 = nn.Linear(min(dim, 1024), min(dim, 1024))
        self.caption_embedder = nn.Sequential(rms_norm(llm_width, CAPTION_EPS), nn.Linear(llm_width, dim))
        if qformer is not None:
            heads = dict(qformer, num_heads=max(1, dim // 128))  # reinit_image_embedder passes its own
            self.image_embedder = QFormer(llm_width, dim, **heads)

    def time(self, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        half = FREQUENCY_CHANNELS // 2
        frequencies = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        angles = self.timestep_scale * (t[:, None].float() * frequencies[None])
        projected = torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype)
        embedder = self.timestep_embedder
        return embedder.linear_2(F.silu(embedder.linear_1(projected)))


def rope_angles(axes: tuple[int, ...], positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(L, 3) positions -> cos, sin (1, L, 1, head_dim / 2): each axis its slice of the pairs."""
    parts = []
    for axis, width in enumerate(axes):
        inverse = 1.0 / ROPE_THETA ** (torch.arange(0, width, 2, dtype=torch.float64) / width)
        parts.append(positions[:, axis, None].double() * inverse[None])
    angles = torch.cat(parts, dim=-1)
    return angles.cos().float()[None, :, None], angles.sin().float()[None, :, None]


def positions(condition: int, rows: int, cols: int) -> torch.Tensor:
    """Condition token i at (i, i, i), then the latent patches at (condition, row, col), row-major."""
    text = torch.arange(condition)[:, None].expand(-1, 3)
    grid = torch.stack(torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij"), dim=-1).reshape(-1, 2)
    return torch.cat([text, torch.cat([torch.full((rows * cols, 1), condition), grid], dim=1)])


def check_rotary_range(length: int, rows: int, cols: int, lengths: tuple[int, ...]) -> None:
    """The authors' rotary table holds `lengths` positions per axis (gen_dit_config's axes_lens, read by index)
    and their DiT fails past them: so does this one, in one line, rather than make an image theirs cannot."""
    reach = (length, max(length, rows) - 1, max(length, cols) - 1)  # `positions`' largest per axis
    if all(last < limit for last, limit in zip(reach, lengths)):
        return
    raise ValueError(f"MammothModa2's DiT places at most {lengths[0] - 1} condition tokens and {lengths[1]} x "
                     f"{lengths[2]} latent patches (16 px each with the published VAE; gen_dit_config axes_lens "
                     f"{list(lengths)}); this decode has {length} and {rows} x {cols}: shorten the prompt or ask for a "
                     "smaller image")


class MammothDiT(nn.Module):
    """gen_transformer for text-to-image: velocity (B, C, H, W) of latents at time t given the condition."""

    def __init__(self, config: dict, llm_width: int, qformer: Optional[dict] = None) -> None:
        super().__init__()
        settings = dict(patch_size=2, in_channels=16, hidden_size=2304, num_layers=26, num_refiner_layers=2,
                        num_attention_heads=24, num_kv_heads=8, multiple_of=256, ffn_dim_multiplier=None,
                        norm_eps=1e-5, axes_dim_rope=(32, 32, 32), axes_lens=(300, 512, 512), timestep_scale=1.0,
                        out_channels=None)
        settings.update({key: value for key, value in config.items() if key in settings})
        dim, heads, kv_heads = settings["hidden_size"], settings["num_attention_heads"], settings["num_kv_heads"]
        if dim // heads != sum(settings["axes_dim_rope"]):
            raise ValueError(f"gen_dit_config: hidden_size // num_attention_heads ({dim // heads}) is not "
                             f"sum(axes_dim_rope) {sum(settings['axes_dim_rope'])}")
        self.patch, self.channels = settings["patch_size"], settings["in_channels"]
        self.axes, self.axes_lens = tuple(settings["axes_dim_rope"]), tuple(settings["axes_lens"])
        out = self.patch ** 2 * (settings["out_channels"] or self.channels)
        self.x_embedder = nn.Linear(self.patch ** 2 * self.channels, dim)
        self.time_caption_embed = TimeCaptionEmbed(dim, llm_width, settings["timestep_scale"], qformer)

        def blocks(count: int, modulated: bool) -> nn.ModuleList:
            return nn.ModuleList([Block(dim, heads, kv_heads, settings, modulated) for _ in range(count)])

        self.noise_refiner = blocks(settings["num_refiner_layers"], True)
        self.context_refiner = blocks(settings["num_refiner_layers"], False)
        self.layers = blocks(settings["num_layers"], True)
        self.norm_out = OutputNorm(dim, out)

    def forward(self, latents: torch.Tensor, t: torch.Tensor, text: torch.Tensor,
                image: Optional[torch.Tensor] = None) -> torch.Tensor:
        """latents (B, C, H, W), t (B,), text (B, L, LLM width); Dev's raw image condition (B, L', LLM width)."""
        embed = self.time_caption_embed
        temb = embed.time(t, latents.dtype)
        condition = embed.caption_embedder(text)
        if image is not None:
            condition = torch.cat([condition, embed.image_embedder(image)], dim=1)
        batch, channels, height, width = latents.shape
        p, rows, cols = self.patch, height // self.patch, width // self.patch
        patches = latents.reshape(batch, channels, rows, p, cols, p).permute(0, 2, 4, 3, 5, 1)
        x = self.x_embedder(patches.reshape(batch, rows * cols, p * p * channels))
        length = condition.shape[1]
        check_rotary_range(length, rows, cols, self.axes_lens)
        cos, sin = (part.to(latents.device) for part in rope_angles(self.axes, positions(length, rows, cols)))
        for layer in self.context_refiner:
            condition = layer(condition, (cos[:, :length], sin[:, :length]))
        for layer in self.noise_refiner:
            x = layer(x, (cos[:, length:], sin[:, length:]), temb)
        joint = torch.cat([condition, x], dim=1)
        for layer in self.layers:
            joint = layer(joint, (cos, sin), temb)
        out = self.norm_out(joint, temb)[:, length:]
        out = out.reshape(batch, rows, cols, p, p, -1).permute(0, 5, 1, 3, 2, 4)
        return out.reshape(batch, -1, rows * p, cols * p)


def qformer_settings(config: Optional[dict]) -> Optional[dict[str, Any]]:
    """gen_image_condition_refiner_config's fields the Q-Former takes (None: no Q-Former)."""
    if config is None:
        return None
    names = ("num_queries", "num_layers", "num_heads", "dropout", "norm_eps")
    return {name: config[name] for name in names if name in config}
