"""Memory a model folder needs at each precision, from its weight files' headers (no weight is read).

Weights of the backbone's linear layers (2-D `*.weight` tensors inside a `layers.N.` block) take the
chosen precision; every other loaded tensor stays at the compute dtype.  The KV cache holds, per token
and per row, the output channels of each block's key and value projections.  Heads that loading slices
to the image codes are counted whole, so the estimate errs on the large side.  A T5 text encoder
(`t5_encoder`) adds its encoder: its blocks' linear layers at the precision, its feed-forward outputs
`wo` in float32 when computing in float16.
"""

from __future__ import annotations

import gc
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Optional

import torch

from .checkpoints import PICKLE_SUFFIXES
from .quantize import bytes_per_weight

BLOCK_WEIGHT = re.compile(r"(?:^|\.)layers\.\d+\..*\.weight$")
KEY_VALUE = re.compile(r"(?:^|\.)layers\.\d+\.(?:self_attn\.[kv]_proj|attention\.w[kv])\.weight$")
FUSED_QKV = re.compile(r"(?:^|\.)layers\.\d+\.attention\.wqkv\.weight$")  # LlamaGen: q rows = in_features
WEIGHT_SUFFIXES = (".safetensors",) + PICKLE_SUFFIXES
T5_KEPT = ("shared.", "encoder.")  # a full T5 checkpoint's decoder and LM head are never read
T5_TIED = "encoder.embed_tokens."  # the same tensor as shared.weight
T5_BLOCK = r"^encoder\.block\.\d+\.layer\.\d+\."
T5_LINEAR = re.compile(T5_BLOCK + r"(?:SelfAttention\.[qkvo]|DenseReluDense\.wi(?:_[01])?)\.weight$")
T5_FLOAT16_KEPT = re.compile(T5_BLOCK + r"DenseReluDense\.wo\.weight$")


def release_memory() -> None:
    """Free what Python no longer references and the CUDA allocator's cached blocks (after a model or a
    failed load is dropped, before the next is built)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class MemoryEstimate:
    """Parameter counts of what generation loads, and the KV channels one cached token takes per row."""

    block_weights: int  # quantisable: the backbone's linear layers
    other_weights: int  # embeddings, heads, norms, image decoder: kept at the compute dtype
    kv_channels: int    # keys + values, summed over layers
    tokens: int = 4096  # cached positions of one row at the family's default image size (prompt included)
    float16_kept_weights: int = 0  # quantisable, but float32 and unquantised in float16 (T5's `wo`)
    decoder_weights: int = 0  # a decoder stage's (a DiT's), kept at the compute dtype, run after sampling
    offload: bool = False  # the sampling stage leaves the device before the decoder runs (else both stay)

    def weight_bytes(self, precision: str, dtype: torch.dtype) -> int:
        float_bytes = bytes_per_weight("none", dtype)
        quantised, kept = self.block_weights, self.float16_kept_weights
        if dtype != torch.float16:
            quantised, kept = quantised + kept, 0
        return int(quantised * bytes_per_weight(precision, dtype) + self.other_weights * float_bytes
                   + kept * bytes_per_weight("none", torch.float32))

    def cache_bytes(self, tokens: int, rows: int, dtype: torch.dtype) -> int:
        return int(self.kv_channels * tokens * rows * bytes_per_weight("none", dtype))

    def peak_bytes(self, precision: str, dtype: torch.dtype, rows: int) -> int:
        """The most the device holds: sampling's weights and KV cache for `rows` rows, and the decoder's weights
        beside them, or alone once sampling's are offloaded."""
        sampling = self.weight_bytes(precision, dtype) + self.cache_bytes(self.tokens, rows, dtype)
        decoder = int(self.decoder_weights * bytes_per_weight("none", dtype))
        return max(sampling, decoder) if self.offload else sampling + decoder

    def plus(self, other: "MemoryEstimate") -> "MemoryEstimate":
        """This model with `other`'s weights loaded too (a text encoder: no KV cache of its own)."""
        return replace(self, block_weights=self.block_weights + other.block_weights,
                       other_weights=self.other_weights + other.other_weights,
                       kv_channels=self.kv_channels + other.kv_channels,
                       float16_kept_weights=self.float16_kept_weights + other.float16_kept_weights)


