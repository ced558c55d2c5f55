"""LlamaGen (class- and text-conditional) behind the TokenModel contract.

Network: a Llama-style decoder (RMSNorm, SwiGLU, fused qkv, untied head) with
2-D RoPE over the image token grid, written from the published LlamaGen facts.
Parameter names match the original checkpoints (`c2i_B_256.pt`, `t2i_XL_stage1_256.pt`,
...), which load unchanged.

Folder layouts recognised by `detect` / `load`:

1. A `llamagen.json` (or a `config.json` with `"model_type": "llamagen"`)::

       {"model_type": "llamagen",
        "gpt_checkpoint": "c2i_B_256.pt",      # .pt tensor dict or .safetensors
        "vq_checkpoint": "vq_ds16_c2i.pt",
        "image_size": 256,                      # pixels; token grid = image_size / VQ downsampling
        "n_head": 12,                           # optional: else from "preset" ("GPT-B" ...) or the width
        "preset": "GPT-B",                      # optional
        "vq": {"norm_groups": 32},              # optional: VQ details not stored in the weights
        "t5_folder": "flan-t5-xl",              # text-conditional only: transformers T5 folder
        "cfg_scale": 4.0, "top_k": 2000,        # optional sampling defaults
        "family": "llamagen",                   # optional label ("demo" for the embedded demo)
        "class_names": ["0", "1", ...]}         # optional, class-conditional only

   Relative paths are relative to the folder.
2. The original files side by side: a GPT checkpoint named `c2i_<size>_<px>.pt` or
   `t2i_<size>_..._<px>.pt` and a VQ checkpoint `vq_ds16_*.pt`; the preset and image
   size come from the GPT file name, everything else from the weight shapes.  For
   text-conditional models the FLAN-T5 encoder folder (config.json with model_type
   "t5") must be inside the folder (any depth up to 3), e.g. `t5-ckpt/flan-t5-xl/`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..text.captions import clean_caption
from ..weights.checkpoints import ModelLoadError, read_weights
from ..family import Family
from ..tokenizers.image_encoder import LazyImageEncoder
from ..weights.quantize import quantize_linears, quantize_then_move
from ..sessions.row_cache import LayerSlots, RowCache
from ..sessions.row_session import RowSession
from ..text.t5_encoder import load_t5_encoder
from ..weights.tokenizer_files import positive_int, without_nulls
from ...images.image_input import no_image_encoder
from ...compiled.compilable import Compilable
from ...model import check_batch_size, check_tokens, compute_device
from ..tokenizers.vq16 import ENCODER_KEYS, VQModel, encoder_from_state_dict, vq_from_state_dict

IMAGENET_CLASSES = 1000  # the original class-conditional checkpoints

# Attention heads of the published sizes, keyed by model width (all use 64-wide heads except 3B/7B).
PRESETS = {"GPT-B": (768, 12), "GPT-L": (1024, 16), "GPT-XL": (1280, 20), "GPT-XXL": (1536, 24),
           "GPT-XXXL": (2560, 40), "GPT-1B": (2048, 32), "GPT-3B": (3200, 32), "GPT-7B": (4096, 32)}
HEADS_BY_WIDTH = {dim: heads for dim, heads in PRESETS.values()}
T5_MAX_TOKENS = 120
# The VQ's encoder side: loaded on the first image in the prompt only (memory estimates leave it out).
UNUSED_WEIGHTS = ENCODER_KEYS
FAMILY = Family(
    label="LlamaGen", also="demo", holds="a LlamaGen folder (GPT and VQ checkpoints)",
    downloads=(("llamagen", "a LlamaGen GPT checkpoint such as c2i_B_256.pt and the VQ checkpoint vq_ds16_c2i.pt "
                            "(Hugging Face FoundationVision/LlamaGen)"),),
    roots=("LlamaGen",), cfg="demo 2, LlamaGen 4 / text 7.5",
    top_k="demo 2, LlamaGen 2000 / text 1000", class_index="demo, LlamaGen c2i", compile=True)


# ----------------------------------------------------------------------------- network

@dataclass(frozen=True)
class GPTConfig:
    dim: int
    n_layer: int
    n_head: int
    n_kv_head: int
    ffn_hidden: int
    vocab_size: int
    grid_size: int              # image tokens per side
    task: str = "c2i"           # "c2i" (class label) or "t2i" (caption features)
    num_classes: int = IMAGENET_CLASSES  # c2i: the embedding table holds one more row, the CFG "null" class
    caption_dim: int = 2048     # t2i: width of the T5 features
    cls_token_num: int = 1      # conditioning positions before the image tokens
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def num_tokens(self) -> int:
        return self.grid_size ** 2


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_table_2d(cfg: GPTConfig) -> torch.Tensor:
    """(cls_token_num + grid^2, head_dim/2, 2) cos/sin per rotated pair, row-major over the grid.

    The first quarter of each head's pairs turns with the row index, the second
    with the column.  The conditioning rows hold cos = sin = 0, as in the original
    table: that zeroes q and k there, and the checkpoints were trained that way.
    """
    quarter = cfg.head_dim // 4
    freqs = 1.0 / (cfg.rope_base ** (torch.arange(0, 2 * quarter, 2)[:quarter].float() / (2 * quarter)))
    angles = torch.outer(torch.arange(cfg.grid_size).float(), freqs)  # (grid, quarter)
    g = cfg.grid_size
    grid = torch.cat([angles[:, None, :].expand(g, g, quarter), angles[None, :, :].expand(g, g, quarter)], dim=-1)
    table = torch.stack([grid.cos(), grid.sin()], dim=-1).flatten(0, 1)
    return torch.cat([torch.zeros(cfg.cls_token_num, 2 * quarter, 2), table])


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """x (B, T, H, D) rotated pairwise (interleaved pairs) by table (B or 1, T, D/2, 2); computed in float32."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    cos, sin = table[:, :, None, :, 0], table[:, :, None, :, 1]
    out = torch.stack([pairs[..., 0] * cos - pairs[..., 1] * sin, pairs[..., 1] * cos + pairs[..., 0] * sin], -1)
    return out.flatten(3).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wqkv = nn.Linear(cfg.dim, (cfg.n_head + 2 * cfg.n_kv_head) * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, mask: Optional[torch.Tensor],
                cache: Optional[LayerSlots]) -> torch.Tensor:
        cfg, (b, t, _) = self.cfg, x.shape
        kv = cfg.n_kv_head * cfg.head_dim
        q, k, v = self.wqkv(x).split([cfg.dim, kv, kv], dim=-1)
        q = apply_rope(q.view(b, t, cfg.n_head, cfg.head_dim), rope).transpose(1, 2)
        k = apply_rope(k.view(b, t, cfg.n_kv_head, cfg.head_dim), rope).transpose(1, 2)
        v = v.view(b, t, cfg.n_kv_head, cfg.head_dim).transpose(1, 2)
        if cache is not None:
            k, v = cache.write(k, v)
        if cfg.n_kv_head != cfg.n_head:
            k = k.repeat_interleave(cfg.n_head // cfg.n_kv_head, dim=1)
            v = v.repeat_interleave(cfg.n_head // cfg.n_kv_head, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.wo(out.transpose(1, 2).reshape(b, t, cfg.dim))


class FeedForward(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.attention = Attention(cfg)
        self.feed_forward = FeedForward(cfg)
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, mask: Optional[torch.Tensor],
                cache: Optional[LayerSlots]) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope, mask, cache)
        return h + self.feed_forward(self.ffn_norm(h))


class LabelEmbedder(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.embedding_table = nn.Embedding(cfg.num_classes + 1, cfg.dim)


class CaptionMLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.caption_dim, cfg.dim, bias=False)
        self.fc2 = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedder(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cap_proj = CaptionMLP(cfg)
        # a buffer in the original code, so it is in the checkpoints under this name
        self.register_buffer("uncond_embedding", torch.zeros(cfg.cls_token_num, cfg.caption_dim))


def call_layer(block: nn.Module, *args: Any) -> torch.Tensor:
    """A block's forward, as the compiled region sees it: the block is an argument, not a constant."""
    return block(*args)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.cls_embedding = LabelEmbedder(cfg) if cfg.task == "c2i" else CaptionEmbedder(cfg)
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.register_buffer("rope", rope_table_2d(cfg), persistent=False)

    def embed_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Class indices (B,) -> (B, 1, dim); index num_classes is the unconditional class."""
        return self.cls_embedding.embedding_table(labels)[:, None]

    def embed_captions(self, features: torch.Tensor) -> torch.Tensor:
        """Caption features (B, cls_token_num, caption_dim) -> (B, cls_token_num, dim)."""
        return self.cls_embedding.cap_proj(features)

    def forward(self, h: torch.Tensor, cache: Optional[RowCache] = None, branches: int = 1,
                run_layer: Callable[..., torch.Tensor] = call_layer) -> torch.Tensor:
        """Embeddings (B, T, dim) after each row's cached positions -> float32 logits (B, T, V).

        Without a cache this is plain causal training/scoring from position 0.  The
        cache gives every row its own position and hides caption padding (a padded
        position still attends to itself, as in the original).  `run_layer(block, h, rope, mask, slots)` runs
        each block (a compiled one in static mode: it takes tensors only, so one graph serves every layer).
        """
        t = h.shape[1]
        if cache is None:
            if t > self.rope.shape[0]:
                raise ValueError(f"sequence position {t} beyond the {self.rope.shape[0]} this model has")
            positions, mask = torch.arange(t, device=h.device)[None], None
        else:
            positions, visible = cache.begin(t, branches)
            mask = visible[:, None]
        # positions past the last (a finished row's window) only give logits that are never used
        rope = self.rope[positions.clamp(max=self.rope.shape[0] - 1)]
        for i, layer in enumerate(self.layers):
            h = run_layer(layer, h, rope, mask, None if cache is None else cache.layer(i))
        return self.output(self.norm(h)).float()


def config_from_state_dict(state: dict[str, torch.Tensor], grid_size: int, n_head: Optional[int] = None,
                           source: str = "checkpoint") -> GPTConfig:
    """The GPT architecture read off its weights; heads come from the caller or the published widths."""
    try:
        vocab_size, dim = state["tok_embeddings.weight"].shape
        n_layer = len({k.split(".")[1] for k in state if k.startswith("layers.")})
        qkv_rows = state["layers.0.attention.wqkv.weight"].shape[0]
        ffn_hidden = state["layers.0.feed_forward.w1.weight"].shape[0]
    except KeyError as err:
        raise ModelLoadError(f"{source} is not a LlamaGen GPT checkpoint: missing {err}") from err
    n_head = n_head or HEADS_BY_WIDTH.get(dim)
    if n_head is None:
        raise ModelLoadError(f"{source}: width {dim} is not a published LlamaGen size; give \"n_head\" "
                             "in llamagen.json")
    head_dim, uneven = divmod(dim, n_head)
    n_kv_head = 0 if uneven or not head_dim else (qkv_rows - dim) // (2 * head_dim)
    if n_kv_head < 1 or qkv_rows != dim + 2 * n_kv_head * head_dim:
        raise ModelLoadError(f"{source}: width {dim} and fused qkv rows {qkv_rows} do not split into {n_head} "
                             "heads; check \"n_head\" in llamagen.json")
    common = dict(dim=dim, n_layer=n_layer, n_head=n_head, n_kv_head=n_kv_head, ffn_hidden=ffn_hidden,
                  vocab_size=vocab_size, grid_size=grid_size)
    if "cls_embedding.embedding_table.weight" in state:
        return GPTConfig(task="c2i", num_classes=state["cls_embedding.embedding_table.weight"].shape[0] - 1,
                         cls_token_num=1, **common)
    if "cls_embedding.uncond_embedding" in state:
        tokens, caption_dim = state["cls_embedding.uncond_embedding"].shape
        return GPTConfig(task="t2i", caption_dim=caption_dim, cls_token_num=tokens, **common)
    raise ModelLoadError(f"{source} has neither a class embedding table nor a caption embedder")


# Stored by some exports; recomputed here from the config, so its value is not needed.
ROPE_KEYS = ("freqs_cis",)


def _key_list(keys: set[str], shown: int = 8) -> str:
    names = sorted(keys)
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def gpt_from_state_dict(state: dict[str, torch.Tensor], cfg: GPTConfig, source: str) -> GPT:
    with torch.device("meta"):  # no random initialisation of billions of weights that are replaced anyway
        model = GPT(cfg)
    state = {k: v for k, v in state.items() if k not in ROPE_KEYS}
    expected = set(model.state_dict())
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        problems = [f"{what} {_key_list(keys)}" for what, keys in (("missing", missing), ("unexpected", unexpected))
                    if keys]
        raise ModelLoadError(f"{source} does not match the LlamaGen GPT layout: {'; '.join(problems)}")
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as err:  # the names fit; a shape does not
        raise ModelLoadError(f"{source} does not match the LlamaGen GPT layout "
                             f"({' '.join(str(err).split())[:300]})") from err
    model.rope = rope_table_2d(cfg)  # not stored in checkpoints
    return model.eval()


# ----------------------------------------------------------------------------- conditioning

@dataclass(frozen=True)
class ClassLabel:
    """Class-conditional prompt: one class index."""
    index: int


@dataclass(frozen=True)
class Caption:
    """Text-conditional prompt: T5 features left-padded to cls_token_num rows (zeros at padding)."""
    features: torch.Tensor  # (cls_token_num, caption_dim), float32, CPU
    mask: torch.Tensor      # (cls_token_num,) bool, True at real tokens


class T5Captioner(nn.Module):
    """FLAN-T5 encoder features for LlamaGen's text-conditional models, the encoder at the model's precision."""

    repository = "google/flan-t5-xl"  # what the folder holds, for error messages

    def __init__(self, folder: Path, dtype: torch.dtype, max_tokens: int, precision: str = "none"):
        super().__init__()
        from transformers import AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        except (OSError, ValueError) as err:
            raise ModelLoadError(f"T5 encoder folder {folder} has no readable tokenizer ({str(err).splitlines()[0]}); "
                                 f"it needs the transformers files of {self.repository} (config.json, "
                                 "*.safetensors, tokenizer files)") from err
        self.encoder = load_t5_encoder(folder, dtype, precision, self.repository)
        self.max_tokens = max_tokens

    @torch.no_grad()
    def encoded(self, text: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(features (max_tokens, width) float32 on the CPU, attention mask (max_tokens,)) of `text` as given,
        computed on `device` (the model's: a streamed encoder's own weights may lie elsewhere)."""
        batch = self.tokenizer([text], max_length=self.max_tokens, padding="max_length", truncation=True,
                               return_tensors="pt")
        hidden = self.encoder(input_ids=batch.input_ids.to(device),
                              attention_mask=batch.attention_mask.to(device)).last_hidden_state[0].float().cpu()
        return hidden, batch.attention_mask[0]

    def forward(self, text: str, device: torch.device) -> Caption:
        # cleaned as in training: "A Red Cat" and "a red cat" are the same caption to the model
        hidden, attention = self.encoded(clean_caption(text), device)
        valid = int(attention.sum())
        # LlamaGen samples with the padding moved in front, so the last condition row is a real token
        features = torch.cat([torch.zeros(self.max_tokens - valid, hidden.shape[1]), hidden[:valid]])
        mask = torch.arange(self.max_tokens) >= self.max_tokens - valid
        return Caption(features=features, mask=mask)


# ----------------------------------------------------------------------------- adapter

class GPTRows:
    """The GPT as a `row_session.RowNetwork`: prompts are embeddings already (class or caption rows).

    With `compiled_layer` the window calls over a static cache run each block through it (see
    scd_core.compiled.compiled_regions); the prefill runs eagerly: its one shape is not worth a compilation.
    """

    def __init__(self, gpt: GPT, compiled_layer: Optional[Callable[..., torch.Tensor]]) -> None:
        self.gpt, self.compiled_layer = gpt, compiled_layer
        self.embed_tokens = gpt.tok_embeddings

    def embed_context(self, embeddings: torch.Tensor) -> torch.Tensor:
        return embeddings

    def __call__(self, cache: RowCache, inputs: torch.Tensor, extras: Sequence[torch.Tensor], branches: int,
                 last_only: bool) -> torch.Tensor:
        cfg = self.gpt.config
        if not cache.keys:  # the blocks take every layer's tensors as arguments
            cache.allocate(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, self.gpt.tok_embeddings.weight.dtype)
        compiled = self.compiled_layer is not None and cache.static and cache.longest
        return self.gpt(inputs, cache, branches, self.compiled_layer if compiled else call_layer)


class LlamaGenSession(RowSession):
    """One generation: cond rows first, then the unconditional (null class / empty caption) rows."""

    def __init__(self, gpt: GPT, cond: ClassLabel | Caption, batch_size: int,
                 compiled_layer: Optional[Callable[..., torch.Tensor]] = None, device: Optional[torch.device] = None):
        """With `compiled_layer` the session has static shapes (`static_shapes`).  `device`: where to compute
        (the model's `device`); by default where the token embeddings lie."""
        check_batch_size(batch_size)
        cfg = gpt.config
        device = device or gpt.tok_embeddings.weight.device
        real: Optional[torch.Tensor] = None  # attendable prefix slots; all of them without caption padding
        with torch.no_grad():
            if isinstance(cond, ClassLabel) and cfg.task == "c2i":
                labels = [cond.index] * batch_size + [cfg.num_classes] * batch_size
                context = gpt.embed_labels(torch.tensor(labels, device=device))
            elif isinstance(cond, Caption) and cfg.task == "t2i":
                uncond = gpt.cls_embedding.uncond_embedding
                features = torch.cat([cond.features.to(uncond).expand(batch_size, -1, -1),
                                      uncond.expand(batch_size, -1, -1)])
                context = gpt.embed_captions(features).to(gpt.tok_embeddings.weight.dtype)
                # the original applies the caption's padding mask to the unconditional rows as well
                real = cond.mask.bool().expand(2 * batch_size, -1)
            else:
                raise ValueError(f"conditioning {type(cond).__name__} does not fit a {cfg.task} LlamaGen model; "
                                 "use the model's encode()")
        super().__init__(context, cfg.num_tokens, GPTRows(gpt, compiled_layer), copies=2, real=real,
                         static_shapes=compiled_layer is not None)


class LlamaGenModel(Compilable):
    """A loaded LlamaGen GPT + VQ decoder (+ T5 captioner for text-conditional models)."""

    layer_step = staticmethod(call_layer)

    def __init__(self, gpt: GPT, vq: VQModel, image_size: int, family: str = "llamagen",
                 captioner: Optional[T5Captioner] = None, cfg_scale: Optional[float] = None,
                 top_k: Optional[int] = None, class_names: Optional[list[str]] = None,
                 image_encoder: Optional[LazyImageEncoder] = None):
        """`image_encoder`: the VQ's encoder side, loaded on the first `encode_image` (None: no image input)."""
        cfg = gpt.config
        self.config = cfg
        self.family = family
        self.vocab_size = cfg.vocab_size
        self.num_tokens = cfg.num_tokens
        self.grid = (cfg.grid_size, cfg.grid_size)
        self.image_size = image_size
        text = cfg.task == "t2i"
        self.default_cfg_scale = cfg_scale if cfg_scale is not None else (7.5 if text else 4.0)
        # the authors' top-k (one as large as the vocabulary filters nothing: `sampling.to_probs`)
        self.default_top_k = top_k if top_k is not None else (1000 if text else 2000)
        self.class_names = class_names
        self.image_encoder = image_encoder
        parts = {"gpt": gpt, "vq": vq}
        if captioner is not None:
            parts["t5"] = captioner
        self.module = nn.ModuleDict(parts)

    @property
    def device(self) -> torch.device:
        return compute_device(self, self.module["gpt"].tok_embeddings.weight)

    def encode(self, prompt: str, negative_prompt: Optional[str] = None) -> ClassLabel | Caption:
        if negative_prompt and negative_prompt.strip():
            raise ValueError("LlamaGen has no negative prompt: its unconditional branch is fixed "
                             "(the null class or the learned empty caption); leave it empty")
        if self.config.task == "t2i":
            return self.module["t5"](prompt, self.device)
        return ClassLabel(self._class_index(prompt))

    def _class_index(self, prompt: str) -> int:
        text, count = str(prompt).strip(), self.config.num_classes
        if self.class_names and text in self.class_names:
            return self.class_names.index(text)
        if self.class_names:
            expected = f"one of its classes ({', '.join(self.class_names)})"
        else:
            expected = f"a class index 0..{count - 1}" + (" (ImageNet's)" if count == IMAGENET_CLASSES else "")
        try:
            index = int(text)
        except ValueError:
            index = -1
        if not 0 <= index < count:
            raise ValueError(f"this class-conditional model takes {expected} as the prompt, got {prompt!r}")
        return index

    def start(self, cond: ClassLabel | Caption, batch_size: int) -> LlamaGenSession:
        return LlamaGenSession(self.module["gpt"], cond, batch_size, self.compiled_layer, self.device)

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image ids (batch, N) -> float32 CPU images (batch, H, W, 3) in 0..1."""
        vq = self.module["vq"]
        check_tokens(tokens, self.num_tokens, self.vocab_size)
        codes = tokens.to(self.device).long()
        images = vq.decode(codes, self.grid)
        return ((images.float() + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1).cpu()

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """ComfyUI IMAGE (batch, H, W, 3) in 0..1 -> codes (batch, num_tokens) as `decode` takes them; an image
        of another size is scaled to cover the model's and centre-cropped, as LlamaGen's training data was."""
        if self.image_encoder is None:
            raise no_image_encoder(self)
        return self.image_encoder.codes(images, (self.image_size, self.image_size), self.device).flatten(1)


# ----------------------------------------------------------------------------- folders

ORIGINAL_GPT = re.compile(r"^(c2i|t2i)_([0-9A-Za-z]+)_(?:.*_)?(\d+)\.(pt|pth|safetensors)$")
ORIGINAL_VQ = re.compile(r"^vq_ds\d+.*\.(pt|pth|safetensors)$")
CONFIG_NAMES = ("llamagen.json", "config.json")
CACHE_TOKENS = 120 + 1024  # a caption and the largest grid, 32 x 32 (memory estimates)


def _read_config(folder: Path) -> Optional[dict[str, Any]]:
    """The folder's LlamaGen settings file, or None if it has none."""
    for name in CONFIG_NAMES:
        path = folder / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            if name == "llamagen.json":
                raise ModelLoadError(f"{path} is not valid JSON ({err})") from err
            continue
        if isinstance(data, dict) and data.get("model_type") == "llamagen":
            return data
        if name == "llamagen.json":
            raise ModelLoadError(f"{path} must be a JSON object with \"model_type\": \"llamagen\"")
    return None


def _original_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and ORIGINAL_GPT.match(p.name))


def detect(folder: Path) -> bool:
    folder = Path(folder)
    if not folder.is_dir():
        return False
    try:
        return _read_config(folder) is not None or bool(_original_files(folder))
    except ModelLoadError:
        return True  # ours, but broken: let load() report why


def _find_t5(folder: Path) -> Optional[Path]:
    for depth in range(1, 4):
        for config in sorted(folder.glob("/".join(["*"] * depth) + "/config.json")):
            try:
                if json.loads(config.read_text()).get("model_type") == "t5":
                    return config.parent
            except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
                continue
    return None


def _settings(folder: Path) -> dict[str, Any]:
    """Paths and sizes for `load`, from llamagen.json (null there: the default) or the original file names."""
    config = _read_config(folder)
    if config is not None:
        config = without_nulls(config)
        missing = [key for key in ("gpt_checkpoint", "vq_checkpoint", "image_size") if key not in config]
        if missing:
            raise ModelLoadError(f"{folder}: llamagen.json lacks {', '.join(missing)}")
        settings = dict(config)
        settings["gpt_checkpoint"] = folder / config["gpt_checkpoint"]
        settings["vq_checkpoint"] = folder / config["vq_checkpoint"]
        if config.get("t5_folder"):
            settings["t5_folder"] = folder / config["t5_folder"]
        return settings
    gpt_files = _original_files(folder)
    if len(gpt_files) != 1:
        raise ModelLoadError(f"{folder} holds {len(gpt_files)} LlamaGen GPT checkpoints "
                             f"({', '.join(p.name for p in gpt_files)}); keep one, or write a llamagen.json")
    task, size, pixels, _ = ORIGINAL_GPT.match(gpt_files[0].name).groups()
    vq_files = sorted(p for p in folder.iterdir() if p.is_file() and ORIGINAL_VQ.match(p.name))
    vq_files.sort(key=lambda p: task not in p.name)  # prefer the tokenizer named after the task
    if not vq_files:
        raise ModelLoadError(f"{folder} has the GPT checkpoint {gpt_files[0].name} but no VQ tokenizer; "
                             f"add vq_ds16_{task}.pt from the LlamaGen release")
    settings: dict[str, Any] = {"gpt_checkpoint": gpt_files[0], "vq_checkpoint": vq_files[0],
                                "image_size": int(pixels)}
    preset = PRESETS.get(f"GPT-{size}")
    if preset is not None:
        settings["n_head"] = preset[1]
    if task == "t2i":
        settings["t5_folder"] = _find_t5(folder)
    return settings


def text_encoder_folder(folder: Path) -> Optional[Path]:
    """The T5 encoder folder `load` reads (text-to-image models), for memory estimates; None without one."""
    t5_folder = _settings(Path(folder)).get("t5_folder")
    return Path(t5_folder) if t5_folder is not None and Path(t5_folder).is_dir() else None


def _image_encoder(vq_path: Path, norm_groups: int, demo: bool, dtype: torch.dtype) -> LazyImageEncoder:
    """The VQ's encoder side, read from `vq_path` on the first `encode_image` at `dtype` (the decoder's)."""
    return LazyImageEncoder("the demo" if demo else FAMILY.label, [vq_path], ENCODER_KEYS + ("quantize.embedding.",),
                            lambda vq_dtype: encoder_from_state_dict(read_weights(vq_path), str(vq_path),
                                                                     norm_groups).to(vq_dtype), dtype)


def load(folder: Path, device: torch.device, dtype: torch.dtype, quantize: str = "none") -> LlamaGenModel:
    """Load a LlamaGen folder onto `device`, computing in `dtype`, the transformer blocks' linear layers (and the
    T5 encoder's, text-to-image) at `quantize` precision (quantize.PRECISIONS); the class/caption embedders, the
    head and the VQ stay float."""
    folder = Path(folder)
    settings = _settings(folder)
    image_size = positive_int(settings["image_size"], "image_size", folder)
    n_head = settings.get("n_head")
    if n_head is None and settings.get("preset") is not None:
        if settings["preset"] not in PRESETS:
            raise ModelLoadError(f"{folder}: unknown preset {settings['preset']!r}; one of {', '.join(PRESETS)}")
        n_head = PRESETS[settings["preset"]][1]
    if n_head is not None:
        n_head = positive_int(n_head, "n_head", folder)
    vq_settings = settings.get("vq") or {}
    vq_path, norm_groups = settings["vq_checkpoint"], positive_int(vq_settings.get("norm_groups", 32),
                                                                   "vq.norm_groups", folder)
    vq = vq_from_state_dict(read_weights(vq_path), str(vq_path), norm_groups, with_encoder=False)
    if image_size % vq.config.downsample:
        raise ModelLoadError(f"{folder}: image_size {image_size} is not a multiple of the VQ's "
                             f"{vq.config.downsample}x downsampling")
    gpt_path = settings["gpt_checkpoint"]
    state = read_weights(gpt_path)
    cfg = config_from_state_dict(state, image_size // vq.config.downsample, n_head, str(gpt_path))
    if cfg.vocab_size != vq.config.codebook_size:
        raise ModelLoadError(f"{gpt_path.name} predicts {cfg.vocab_size} codes but the VQ "
                             f"{settings['vq_checkpoint'].name} has {vq.config.codebook_size}; they do not belong "
                             "together")
    gpt = gpt_from_state_dict(state, cfg, str(gpt_path))
    del state
    # before the cast: each layer is read from the (memory-mapped) checkpoint and quantised on its own
    quantize_linears(gpt.layers, quantize, dtype)
    captioner = None
    if cfg.task == "t2i":
        t5_folder = settings.get("t5_folder")
        if t5_folder is None or not Path(t5_folder).is_dir():
            raise ModelLoadError(f"{folder}: text-conditional LlamaGen needs the FLAN-T5-XL encoder "
                                 f"(transformers folder of google/flan-t5-xl with config.json, weights and "
                                 f"tokenizer) inside the model folder, e.g. {folder / 't5-ckpt' / 'flan-t5-xl'}, "
                                 "or named by \"t5_folder\" in llamagen.json")
        captioner = T5Captioner(Path(t5_folder), dtype, cfg.cls_token_num, quantize)
    model = LlamaGenModel(gpt.to(dtype), vq, image_size, family=settings.get("family", "llamagen"),
                          captioner=captioner, cfg_scale=settings.get("cfg_scale"), top_k=settings.get("top_k"),
                          class_names=settings.get("class_names"),
                          image_encoder=_image_encoder(vq_path, norm_groups, settings.get("family") == "demo",
                                                       vq.post_quant_conv.weight.dtype))
    quantize_then_move(model.module, gpt.layers, "none", dtype, device)
    return model
