"""Tiny random LlamaGen checkpoints in the original on-disk formats.

`write_original_c2i(folder)`: `c2i_B_16.pt` + `vq_ds4_c2i.pt`, torch dicts with the
weights under "model" (as the LlamaGen release ships them; the preset and image size
come from the file name).  `write_training_c2i(folder)`: the same GPT as a training
checkpoint (optimizer state, step count, argparse.Namespace of the run).
`write_safetensors_c2i(folder)`: the same kind of model as safetensors with a
llamagen.json.  `write_t2i(folder, with_t5)`: a text-conditional model plus,
optionally, a tiny T5 encoder folder with a word-level tokenizer.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Optional

import torch

from scd_core.models.families.llamagen import GPT, GPTConfig
from scd_core.models.tokenizers.vq16 import VQConfig, VQModel

# The GPT-B preset has 12 heads; width 48 gives 4-wide heads, enough for the 2-D rotation.
TINY_GPT = dict(dim=48, n_layer=2, n_head=12, n_kv_head=12, ffn_hidden=128, vocab_size=64, grid_size=4)
TINY_VQ = VQConfig(codebook_size=64, codebook_embed_dim=8, z_channels=32, ch=32, ch_mult=(1, 1, 2),
                   num_res_blocks=1, norm_groups=32)
IMAGE_SIZE = 16  # 4x downsampling -> a 4 x 4 token grid
T5_WORDS = ["<pad>", "</s>", "<unk>", "a", "red", "cat", "on", "the", "mat", "blue", "dog"]


def original_gpt_keys(n_layer: int, task: str) -> set[str]:
    """Every parameter name of an original LlamaGen GPT checkpoint (from autoregressive/models/gpt.py)."""
    keys = {"tok_embeddings.weight", "norm.weight", "output.weight"}
    keys |= ({"cls_embedding.embedding_table.weight"} if task == "c2i" else
             {"cls_embedding.uncond_embedding", "cls_embedding.cap_proj.fc1.weight", "cls_embedding.cap_proj.fc2.weight"})
    for i in range(n_layer):
        keys |= {f"layers.{i}.{name}" for name in (
            "attention.wqkv.weight", "attention.wo.weight", "feed_forward.w1.weight", "feed_forward.w2.weight",
            "feed_forward.w3.weight", "attention_norm.weight", "ffn_norm.weight")}
    return keys


def _random_gpt(cfg: GPTConfig, seed: int) -> GPT:
    torch.manual_seed(seed)
    gpt = GPT(cfg)
    with torch.no_grad():
        for name, p in gpt.named_parameters():  # visible structure in the logits, not near-uniform
            p.normal_(1.0 if name.endswith("norm.weight") else 0.0, 1.0 if p.dim() == 1 else 0.3)
        if cfg.task == "t2i":
            gpt.cls_embedding.uncond_embedding.normal_()
    return gpt


def _random_vq(seed: int) -> VQModel:
    torch.manual_seed(seed)
    return VQModel(TINY_VQ)


def write_original_c2i(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    gpt = _random_gpt(GPTConfig(task="c2i", num_classes=10, **TINY_GPT), seed=1)
    vq_state = _random_vq(seed=2).state_dict()
    vq_state["quantize.codebook_used"] = torch.zeros(65536)  # a training buffer the originals carry
    torch.save({"model": gpt.state_dict(), "steps": 1000}, folder / "c2i_B_16.pt")
    torch.save({"model": vq_state, "optimizer": {}}, folder / "vq_ds4_c2i.pt")
    return folder


def write_training_c2i(folder: Path, args: object = None, extra: dict[str, torch.Tensor] | None = None) -> Path:
    """The GPT of `write_original_c2i` as LlamaGen's training script saves it: {"model", "optimizer", "steps",
    "args"}, the run's arguments an argparse.Namespace (or `args`), `extra` entries added to the weights."""
    write_original_c2i(folder)
    gpt = _random_gpt(GPTConfig(task="c2i", num_classes=10, **TINY_GPT), seed=1)
    trained = copy.deepcopy(gpt)  # one AdamW step on a copy: real optimizer state, the saved weights unchanged
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.05)
    for p in trained.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    if args is None:
        args = argparse.Namespace(gpt_model="GPT-B", image_size=IMAGE_SIZE, num_classes=10, lr=1e-4,
                                  results_dir="results", mixed_precision="bf16", ema=False, vq_ckpt=None)
    torch.save({"model": {**gpt.state_dict(), **(extra or {})}, "optimizer": optimizer.state_dict(),
                "steps": 5000, "args": args}, folder / "c2i_B_16.pt")
    return folder


def write_safetensors_c2i(folder: Path) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    gpt = _random_gpt(GPTConfig(task="c2i", num_classes=10, **TINY_GPT), seed=3)
    save_file(gpt.state_dict(), str(folder / "gpt.safetensors"))
    save_file(_random_vq(seed=4).state_dict(), str(folder / "vq.safetensors"))
    (folder / "llamagen.json").write_text(json.dumps({
        "model_type": "llamagen", "gpt_checkpoint": "gpt.safetensors", "vq_checkpoint": "vq.safetensors",
        "image_size": IMAGE_SIZE, "n_head": 12, "cfg_scale": 2.5, "top_k": 20}))
    return folder


def write_tiny_t5(folder: Path, caption_dim: int, d_ff: int = 32, num_layers: int = 1,
                  weight_std: Optional[float] = None, full: bool = False) -> Path:
    """A T5 encoder folder (`full`: a whole T5ForConditionalGeneration checkpoint with decoder and LM head, as
    google/flan-t5-xl and t5-11b ship); `weight_std`: linear weights drawn with that std, as real checkpoints are
    initialised (T5's own init at this width is sharper and exaggerates quantisation error)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel, T5ForConditionalGeneration

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(5)
    config = T5Config(vocab_size=len(T5_WORDS), d_model=caption_dim, d_kv=8, d_ff=d_ff, num_layers=num_layers,
                      num_heads=2, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    model = (T5ForConditionalGeneration if full else T5EncoderModel)(config)
    if weight_std is not None:
        with torch.no_grad():
            for module in model.modules():
                if type(module) is torch.nn.Linear:
                    module.weight.normal_(0.0, weight_std)
    model.save_pretrained(str(folder))
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(T5_WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(str(folder))
    return folder


def write_t2i(folder: Path, with_t5: bool) -> Path:
    """`t2i_B_stage1_16.pt` + `vq_ds4_t2i.pt` (+ `t5-ckpt/flan-t5-xl/`): 8 caption rows of width 16."""
    folder.mkdir(parents=True, exist_ok=True)
    gpt = _random_gpt(GPTConfig(task="t2i", caption_dim=16, cls_token_num=8, **TINY_GPT), seed=6)
    torch.save({"model": gpt.state_dict()}, folder / "t2i_B_stage1_16.pt")
    torch.save({"model": _random_vq(seed=7).state_dict()}, folder / "vq_ds4_t2i.pt")
    if with_t5:
        write_tiny_t5(folder / "t5-ckpt" / "flan-t5-xl", caption_dim=16)
    return folder
