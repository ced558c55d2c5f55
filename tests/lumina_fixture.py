"""Tiny random Lumina-mGPT folders in the real on-disk layouts.

`write_tiny_lumina(folder)` writes what Alpha-VLLM/Lumina-mGPT-7B-768 holds plus
Chameleon's image tokenizer: config.json as the authors' fork saves it (model_type
chameleon, fork-only keys), two safetensors shards with an index whose q/k-norm
weights and biases have one row per model-parallel shard, generation_config.json,
tokenizer.json + tokenizer_config.json with Chameleon's special tokens at their real
ids (IMGIMG image tokens at 4..8195, <eoss> 8196, <racm3:break> 8197,
<reserved08706> 8710, row-end 8803, size tokens 8804 + n), and a `vqgan.ckpt`
({"state_dict": ...}, taming key layout) with `vqgan.yaml`.
`write_tiny_lumina2(folder)` writes the 2.0 layout: the same fork config, a
tokenizer whose special tokens sit at 2.0's ids, `args.json`, and a flat
`movqgan_270M.ckpt` whose decoder uses MoVQ's spatial norms.  The VQ key lists
below are spelled out from the published taming/MoVQ structure, independently of
the decoder code under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

RESOLUTION_1, RESOLUTION_2 = 64, 32  # 4 x 4 codes each (16 px tokens for 1, 8 px for 2.0)
SIDE = 4
NUM_TOKENS = SIDE * (SIDE + 1) + 1
HEADS, HEAD_DIM, SHARDS = 4, 8, 2  # two model-parallel shards: q/k norms stored as [2, 8]
CODES_1 = 8192  # Chameleon's real codebook: image ids 4..8195
CODES_2 = 256   # a small MoVQ codebook: ids 155000..155255
MOVQ_OFFSET = 155000
BOI, EOI, ROW_END, END_OF_TURN = "<racm3:break>", "<eoss>", "<reserved08799>", "<reserved08706>"
SPECIAL_IDS_1 = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, EOI: 8196, BOI: 8197, END_OF_TURN: 8710,
                 ROW_END: 8803, **{f"<reserved{8800 + n:05d}>": 8804 + n for n in range(64)}}
TEXT_START_1 = 8900  # the byte-level alphabet's ids in the tiny Lumina-mGPT 1 vocabulary
VOCAB_1 = 9216
# 2.0: a Qwen-style vocabulary with Chameleon's token names at other ids, image codes from 155000
SPECIAL_IDS_2 = {"<s>": 151643, "</s>": 151644, END_OF_TURN: 151660, BOI: 151665, EOI: 151666, ROW_END: 151670,
                 **{f"<reserved{8800 + n:05d}>": 151680 + n for n in range(64)}}
VOCAB_2 = MOVQ_OFFSET + CODES_2


def image_token(code: int) -> str:
    """Chameleon's name of image code `code`: its decimal digits spelled A=0 .. J=9."""
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def write_tokenizer(folder: Path, special: dict[str, int], text_start: int, image_ids: dict[str, int],
                    filename: str = "tokenizer.json") -> None:
    """A byte-level BPE tokenizer with the given tokens at the given ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: text_start + i for i, ch in enumerate(alphabet)}
    vocab.update(image_ids)
    vocab.update(special)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(special))
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / filename))


def fork_config(vocab_size: int) -> dict:
    """config.json as the authors' fork of transformers' Chameleon writes it (tiny sizes)."""
    return {"architectures": ["ChameleonXLLMXForConditionalGeneration"], "model_type": "chameleon",
            "attention_bias": False, "attention_dropout": 0.05, "dropout": 0.05, "bos_token_id": 1,
            "eos_token_id": 2, "pad_token_id": None, "hidden_act": "silu", "hidden_size": HEADS * HEAD_DIM,
            "initializer_range": 0.2, "intermediate_size": 64, "max_position_embeddings": 512,
            "model_parallel_size": SHARDS, "num_attention_heads": HEADS, "num_hidden_layers": 2,
            "num_key_value_heads": HEADS, "qk_layernorm": True, "rms_norm_eps": 1e-5, "rope_scaling": None,
            "rope_theta": 10000.0, "swin_norm": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "transformers_version": "4.44.0", "use_cache": True, "vocab_size": vocab_size,
            "z_loss_weight": 1e-5, "mask_image_logits": True,
            "vq_config": {"model_type": "chameleon_vqgan", "embed_dim": 256, "num_embeddings": 8192,
                          "double_latent": False, "latent_channels": 256, "resolution": 512, "in_channels": 3,
                          "base_channels": 128, "channel_multiplier": [1, 1, 2, 2, 4], "num_res_blocks": 2,
                          "attn_resolutions": None, "dropout": 0.0}}


def fork_state_dict(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """Random weights under the fork's names; q/k norms have one row per model-parallel shard."""
    generator = torch.Generator().manual_seed(seed)
    hidden, inner, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]

    def normal(*shape: int, std: float = 0.2) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * std

    state = {"model.embed_tokens.weight": normal(vocab, hidden, std=1.0), "model.norm.weight": 1 + normal(hidden),
             "lm_head.weight": normal(vocab, hidden, std=0.5)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            state[p + f"self_attn.{name}.weight"] = normal(hidden, hidden)
        for name in ("q_norm", "k_norm"):
            state[p + f"self_attn.{name}.weight"] = 1 + normal(SHARDS, HEAD_DIM, std=0.5)
            state[p + f"self_attn.{name}.bias"] = normal(SHARDS, HEAD_DIM, std=0.5)
        state[p + "mlp.gate_proj.weight"] = normal(inner, hidden)
        state[p + "mlp.up_proj.weight"] = normal(inner, hidden)
        state[p + "mlp.down_proj.weight"] = normal(hidden, inner)
        state[p + "input_layernorm.weight"] = 1 + normal(hidden)
        state[p + "post_attention_layernorm.weight"] = 1 + normal(hidden)
    return state


def write_shards(folder: Path, state: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """Two shards split by layer, plus model.safetensors.index.json, as the published repositories hold them."""
    from safetensors.torch import save_file

    names = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    parts: tuple[dict, dict] = ({}, {})
    for key, value in state.items():
        parts[0 if key.startswith(("model.embed_tokens", "model.layers.0.")) else 1][key] = value.to(dtype)
    weight_map = {}
    for name, part in zip(names, parts):
        save_file(part, str(folder / name), metadata={"format": "pt"})
        weight_map.update({key: name for key in part})
    total = sum(v.numel() * v.element_size() for part in parts for v in part.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def taming_decoder_shapes(widths: tuple[int, ...], blocks: int, attn_levels: tuple[int, ...], z: int, embed: int,
                          codes: int, spatial: bool) -> dict[str, tuple[int, ...]]:
    """Key -> shape of a taming-structure decoder checkpoint (MoVQ: spatial norms conditioned on the latent)."""
    shapes: dict[str, tuple[int, ...]] = {"quantize.embedding.weight": (codes, embed),
                                          "post_quant_conv.weight": (z, embed, 1, 1), "post_quant_conv.bias": (z,)}

    def conv(name: str, out: int, inp: int, k: int) -> None:
        shapes[name + ".weight"], shapes[name + ".bias"] = (out, inp, k, k), (out,)

    def norm(name: str, ch: int, conditioned: bool = spatial) -> None:
        if conditioned:
            shapes[name + ".norm_layer.weight"] = shapes[name + ".norm_layer.bias"] = (ch,)
            conv(name + ".conv_y", ch, embed, 1)
            conv(name + ".conv_b", ch, embed, 1)
        else:
            shapes[name + ".weight"] = shapes[name + ".bias"] = (ch,)

    def resnet(name: str, inp: int, out: int, conditioned: bool = spatial) -> None:
        norm(name + ".norm1", inp, conditioned)
        conv(name + ".conv1", out, inp, 3)
        norm(name + ".norm2", out, conditioned)
        conv(name + ".conv2", out, out, 3)
        if inp != out:
            conv(name + ".nin_shortcut", out, inp, 1)

    def attention(name: str, ch: int, conditioned: bool = spatial) -> None:
        norm(name + ".norm", ch, conditioned)
        for part in ("q", "k", "v", "proj_out"):
            conv(f"{name}.{part}", ch, ch, 1)

    block_in = widths[-1]
    conv("decoder.conv_in", block_in, z, 3)
    resnet("decoder.mid.block_1", block_in, block_in)
    attention("decoder.mid.attn_1", block_in)
    resnet("decoder.mid.block_2", block_in, block_in)
    for level in reversed(range(len(widths))):
        for j in range(blocks + 1):
            resnet(f"decoder.up.{level}.block.{j}", block_in, widths[level])
            block_in = widths[level]
            if level in attn_levels:
                attention(f"decoder.up.{level}.attn.{j}", block_in)
        if level:
            conv(f"decoder.up.{level}.upsample.conv", block_in, block_in, 3)
    norm("decoder.norm_out", block_in)
    conv("decoder.conv_out", 3, block_in, 3)
    # the encoder (plain GroupNorm in both tokenizers): base width widths[0], `blocks` residual blocks per level,
    # a stride-2 conv after every level but the last; generation sets it aside, encode_image reads it
    conv("encoder.conv_in", widths[0], 3, 3)
    block_in = widths[0]
    for level, width in enumerate(widths):
        for j in range(blocks):
            resnet(f"encoder.down.{level}.block.{j}", block_in, width, False)
            block_in = width
            if level in attn_levels:
                attention(f"encoder.down.{level}.attn.{j}", block_in, False)
        if level != len(widths) - 1:
            conv(f"encoder.down.{level}.downsample.conv", block_in, block_in, 3)
    resnet("encoder.mid.block_1", block_in, block_in, False)
    attention("encoder.mid.attn_1", block_in, False)
    resnet("encoder.mid.block_2", block_in, block_in, False)
    norm("encoder.norm_out", block_in, False)
    conv("encoder.conv_out", z, block_in, 3)
    conv("quant_conv", embed, z, 1)
    return shapes


def random_weights(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in shapes.items():
        if len(shape) == 1:  # biases around 0, norm scales around 1
            base = 1.0 if "norm" in key and key.endswith(".weight") else 0.0
            state[key] = base + 0.1 * torch.randn(shape, generator=generator)
        else:
            fan_in = shape[1] * (shape[2] * shape[3] if len(shape) == 4 else 1)
            state[key] = torch.randn(shape, generator=generator) / fan_in ** 0.5
    return state


CHAMELEON_VQ = dict(widths=(32, 32, 64, 64, 64), blocks=1, attn_levels=(), z=8, embed=8, codes=CODES_1, spatial=False)
MOVQ_VQ = dict(widths=(32, 32, 32, 64), blocks=1, attn_levels=(3,), z=4, embed=4, codes=CODES_2, spatial=True)
VQGAN_YAML = """model:
  target: chameleon.vqgan.VQModel
  params:
    embed_dim: 8
    n_embed: 8192
    ddconfig: {double_z: false, z_channels: 8, resolution: 64, in_channels: 3, out_ch: 3, ch: 32,
               ch_mult: [1, 1, 2, 2, 2], num_res_blocks: 1, attn_resolutions: [], dropout: 0.0}
"""


def write_tiny_lumina(folder: Path, seed: int = 0) -> Path:
    """A tiny Lumina-mGPT 1 folder (name it after the repository: the resolution comes from the name)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    image_ids = {image_token(code): 4 + code for code in range(CODES_1)}
    write_tokenizer(folder, SPECIAL_IDS_1, TEXT_START_1, image_ids)
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
         "tokenizer_class": "PreTrainedTokenizerFast"}))
    config = fork_config(VOCAB_1)
    config["vocabulary_map"] = {**SPECIAL_IDS_1, **image_ids}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    write_shards(folder, fork_state_dict(config, seed), torch.float32)
    vq = random_weights(taming_decoder_shapes(**CHAMELEON_VQ), seed + 1)
    torch.save({"state_dict": vq}, str(folder / "vqgan.ckpt"))
    (folder / "vqgan.yaml").write_text(VQGAN_YAML)
    return folder


def write_tiny_lumina2(folder: Path, seed: int = 0) -> Path:
    """A tiny Lumina-mGPT 2.0 folder; bfloat16 shards keep its 155k-row vocabulary small on disk."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_tokenizer(folder, SPECIAL_IDS_2, 0, {})
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "tokenizer_class": "PreTrainedTokenizerFast"}))
    config = fork_config(VOCAB_2)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "args.json").write_text(json.dumps({"model_size": "7B", "max_seq_len": 10240}))
    write_shards(folder, fork_state_dict(config, seed), torch.bfloat16)
    torch.save(random_weights(taming_decoder_shapes(**MOVQ_VQ), seed + 1), str(folder / "movqgan_270M.ckpt"))
    return folder


@pytest.fixture(scope="session")
def tiny_lumina_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Lumina-mGPT 1 folder at 64 px (4 x 4 codes), written once per test session."""
    return write_tiny_lumina(tmp_path_factory.mktemp("lumina") / f"Lumina-mGPT-7B-{RESOLUTION_1}")


@pytest.fixture(scope="session")
def tiny_lumina2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Lumina-mGPT 2.0 folder at 32 px (4 x 4 codes), written once per test session."""
    return write_tiny_lumina2(tmp_path_factory.mktemp("lumina2") / f"Lumina-mGPT-2.0-{RESOLUTION_2}")