def kl_vae_decode_bytes(height: int, width: int, element_size: int) -> int:
    """Bytes a KL VAE's decode of one height x width image may take at once: what ComfyUI reserves for one
    (comfy/sd.py: 2178 x 64 bytes per latent pixel, latents 8x smaller than the image, per byte of the dtype)."""
    return 2178 * 64 * (height // 8) * (width // 8) * element_size


def _safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}


def _pickle_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Shapes from a tensor-only torch checkpoint, memory-mapped so that nothing is read but the index."""
    data = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    for key in ("model", "module", "state_dict"):
        if isinstance(data, dict) and isinstance(data.get(key), dict):
            data = data[key]
            break
    return {key: tuple(value.shape) for key, value in data.items() if isinstance(value, torch.Tensor)}


def checkpoint_shapes(paths: Iterable[Path]) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape over the given weight files; a file that cannot be indexed is skipped."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in paths:
        try:
            shapes.update(_safetensors_shapes(path) if path.suffix == ".safetensors" else _pickle_shapes(path))
        except Exception:  # legacy pickles cannot be memory-mapped, corrupt files are reported by the loader
            continue
    return shapes


def estimate_from_shapes(shapes: dict[str, tuple[int, ...]], unused: tuple[str, ...] = (), tokens: int = 4096
                         ) -> MemoryEstimate:
    """Count what loading keeps: tensors whose name starts with one of `unused` are dropped at load time."""
    block = other = kv = 0
    for name, shape in shapes.items():
        if name.startswith(unused):
            continue
        count = math.prod(shape)
        if len(shape) == 2 and BLOCK_WEIGHT.search(name):
            block += count
        else:
            other += count
        if KEY_VALUE.search(name):
            kv += shape[0]
        elif FUSED_QKV.search(name):
            kv += shape[0] - shape[1]
    return MemoryEstimate(block, other, kv, tokens)


def t5_encoder_estimate(shapes: dict[str, tuple[int, ...]]) -> MemoryEstimate:
    """What `t5_encoder.load_t5_encoder` keeps of a T5 checkpoint with these tensor shapes."""
    block = other = kept = 0
    for name, shape in shapes.items():
        if not name.startswith(T5_KEPT) or name.startswith(T5_TIED):
            continue
        if T5_LINEAR.match(name):
            block += math.prod(shape)
        elif T5_FLOAT16_KEPT.match(name):
            kept += math.prod(shape)
        else:  # embeddings, relative position biases, norms
            other += math.prod(shape)
    return MemoryEstimate(block, other, 0, 0, kept)


def weight_files(folder: Path) -> list[Path]:
    """The weight files at the top of `folder`."""
    return sorted(p for p in Path(folder).iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)


def folder_estimate(folder: Path, unused: tuple[str, ...] = (), tokens: int = 4096) -> MemoryEstimate:
    """The estimate for the weight files at the top of `folder`."""
    return estimate_from_shapes(checkpoint_shapes(weight_files(folder)), unused, tokens)


def t5_folder_estimate(folder: Path) -> MemoryEstimate:
    """`t5_encoder_estimate` for the weight files at the top of the T5 folder `folder`."""
    return t5_encoder_estimate(checkpoint_shapes(weight_files(folder)))


def fitting_precision(estimate: MemoryEstimate, dtype: torch.dtype, free_bytes: int, rows: int,
                      offered: tuple[str, ...], margin: float = 0.2) -> Optional[str]:
    """The most precise of `offered` (best first) whose peak (weights plus KV cache for `rows` rows, a decoder's
    weights: `MemoryEstimate.peak_bytes`), `margin` more for activations, fits in `free_bytes`; None when none
    fits (ComfyUI then streams what does not)."""
    for precision in offered:
        if estimate.peak_bytes(precision, dtype, rows) * (1 + margin) <= free_bytes:
            return precision
    return None


def auto_precision(estimate: MemoryEstimate, dtype: torch.dtype, free_bytes: int, rows: int,
                   offered: tuple[str, ...], margin: float = 0.2) -> str:
    """`fitting_precision`, or the least precise one when none fits."""
    return fitting_precision(estimate, dtype, free_bytes, rows, offered, margin) or offered[-1]
