"""Cosmos-1.0 autoregressive video world models behind the TokenModel contract.

Network: a Llama-style decoder over video codes only (no text vocabulary, no BOS):
RMSNorm, SwiGLU, GQA with per-head QK-norm, untied head, and a 3-D RoPE whose
head channels are split 44 time / 42 height / 42 width (rotate-half layout,
theta 500000; the 12B/13B stretch each axis with YaRN).  The Video2World
models (5B, 13B) add cross-attention on T5 encoder features after every
self-attention (masked to the prompt's T5 tokens) and a 3-D sin-cos position
embedding added before every layer, and open the video with a <bov> token (id
64000: embedded, never predicted) at a position of its own with zero rotation.
Written from the published structure; parameter names are those of NVIDIA's
`model.pt`, which loads strictly.

Folder layout (what NVIDIA's download script produces)::

    Cosmos-1.0-Autoregressive-4B/        # size from the name: 4B, 12B, 5B-Video2World, 13B-Video2World
        model.pt                         # plain tensor dict (optionally under "model", keys may carry "model.")
        config.json                      # optional; its known keys override the size's architecture
        [tokenizer/] encoder.jit decoder.jit   # or in the sibling folder below, or next to model.pt
        [t5/ ...]                        # Video2World only: a transformers T5 encoder folder (google-t5/t5-11b)
    Cosmos-1.0-Tokenizer-DV8x16x16/      # sibling folder with encoder.jit and decoder.jit

Trust note: `encoder.jit` and `decoder.jit` are TorchScript, i.e. code.  Only
files with exactly those names in the tokenizer folder are ever loaded as
TorchScript; they must come from NVIDIA's official release.

Token layout: latent frames x 40 rows x 64 columns (640 x 1024 pixels, 8 frames per
latent frame after the first).  The context (1 or 9 frames -> 1 or 2 latent frames)
is the prompt; the model then fills every free latent frame, as NVIDIA's pipeline
does: 4 after 1 context frame (10240 tokens, 32 more video frames, 33 in all), 3
after 9 (7680 tokens, 24 more).  `encode_video(..., new_frames=24)` asks for fewer.
No CFG, temperature 1, top-p 0.8 (4B), 0.9 (12B), 0.7 (5B-Video2World), 0.8 (13B-Video2World), no top-k.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...model import check_start, check_tokens, compute_device
from ..weights.checkpoints import ModelLoadError, read_torch_checkpoint
from ..family import Family
from ..weights.quantize import quantize_linears, quantize_then_move
from ..sessions.row_cache import RowCache
from ..sessions.row_session import RowSession
from ..weights.tokenizer_files import positive_int, read_json
from .llamagen import FeedForward, RMSNorm, T5Captioner, _find_t5

WEIGHTS = "model.pt"
FAMILY = Family(
    label="Cosmos", holds="a Cosmos-1.0 autoregressive folder (model.pt)",
    downloads=(("cosmos", "NVIDIA's nvidia/Cosmos-1.0-Autoregressive-4B (or another size) with the tokenizer folder "
                          "nvidia/Cosmos-1.0-Tokenizer-DV8x16x16 next to it"),),
    roots=("Cosmos",), top_p="Cosmos 4B 0.8, 12B 0.9, 5B-Video2World 0.7, 13B-Video2World 0.8",
    video="1 or 9 frames, resized to the model's frame size")
CACHE_TOKENS = 12800  # 9 context frames and 24 generated ones: 5 latent frames (memory estimates)
ENCODER, DECODER = "encoder.jit", "decoder.jit"
TOKENIZER_FOLDER = "Cosmos-1.0-Tokenizer-DV8x16x16"
TEMPORAL, SPATIAL = 8, 16  # DV8x16x16: pixel frames per latent frame (after the first), pixels per code
T5_TOKENS = 512


# ----------------------------------------------------------------------------- configuration

@dataclass(frozen=True)
class CosmosConfig:
    dim: int
    n_layers: int
    n_heads: int = 32
    n_kv_heads: int = 8
    head_dim: int = 128
    ffn_hidden: int = 14336
    vocab_size: int = 64000
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    latent_shape: tuple[int, int, int] = (5, 40, 64)   # (latent frames, rows, cols) the positions cover
    generated_frames: int = 3                          # latent frames the longest context leaves free
    yarn_scale: Optional[float] = None                 # 12B/13B: 2
    yarn_beta_fast: float = 4.0
    yarn_beta_slow: float = 1.0
    original_latent_shape: tuple[int, int, int] = (3, 40, 64)
    cross_attention: bool = False                      # Video2World
    context_dim: int = 1024                            # width of the T5 features
    abs_pos_emb: bool = False                          # Video2World
    begin_of_video: bool = False                       # Video2World: a <bov> token (id vocab_size) opens the video
    top_p: float = 0.8

    @property
    def frame_tokens(self) -> int:
        return self.latent_shape[1] * self.latent_shape[2]

    @property
    def max_context_frames(self) -> int:
        return self.latent_shape[0] - self.generated_frames


BASE_4B = CosmosConfig(dim=4096, n_layers=16)
BASE_12B = CosmosConfig(dim=5120, n_layers=40, yarn_scale=2.0, top_p=0.9)
# top-p: the values NVIDIA's Cosmos-1.0 autoregressive README gives each model's commands ("tuned ... to achieve
# the best performance"), not its script's --top_p default (0.8 for every size)
SIZES = {"4B": BASE_4B, "12B": BASE_12B,
         "5B-Video2World": replace(BASE_4B, cross_attention=True, abs_pos_emb=True, begin_of_video=True,
                                   top_p=0.7),
         "13B-Video2World": replace(BASE_12B, cross_attention=True, abs_pos_emb=True, begin_of_video=True,
                                    top_p=0.8)}
SIZE_IN_NAME = re.compile(r"(?<![0-9])(4B|12B|5B-Video2World|13B-Video2World)(?![0-9A-Za-z])", re.I)
# config.json keys read as overrides (NVIDIA's names on the left); anything else in the file is ignored.
OVERRIDES = {"dim": "dim", "n_layers": "n_layers", "n_heads": "n_heads", "n_kv_heads": "n_kv_heads",
             "head_dim": "head_dim", "ffn_hidden_size": "ffn_hidden", "vocab_size": "vocab_size",
             "norm_eps": "norm_eps", "rope_theta": "rope_theta", "video_latent_shape": "latent_shape",
             "generated_frames": "generated_frames", "yarn_scale": "yarn_scale",
             "yarn_beta_fast": "yarn_beta_fast", "yarn_beta_slow": "yarn_beta_slow",
             "original_latent_shape": "original_latent_shape", "insert_cross_attn": "cross_attention",
             "context_dim": "context_dim", "apply_abs_pos_emb": "abs_pos_emb", "top_p": "top_p",
             "begin_of_video": "begin_of_video"}
SIZE_FIELDS = ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_hidden", "vocab_size", "context_dim",
               "generated_frames")


def size_from_name(folder: Path) -> Optional[str]:
    match = SIZE_IN_NAME.search(folder.name)
    if match is None:
        return None
    return next(size for size in SIZES if size.lower() == match.group(1).lower())


def _head_sizes(data: dict[str, Any], overrides: dict[str, Any], base: CosmosConfig) -> dict[str, int]:
    """head_dim and n_kv_heads where config.json leaves them to be derived, as NVIDIA's ModelConfig does.

    A null head_dim, or none beside a new dim or n_heads, is dim // n_heads (the size's own head_dim
    belongs to the size's own dim and heads); a null n_kv_heads is n_heads.
    """
    dim, n_heads = overrides.get("dim", base.dim), overrides.get("n_heads", base.n_heads)
    derived = {}
    if "n_kv_heads" in data and data["n_kv_heads"] is None:
        derived["n_kv_heads"] = n_heads
    if "head_dim" not in overrides and ("head_dim" in data or "dim" in overrides or "n_heads" in overrides):
        derived["head_dim"] = dim // n_heads
    return derived


def config_for(folder: Path) -> CosmosConfig:
    """The size named by the folder, with config.json's known keys applied on top.

    A null value (NVIDIA's ModelConfig writes its unset fields as null) keeps the size's value, or the
    derived one where NVIDIA derives it (head_dim, n_kv_heads).
    """
    size = size_from_name(folder)
    overrides: dict[str, Any] = {}
    data: dict[str, Any] = {}
    if (folder / "config.json").is_file():
        data = read_json(folder / "config.json")
        overrides = {OVERRIDES[k]: v for k, v in data.items() if k in OVERRIDES and v is not None}
        if data.get("apply_yarn") is False:
            overrides["yarn_scale"] = None
    if size is None and "dim" not in overrides:
        raise ModelLoadError(f"{folder}: cannot tell the Cosmos size; keep NVIDIA's folder name "
                             f"(e.g. Cosmos-1.0-Autoregressive-4B; sizes {', '.join(SIZES)}) or give the "
                             "architecture (dim, n_layers, ...) in config.json")
    base = SIZES[size] if size is not None else BASE_4B
    json_names = {field: name for name, field in OVERRIDES.items()}
    for key in ("latent_shape", "original_latent_shape"):
        value = overrides.get(key)
        if value is None:
            continue
        if not (isinstance(value, list) and len(value) == 3 and all(isinstance(v, int) and v > 0 for v in value)):
            raise ModelLoadError(f"{folder / 'config.json'}: {json_names[key]} must be a list of 3 positive "
                                 f"integers, got {value!r}")
        overrides[key] = tuple(value)
    for key in SIZE_FIELDS:
        if key in overrides:
            positive_int(overrides[key], json_names[key], folder / "config.json")
    overrides.update(_head_sizes(data, overrides, base))
    try:
        config = replace(base, **overrides)
    except TypeError as err:
        raise ModelLoadError(f"{folder / 'config.json'}: {err}") from err
    if not 0 < config.generated_frames < config.latent_shape[0]:
        raise ModelLoadError(f"{folder}: generated_frames must leave room for at least one context latent frame "
                             f"in latent_shape {config.latent_shape}")
    if config.head_dim % 2 or config.dim % 2:
        raise ModelLoadError(f"{folder}: head_dim {config.head_dim} and dim {config.dim} must be even to be split "
                             "over the time, height and width axes")
    return config


# ----------------------------------------------------------------------------- positions

def yarn_factors(inv_freq: torch.Tensor, original_length: int, cfg: CosmosConfig) -> torch.Tensor:
    """Per-frequency YaRN scale: 1/scale for slow (long-wavelength) channels, 1 for fast ones, linear between."""
    fast = 2 * math.pi * cfg.yarn_beta_fast / original_length
    slow = 2 * math.pi * cfg.yarn_beta_slow / original_length
    ramp = ((inv_freq - slow) / (fast - slow)).clamp(0, 1)
    return (1 - ramp) / cfg.yarn_scale + ramp


def _axis_frequencies(channels: int, cfg: CosmosConfig, original_length: int) -> torch.Tensor:
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, channels, 2)[:channels // 2].double() / channels)
    if cfg.yarn_scale is not None:
        inv_freq = inv_freq * yarn_factors(inv_freq, original_length, cfg)
    return inv_freq


def _bov_row(table: torch.Tensor, cfg: CosmosConfig) -> torch.Tensor:
    # Video2World's <bov> token sits before the video at sequence position 0, with an all-zero position row.
    return torch.cat([table.new_zeros(1, table.shape[1]), table]) if cfg.begin_of_video else table


def rope_table_3d(cfg: CosmosConfig) -> torch.Tensor:
    """(T*H*W, head_dim) rotation angles, positions ordered frame, row, column (a zero row first with <bov>).

    Half the head is [22 time, 21 height, 21 width] frequencies; the table repeats
    it for the rotate-half layout.  Height and width share one frequency set; with
    YaRN, time is stretched against the original frame count and space against the
    original row count.
    """
    frames, rows, cols = cfg.latent_shape
    spatial_channels = cfg.head_dim // 6 * 2
    temporal = _axis_frequencies(cfg.head_dim - 2 * spatial_channels, cfg, cfg.original_latent_shape[0])
    spatial = _axis_frequencies(spatial_channels, cfg, cfg.original_latent_shape[1])
    t, h, w = torch.meshgrid(torch.arange(frames), torch.arange(rows), torch.arange(cols), indexing="ij")
    half = torch.cat([t.reshape(-1, 1) * temporal, h.reshape(-1, 1) * spatial, w.reshape(-1, 1) * spatial], dim=1)
    return _bov_row(torch.cat([half, half], dim=1).float(), cfg)


def apply_rope(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """x (B, T, heads, D) rotated rotate-half style by angles (B or 1, T, D); computed in float32."""
    xf = x.float()
    first, second = xf.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    cos, sin = angles.cos()[:, :, None], angles.sin()[:, :, None]
    return (xf * cos + rotated * sin).type_as(x)


def sincos_1d(channels: int, count: int) -> torch.Tensor:
    """(count, channels): [sin | cos] of position * 10000^(-i / (channels/2))."""
    omega = 1.0 / 10000 ** (torch.arange(channels // 2, dtype=torch.float64) / (channels / 2))
    angles = torch.arange(count, dtype=torch.float64)[:, None] * omega
    return torch.cat([angles.sin(), angles.cos()], dim=1)


def sincos_table_3d(cfg: CosmosConfig) -> torch.Tensor:
    """(1 + T*H*W, dim) absolute position embedding of the Video2World models: a zero row for <bov>, then
    [time | height | width] blocks."""
    frames, rows, cols = cfg.latent_shape
    spatial = cfg.dim // 6 * 2
    parts = [sincos_1d(cfg.dim - 2 * spatial, frames)[:, None, None].expand(frames, rows, cols, -1),
             sincos_1d(spatial, rows)[None, :, None].expand(frames, rows, cols, -1),
             sincos_1d(spatial, cols)[None, None, :].expand(frames, rows, cols, -1)]
    return _bov_row(torch.cat(parts, dim=-1).reshape(frames * rows * cols, cfg.dim).float(), cfg)


# ----------------------------------------------------------------------------- network

class Attention(nn.Module):
    """GQA with per-head RMS QK-norm; self-attention (RoPE, KV cache) or cross-attention (no RoPE, no mask)."""

    def __init__(self, cfg: CosmosConfig, source_dim: int):
        super().__init__()
        self.cfg = cfg
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(source_dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(source_dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)

    def keys_values(self, source: torch.Tensor, angles: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, heads_kv, S, D) keys and values of `source`, rotated when `angles` is given."""
        b, s, _ = source.shape
        k = self.k_norm(self.wk(source).view(b, s, self.cfg.n_kv_heads, self.cfg.head_dim))
        if angles is not None:
            k = apply_rope(k, angles)
        v = self.wv(source).view(b, s, self.cfg.n_kv_heads, self.cfg.head_dim)
        return k.transpose(1, 2), v.transpose(1, 2)

    def attend(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, angles: Optional[torch.Tensor],
               mask: Optional[torch.Tensor]) -> torch.Tensor:
        cfg, (b, t, _) = self.cfg, x.shape
        q = self.q_norm(self.wq(x).view(b, t, cfg.n_heads, cfg.head_dim))
        if angles is not None:
            q = apply_rope(q, angles)
        groups = cfg.n_heads // cfg.n_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(b, t, cfg.n_heads * cfg.head_dim))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: CosmosConfig):
        super().__init__()
        self.attention = Attention(cfg, cfg.dim)
        self.feed_forward = FeedForward(cfg)
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        if cfg.cross_attention:
            self.cross_attention = Attention(cfg, cfg.context_dim)
            self.cross_attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, x: torch.Tensor, angles: torch.Tensor, mask: torch.Tensor, cache: RowCache, layer: int,
                text_kv: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        normed = self.attention_norm(x)
        k, v = cache.write(layer, *self.attention.keys_values(normed, angles))
        h = x + self.attention.attend(normed, k, v, angles, mask)
        if text_kv is not None:
            k, v, mask = text_kv
            h = h + self.cross_attention.attend(self.cross_attention_norm(h), k, v, None, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class CosmosTransformer(nn.Module):
    def __init__(self, cfg: CosmosConfig):
        super().__init__()
        self.config = cfg
        # Video2World embeds one more id, <bov>, than its head predicts
        self.tok_embeddings = nn.Embedding(cfg.vocab_size + cfg.begin_of_video, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.register_buffer("rope", rope_table_3d(cfg), persistent=False)
        if cfg.abs_pos_emb:
            self.register_buffer("pos_emb", sincos_table_3d(cfg), persistent=False)

    def text_keys_values(self, text: torch.Tensor, mask: torch.Tensor
                         ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Cross-attention keys, values and key mask of T5 features (B, S, context_dim) with their token
        mask (B, S), once per generation."""
        mask = mask.bool()[:, None, None, :]
        return [(*layer.cross_attention.keys_values(text.to(self.output.weight.dtype), None), mask)
                for layer in self.layers]

    def forward(self, h: torch.Tensor, cache: RowCache,
                text_kv: Optional[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = None,
                last_only: bool = False, branches: int = 1
                ) -> torch.Tensor:
        """Embedded codes (B, T, dim) (`tok_embeddings`) after each row's cached positions (a tree with `branches`
        > 1) -> float32 logits (B, T, vocab), or (B, 1, vocab) of the last position only (a 5120-token context
        would otherwise give 1.3 GB of logits per row)."""
        positions, visible = cache.begin(h.shape[1], branches)
        # left padding (contexts of other lengths in one cache) takes no position; positions past the last (a
        # finished row's window) only give logits that are never used
        positions = (positions - cache.pads).clamp(0, self.rope.shape[0] - 1)
        angles = self.rope[positions]
        for i, layer in enumerate(self.layers):
            if self.config.abs_pos_emb:
                h = h + self.pos_emb[positions].to(h.dtype)
            h = layer(h, angles, visible[:, None], cache, i, None if text_kv is None else text_kv[i])
        return self.output(self.norm(h[:, -1:] if last_only else h)).float()


def official_keys(cfg: CosmosConfig) -> set[str]:
    """Every parameter name in NVIDIA's model.pt for this architecture."""
    keys = {"tok_embeddings.weight", "norm.weight", "output.weight"}
    attention = ("wq", "wk", "wv", "wo", "q_norm", "k_norm")
    for i in range(cfg.n_layers):
        keys |= {f"layers.{i}.attention.{name}.weight" for name in attention}
        keys |= {f"layers.{i}.{name}.weight" for name in ("attention_norm", "ffn_norm")}
        keys |= {f"layers.{i}.feed_forward.{name}.weight" for name in ("w1", "w2", "w3")}
        if cfg.cross_attention:
            keys |= {f"layers.{i}.cross_attention.{name}.weight" for name in attention}
            keys.add(f"layers.{i}.cross_attention_norm.weight")
    return keys


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """model.pt as a flat dict: optional "model" nesting and "model." prefix removed, `_extra_state` dropped."""
    state = read_torch_checkpoint(path, keys=("model",))
    return {key.removeprefix("model."): value for key, value in state.items() if not key.endswith("_extra_state")}


def transformer_from_state_dict(state: dict[str, torch.Tensor], cfg: CosmosConfig, source: Path) -> CosmosTransformer:
    expected = official_keys(cfg)
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        def some(keys: list[str]) -> str:
            return ", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")
        problems = ([f"missing {some(missing)}"] if missing else []) + ([f"unexpected {some(unexpected)}"]
                                                                          if unexpected else [])
        raise ModelLoadError(f"{source} does not match the Cosmos {cfg.n_layers}-layer layout "
                             f"({'; '.join(problems)}); is the folder name (size) right?")
    with torch.device("meta"):  # no random initialisation of weights that are replaced anyway
        net = CosmosTransformer(cfg)
    try:
        net.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as err:
        raise ModelLoadError(f"{source} does not match the Cosmos architecture read from the folder name and "
                             f"config.json ({' '.join(str(err).split())[:300]})") from err
    net.rope = rope_table_3d(cfg)  # buffers are not stored in model.pt
    if cfg.abs_pos_emb:
        net.pos_emb = sincos_table_3d(cfg)
    return net.eval()


# ----------------------------------------------------------------------------- tokenizer

def find_tokenizer(folder: Path) -> Path:
    """The folder holding encoder.jit / decoder.jit: the model folder, its tokenizer/, or the sibling folder."""
    candidates = (folder, folder / "tokenizer", folder.parent / TOKENIZER_FOLDER)
    for candidate in candidates:
        present = [name for name in (ENCODER, DECODER) if (candidate / name).is_file()]
        if len(present) == 2:
            return candidate
        if present:
            missing = DECODER if present == [ENCODER] else ENCODER
            raise ModelLoadError(f"{candidate} has {present[0]} but no {missing}; copy both files of "
                                 f"{TOKENIZER_FOLDER} from NVIDIA's release")
    raise ModelLoadError(f"Cosmos tokenizer not found: no {ENCODER} / {DECODER} in "
                         f"{', '.join(str(c) for c in candidates)}; download {TOKENIZER_FOLDER} next to the model "
                         "folder (or into its tokenizer/ subfolder)")


def load_torchscript(path: Path) -> torch.jit.ScriptModule:
    # TorchScript is code: only the two named files of the official tokenizer are loaded this way.
    try:
        with warnings.catch_warnings():  # torch 2.14 deprecates TorchScript; NVIDIA ships the tokenizer in it
            warnings.simplefilter("ignore", FutureWarning)
            module = torch.jit.load(str(path), map_location="cpu")
    except Exception as err:  # torch.jit raises RuntimeError or its own error types for bad archives
        raise ModelLoadError(f"{path} is not a loadable TorchScript file ({str(err).splitlines()[0]}); "
                             "download it again from NVIDIA's Cosmos tokenizer release") from err
    return module.eval()


def _indices(encoded: Any) -> torch.Tensor:
    # The official encoder returns (int32 indices, codes, dummy loss).
    return (encoded[0] if isinstance(encoded, (tuple, list)) else encoded).long()


# ----------------------------------------------------------------------------- conditioning

@dataclass(frozen=True)
class VideoContext:
    """The prompt of a continuation: context codes (+ T5 features for Video2World)."""

    codes: torch.Tensor                  # (latent frames * rows * cols,) long, CPU
    text: Optional[torch.Tensor] = None       # (T5_TOKENS, context_dim) float32, zero after the prompt's tokens
    text_mask: Optional[torch.Tensor] = None  # (T5_TOKENS,) bool, True at the prompt's tokens
    latent_frames: Optional[int] = None        # latent frames to sample after it; None: every free one


class CosmosT5(T5Captioner):
    """T5 features as Video2World reads them: the prompt's tokens, then zeros up to 512 rows, and the mask."""

    repository = "google-t5/t5-11b"

    def forward(self, text: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, attention = self.encoded(text, device)
        mask = attention.bool()
        return hidden * mask[:, None], mask


# ----------------------------------------------------------------------------- adapter

class TransformerRows:
    """The transformer as a `row_session.RowNetwork`; a row's extras are its cross-attention keys, values and key
    mask, three per layer (Video2World)."""

    def __init__(self, net: CosmosTransformer) -> None:
        self.net = net
        self.embed_context = self.embed_tokens = net.tok_embeddings

    def __call__(self, cache: RowCache, inputs: torch.Tensor, extras: Sequence[torch.Tensor], branches: int,
                 last_only: bool) -> torch.Tensor:
        text_kv = [extras[i:i + 3] for i in range(0, len(extras), 3)] or None
        return self.net(inputs, cache, text_kv, last_only, branches)


class CosmosSession(RowSession):
    """One generation: batch rows share the context, each advances at its own pace; no CFG branch."""

    def __init__(self, model: "CosmosModel", cond: VideoContext, batch_size: int):
        check_start(cond, VideoContext, "CosmosModel.encode_video()", batch_size)
        net = model.module["transformer"]
        cfg = net.config
        device = model.device
        context = cond.codes
        if cfg.begin_of_video:
            context = torch.cat([torch.tensor([cfg.vocab_size]), context])
        if context.numel() + model.num_tokens > net.rope.shape[0]:
            raise ValueError(f"a context of {cond.codes.numel() // cfg.frame_tokens} latent frames leaves no room for "
                             f"{model.num_tokens} generated tokens in the model's {cfg.latent_shape} positions")
        extras: list[torch.Tensor] = []
        if cfg.cross_attention:
            if cond.text is None or cond.text_mask is None:
                raise ValueError("this Video2World model needs a prompt: encode the context with a prompt")
            with torch.no_grad():
                extras = [part for layer in net.text_keys_values(cond.text.to(device).expand(batch_size, -1, -1),
                                                                 cond.text_mask.to(device).expand(batch_size, -1))
                          for part in layer]
        # the context frames are the prefix tokens: the engine copies previous-frame drafts from them
        super().__init__(context.to(device).expand(batch_size, -1), model.num_tokens, TransformerRows(net),
                         copies=1, extras=extras, prefix_tokens=cond.codes)


class CosmosModel:
    """A loaded Cosmos transformer + DV8x16x16 tokenizer (+ T5 encoder for Video2World)."""

    family = "cosmos"
    default_cfg_scale = None
    default_top_k = None
    default_temperature = 1.0
    default_draft_init = "previous_frame"
    decodes_context = True  # decode(tokens, cond) puts the context frames in front

    def __init__(self, net: CosmosTransformer, encoder: nn.Module, decoder: nn.Module, size: str,
                 t5: Optional[CosmosT5] = None):
        cfg = net.config
        self.config, self.size = cfg, size
        self.vocab_size = cfg.vocab_size
        self._sample_latent_frames(cfg.generated_frames)  # until a context is encoded
        self.default_top_p = cfg.top_p
        self.frame_size = (cfg.latent_shape[1] * SPATIAL, cfg.latent_shape[2] * SPATIAL)
        parts = {"transformer": net, "encoder": encoder, "decoder": decoder}
        if t5 is not None:
            parts["t5"] = t5
        self.module = nn.ModuleDict(parts)

    @property
    def device(self) -> torch.device:
        return compute_device(self, self.module["transformer"].output.weight)

    @property
    def context_frame_counts(self) -> tuple[int, ...]:
        """Pixel frame counts accepted as context: 1, 9, ... (1 + 8k, up to the free latent frames)."""
        return tuple(1 + TEMPORAL * k for k in range(self.config.max_context_frames))

    def _sample_latent_frames(self, count: int) -> None:
        """Generations from now on sample `count` latent frames (the grid and token count follow; `start`
        switches to its context's count)."""
        self.grid = (count, *self.config.latent_shape[1:])
        self.num_tokens = count * self.config.frame_tokens

    def latent_frames_to_sample(self, context_frames: int, new_frames: int = 0) -> int:
        """Latent frames a continuation of `context_frames` pixel frames samples: every free one for
        `new_frames` 0 (NVIDIA's pipeline), else new_frames / 8 (a multiple of 8 up to the free frames)."""
        free = self.config.latent_shape[0] - (1 + (context_frames - 1) // TEMPORAL)
        if new_frames == 0:
            return free
        if not (isinstance(new_frames, int) and new_frames % TEMPORAL == 0 and 0 < new_frames <= TEMPORAL * free):
            raise ValueError(f"new_frames must be 0 (every free frame: {TEMPORAL * free} after {context_frames} "
                             f"context frames) or a multiple of {TEMPORAL} up to {TEMPORAL * free}, got {new_frames}")
        return new_frames // TEMPORAL

    def encode(self, prompt: str, negative_prompt: Optional[str] = None) -> VideoContext:
        raise ValueError("Cosmos continues a video: give it context frames (the SCD Video Context node, or "
                         "encode_video(frames, prompt) from Python)")

    def _device_of(self, module: nn.Module) -> torch.device:
        return compute_device(self, next(iter(module.parameters()), self.module["transformer"].output.weight))

    def _whole_chunk(self, module: nn.Module, x: torch.Tensor, dim: int, chunk: int) -> Any:
        """module(x), or, if it refuses x's length along `dim`, module(x padded with its last slice to `chunk`).

        NVIDIA's pipeline only runs its tokenizer on whole chunks (latent_shape[0] latent frames, 33 video
        frames), and a TorchScript file may have been traced for that length.  The tokenizer is causal in
        time, so padding at the end leaves the frames before it as they were; callers drop the padding.
        """
        try:
            return module(x)
        except (RuntimeError, torch.jit.Error):  # a failing TorchScript op raises torch.jit.Error
            if x.shape[dim] >= chunk:
                raise
            pad = x.narrow(dim, x.shape[dim] - 1, 1).expand(*x.shape[:dim], chunk - x.shape[dim], *x.shape[dim + 1:])
            return module(torch.cat([x, pad], dim=dim))

    def _decode_latents(self, codes: torch.Tensor) -> torch.Tensor:
        """(B, T', rows, cols) codes -> (B, 3, 1 + 8 (T' - 1), H, W) video in [-1, 1]."""
        decoder = self.module["decoder"]
        frames = 1 + TEMPORAL * (codes.shape[1] - 1)
        video = self._whole_chunk(decoder, codes.to(self._device_of(decoder)), 1, self.config.latent_shape[0])
        return video[:, :, :frames]

    def _tokenizer_dtype(self, module: nn.Module) -> torch.dtype:
        weight = next(iter(module.parameters()), None)
        return weight.dtype if weight is not None else self.module["transformer"].output.weight.dtype

    @torch.no_grad()
    def encode_video(self, frames: torch.Tensor, prompt: Optional[str] = None, new_frames: int = 0) -> VideoContext:
        """Context frames (F, H, W, 3) in 0..1 (F = 1 or 9) -> VideoContext; other sizes are resized.

        Video2World models also need the prompt; the others refuse one, as they have no text input.  Its
        continuations have `new_frames` more frames (`latent_frames_to_sample`; 0: all the model has room for).
        """
        if not isinstance(frames, torch.Tensor) or frames.dim() != 4 or frames.shape[-1] != 3:
            shape = tuple(frames.shape) if isinstance(frames, torch.Tensor) else type(frames).__name__
            raise ValueError(f"context frames must be an image batch (frames, height, width, 3), got {shape}")
        if frames.shape[0] not in self.context_frame_counts:
            counts = " or ".join(map(str, self.context_frame_counts))
            raise ValueError(f"Cosmos takes {counts} context frames, got {frames.shape[0]}; trim the clip "
                             f"(e.g. load only its last {self.context_frame_counts[-1]} frames)")
        sampled = self.latent_frames_to_sample(frames.shape[0], new_frames)
        text = text_mask = None
        if self.config.cross_attention:
            if not prompt or not prompt.strip():
                raise ValueError("this Video2World model needs a text prompt describing the continuation")
            text, text_mask = self.module["t5"](prompt, self.device)
        elif prompt and prompt.strip():
            raise ValueError(f"Cosmos-1.0-Autoregressive-{self.size} has no text input; leave the prompt empty "
                             "(the Video2World models take one)")
        encoder = self.module["encoder"]
        video = frames.permute(3, 0, 1, 2).unsqueeze(0).float()  # (1, 3, F, H, W)
        if tuple(video.shape[-2:]) != self.frame_size:
            video = F.interpolate(video[0].transpose(0, 1), size=self.frame_size, mode="bilinear",
                                  antialias=True, align_corners=False).transpose(0, 1).unsqueeze(0)
        video = (video.clamp(0, 1) * 2 - 1).to(device=self._device_of(encoder), dtype=self._tokenizer_dtype(encoder))
        latent = 1 + (frames.shape[0] - 1) // TEMPORAL
        chunk = 1 + TEMPORAL * (self.config.latent_shape[0] - 1)
        codes = _indices(self._whole_chunk(encoder, video, 2, chunk))
        codes = codes[:, :latent]
        expected = (1, latent, *self.grid[1:])
        if tuple(codes.shape) != expected:
            raise ModelLoadError(f"the tokenizer's {ENCODER} returned codes of shape {tuple(codes.shape)}, "
                                 f"expected {expected}; it does not belong to this model")
        self._sample_latent_frames(sampled)
        return VideoContext(codes=codes.reshape(-1).cpu(), text=text, text_mask=text_mask, latent_frames=sampled)

    def start(self, cond: VideoContext, batch_size: int) -> CosmosSession:
        if isinstance(cond, VideoContext):  # the length asked for with this context wins (the session checks the rest)
            free = self.config.latent_shape[0] - cond.codes.numel() // self.config.frame_tokens
            self._sample_latent_frames(cond.latent_frames or free)
        return CosmosSession(self, cond, batch_size)

    @torch.no_grad()
    def preview_frame(self, prefix: torch.Tensor) -> torch.Tensor:
        """The latent frame being sampled, from a row's committed codes (1, done): (H, W, 3), pending rows gray.

        One latent frame decodes alone as one picture, so a preview costs a small share of a full decode.
        """
        done = prefix.shape[1]
        frame_tokens = self.config.frame_tokens
        frame = min(done, self.num_tokens - 1) // frame_tokens
        codes = torch.zeros(1, frame_tokens, dtype=torch.long)
        filled = prefix[0, frame * frame_tokens:done].cpu()
        codes[0, :filled.numel()] = filled
        image = (self._decode_latents(codes.view(1, 1, *self.grid[1:])).float()[0, :, 0] * 0.5 + 0.5).clamp(0, 1)
        image = image.permute(1, 2, 0).cpu()
        rows, cols = self.grid[1:]
        rows_done = filled.numel() // cols
        image[image.shape[0] * rows_done // rows:] = 0.5
        return image

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, cond: Optional[VideoContext] = None) -> torch.Tensor:
        """Codes (batch, N) -> frames (batch * F, H, W, 3) float32 CPU in 0..1, each row's frames in order.

        With `cond`, the context codes are decoded in front (the whole clip, as NVIDIA's
        pipeline returns it); without, only the generated latent frames.
        """
        check_tokens(tokens, self.num_tokens, self.vocab_size, "codes")
        if cond is not None:
            tokens = torch.cat([cond.codes.to(tokens.device).expand(tokens.shape[0], -1), tokens], dim=1)
        video = self._decode_latents(tokens.long().reshape(tokens.shape[0], -1, *self.grid[1:]))
        frames = (video.float() * 0.5 + 0.5).clamp(0, 1)
        return frames.permute(0, 2, 3, 4, 1).flatten(0, 1).cpu()


# ----------------------------------------------------------------------------- folders

def detect(folder: Path) -> bool:
    folder = Path(folder)
    if not (folder / WEIGHTS).is_file():
        return False
    return "cosmos" in folder.name.lower() or size_from_name(folder) is not None


def _t5_folder(folder: Path) -> Optional[Path]:
    """The T5 encoder folder in `folder`: config.json's "t5_folder", else the first one found inside; None
    when there is no such folder."""
    settings = read_json(folder / "config.json") if (folder / "config.json").is_file() else {}
    t5_folder = folder / settings["t5_folder"] if settings.get("t5_folder") else _find_t5(folder)
    return t5_folder if t5_folder is not None and Path(t5_folder).is_dir() else None


def text_encoder_folder(folder: Path) -> Optional[Path]:
    """The T5 encoder folder `load` reads (Video2World), for memory estimates; None without one."""
    folder = Path(folder)
    return _t5_folder(folder) if config_for(folder).cross_attention else None


def load(folder: Path, device: torch.device, dtype: torch.dtype, quantize: str = "none") -> CosmosModel:
    """Load a Cosmos-1.0 autoregressive folder onto `device`, computing in `dtype`, the transformer blocks'
    linear layers (and the T5 encoder's, Video2World) at `quantize` precision (quantize.PRECISIONS)."""
    folder = Path(folder)
    cfg = config_for(folder)
    tokenizer = find_tokenizer(folder)  # before the big read: a missing file fails fast
    net = transformer_from_state_dict(read_state_dict(folder / WEIGHTS), cfg, folder / WEIGHTS)
    # before the cast: each layer is read from the memory-mapped model.pt and quantised on its own
    quantize_linears(net.layers, quantize, dtype)
    encoder, decoder = load_torchscript(tokenizer / ENCODER), load_torchscript(tokenizer / DECODER)
    t5 = None
    if cfg.cross_attention:
        t5_folder = _t5_folder(folder)
        if t5_folder is None:
            raise ModelLoadError(f"{folder}: Video2World needs the T5 text encoder (transformers folder of "
                                 f"google-t5/t5-11b with config.json, weights and tokenizer files) inside the "
                                 f"model folder, e.g. {folder / 't5'}, or named by \"t5_folder\" in config.json")
        t5 = CosmosT5(Path(t5_folder), dtype, T5_TOKENS, quantize)
    size = size_from_name(folder) or "custom"
    model = CosmosModel(net.to(dtype), encoder.to(dtype), decoder.to(dtype), size, t5)
    quantize_then_move(model.module, net.layers, "none", dtype, device)
    return model
