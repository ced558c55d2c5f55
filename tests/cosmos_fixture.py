"""Tiny random Cosmos-1.0 autoregressive folders in NVIDIA's on-disk layout.

`write_cosmos(root, size)` writes `root/Cosmos-1.0-Autoregressive-<size>/` with `model.pt`
(official key names, nested under "model" with a "model." prefix and TransformerEngine
`_extra_state` entries, as training checkpoints carry them; the 12B one flat) and a
`config.json` shrinking the architecture, and the sibling `Cosmos-1.0-Tokenizer-DV8x16x16/`
with a tiny TorchScript `encoder.jit` / `decoder.jit` saved by torch.jit.save.  The tiny
tokenizer keeps the real interface: (B, 3, 1 + 8k, 16h, 16w) video in [-1, 1] -> (int32
indices (B, 1 + k, h, w), latents, dummy loss), and back.  Video2World sizes also get a
tiny T5 encoder folder `t5/`.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from llamagen_fixture import write_tiny_t5
from scd_core.models.families.cosmos import TOKENIZER_FOLDER, CosmosTransformer, config_for

# head_dim 12 splits into 4 time / 4 height / 4 width channels; 4 latent frames of 2 x 3 codes, 2 generated.
TINY = {"dim": 48, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 12, "ffn_hidden_size": 64,
        "vocab_size": 64, "video_latent_shape": [4, 2, 3], "original_latent_shape": [2, 2, 3],
        "generated_frames": 2}
CONTEXT_DIM = 16
# Every field of NVIDIA's autoregressive ModelConfig at its default, as its code writes the config out: the
# unset ones null (head_dim null means dim // n_heads, n_kv_heads null means n_heads).
NVIDIA_MODEL_CONFIG = {
    "dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8, "head_dim": None, "vocab_size": 128256,
    "ffn_hidden_size": 14336, "norm_eps": 1e-5, "rope_theta": 500000, "apply_abs_pos_emb": False,
    "max_batch_size": 1, "max_seq_len": 8192, "fuse_qkv": False, "causal_mask": True, "norm_type": "rmsnorm",
    "precision": "bfloat16", "use_qk_normalization": False, "tokenizer": None, "ckpt_dir": None, "ckpt_path": None,
    "apply_yarn": False, "yarn_scale": None, "yarn_beta_fast": None, "yarn_beta_slow": None,
    "original_seq_len": None, "vision_encoder": None, "vision_encoder_in_channels": 3, "mm_projector": None,
    "rope_dim": "1D", "pytorch_rope_version": "v2", "original_latent_shape": None, "pad_to_multiple_of": None,
    "insert_cross_attn": False, "insert_cross_attn_every_k_layers": 1, "context_dim": 1024,
    "num_video_frames": None, "video_height": None, "video_width": None, "video_latent_shape": None}
FRAME_SIZE = (32, 48)  # pixels: 2 x 3 codes of 16 x 16


class _TinyCodec(nn.Module):
    """An identity colour projection (a weight for the tokenizer files to hold); `chunk` > 0 refuses any other
    number of frames, like a file traced for one length."""

    def __init__(self, chunk: int = 0) -> None:
        super().__init__()
        self.chunk = chunk
        self.proj = nn.Conv3d(3, 3, 1, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(torch.eye(3).view(3, 3, 1, 1, 1))


class TinyEncoder(_TinyCodec):
    """First frame alone, then groups of 8; 16 x 16 patches averaged; 4 levels per colour -> 64 codes."""

    def forward(self, video: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.chunk > 0 and video.shape[2] != self.chunk:
            raise RuntimeError("traced for another number of frames")
        x = self.proj(video)
        b, c, t, h, w = x.shape
        rest = x[:, :, 1:].reshape(b, c, (t - 1) // 8, 8, h, w).mean(3)
        latent = F.avg_pool3d(torch.cat([x[:, :, :1], rest], dim=2), (1, 16, 16))
        levels = ((latent.clamp(-1, 1) + 1) * 1.5).round().long()
        indices = levels[:, 0] * 16 + levels[:, 1] * 4 + levels[:, 2]
        return indices.int(), latent, torch.zeros(1)


class TinyDecoder(_TinyCodec):
    """The encoder's codes back to frames: 4 levels per colour, 16 x 16 patches, groups of 8 frames."""

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        if self.chunk > 0 and indices.shape[1] != self.chunk:
            raise RuntimeError("traced for another number of latent frames")
        levels = torch.stack([indices // 16, indices // 4 % 4, indices % 4], dim=1)
        x = self.proj((levels.to(self.proj.weight.dtype) / 1.5 - 1))
        x = x.repeat_interleave(16, dim=3).repeat_interleave(16, dim=4)
        return torch.cat([x[:, :, :1], x[:, :, 1:].repeat_interleave(8, dim=2)], dim=2)


def write_tokenizer(folder: Path, fixed_length: bool = False) -> Path:
    """encoder.jit / decoder.jit; `fixed_length`: they take only whole chunks (25 frames, 4 latent frames)."""
    latent = TINY["video_latent_shape"][0]
    encoder, decoder = (TinyEncoder(1 + 8 * (latent - 1)), TinyDecoder(latent)) if fixed_length else \
        (TinyEncoder(), TinyDecoder())
    folder.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # torch 2.14 deprecates TorchScript; the official tokenizer is TorchScript
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.script(encoder.eval()), str(folder / "encoder.jit"))
        torch.jit.save(torch.jit.script(decoder.eval()), str(folder / "decoder.jit"))
    return folder


def random_state(folder: Path, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    net = CosmosTransformer(config_for(folder))
    with torch.no_grad():
        for name, p in net.named_parameters():  # visible structure in the logits, not near-uniform
            p.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.2 if p.dim() == 1 else 0.3)
    return net.state_dict()


def write_cosmos(root: Path, size: str = "4B", nested: bool = True, seed: int = 0, **overrides: object) -> Path:
    """The folder; `overrides` change config.json's tiny architecture (e.g. the real head_dim=128)."""
    folder = root / f"Cosmos-1.0-Autoregressive-{size}"
    folder.mkdir(parents=True, exist_ok=True)
    config = {**TINY, **overrides}
    if "Video2World" in size:
        config["context_dim"] = CONTEXT_DIM
        write_tiny_t5(folder / "t5", caption_dim=CONTEXT_DIM)
    (folder / "config.json").write_text(json.dumps(config))
    state = random_state(folder, seed)
    if nested:
        state = {f"model.{key}": value for key, value in state.items()}
        state["model.layers.0.attention._extra_state"] = torch.zeros(0, dtype=torch.uint8)
        torch.save({"model": state}, folder / "model.pt")
    else:
        torch.save(state, folder / "model.pt")
    if not (root / TOKENIZER_FOLDER).is_dir():
        write_tokenizer(root / TOKENIZER_FOLDER)
    return folder


def write_nvidia_config(folder: Path, **fields: object) -> Path:
    """Replace the folder's config.json by NVIDIA's ModelConfig with the tiny 4B video model's values set,
    as its video model config sets them, and `fields` on top (None writes null; "drop" leaves a key out)."""
    config = {**NVIDIA_MODEL_CONFIG, "dim": TINY["dim"], "n_layers": TINY["n_layers"], "n_heads": TINY["n_heads"],
              "n_kv_heads": TINY["n_kv_heads"], "vocab_size": TINY["vocab_size"],
              "ffn_hidden_size": TINY["ffn_hidden_size"], "use_qk_normalization": True, "rope_dim": "3D",
              "pad_to_multiple_of": 64, "ckpt_path": str(folder / "model.pt"), "num_video_frames": 25,
              "video_height": FRAME_SIZE[0], "video_width": FRAME_SIZE[1],
              "video_latent_shape": TINY["video_latent_shape"], **fields}
    config = {key: value for key, value in config.items() if value != "drop"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def context_frames(count: int = 9, size: tuple[int, int] = FRAME_SIZE, seed: int = 0) -> torch.Tensor:
    """A smooth clip (count, H, W, 3) in 0..1: a colour ramp drifting a little per frame."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.rand(1, 3, 2, 3, generator=gen)
    image = F.interpolate(base, size=size, mode="bilinear", align_corners=False)[0].permute(1, 2, 0)
    drift = torch.linspace(0, 0.1, count).view(count, 1, 1, 1)
    return (image.unsqueeze(0) + drift).clamp(0, 1)
