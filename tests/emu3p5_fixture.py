"""A tiny random Emu3.5-Image in the published layout.

`write_tiny_emu3p5(folder)` writes what an Emu3.5 folder holds: config.json (model_type "Emu3", the special ids of
configuration_emu3.py), two safetensors shards with their index under the checkpoint's key names (model.layers.N.
self_attn.q_norm..., lm_head), the authors' tokenizer files (emu3.tiktoken: base64 token and rank per line, all 256
bytes plus a few merges; emu3_vision_tokens.txt: <|image token|>, <|image start|>, <|image end|>, the visual
tokens), and vision_tokenizer/ with config.yaml and a Lightning-style pickled model.ckpt ({"state_dict": ...}) of
an IBQ VQ at 16x downsampling.  The weights come from transformers' Qwen3ForCausalLM, whose layer is the one
Emu3.5's modeling file describes.  Import the fixture with `from emu3p5_fixture import tiny_emu3p5_dir`.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import torch

from scd_core.models.tokenizers.taming import DecoderSpec, VQDecoder
from scd_core.models.tokenizers.taming_encoder import EncoderSpec, VQEncoder

IMAGE_CODES = 64
EMBED_DIM, Z_CHANNELS, WIDTH = 4, 4, 32  # GroupNorm(32) needs widths of 32 or more
LEVELS = 5  # 16x downsampling, as the published ddconfig's five channel multipliers
MERGES = (b"th", b"the", b" t", b" the", b"in", b"an", b" a", b"er", b"ss", b"ist", b"US", b"ER", b"AS", b"SI",
          b"ASSI", b" ASSI", b"ant", b"ask", b"  ")
SPECIALS = 3 + 205  # <|endoftext|>, <|im_start|>, <|im_end|>, <|extra_0..204|>
VISION_LINES = ("<|image token|>", "<|image start|>", "<|image end|>",
                *(f"<|visual token {code:06d}|>" for code in range(IMAGE_CODES)))


def byte_order() -> list[int]:
    """The 256 bytes in the GPT-2 / tiktoken rank order: printable first."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    return printable + [b for b in range(256) if b not in printable]


def write_tokenizer(folder: Path) -> dict[str, int]:
    """emu3.tiktoken and emu3_vision_tokens.txt; returns the special tokens' ids (they follow the ranks)."""
    tokens = [bytes([b]) for b in byte_order()] + list(MERGES)
    lines = [f"{base64.b64encode(token).decode()} {rank}" for rank, token in enumerate(tokens)]
    (folder / "emu3.tiktoken").write_text("\n".join(lines) + "\n")
    (folder / "emu3_vision_tokens.txt").write_text("\n".join(VISION_LINES) + "\n")
    names = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", *(f"<|extra_{i}|>" for i in range(205)), *VISION_LINES)
    return {name: len(tokens) + i for i, name in enumerate(names)}


def tiny_config(ids: dict[str, int]) -> dict:
    """config.json as the published folder has it (configuration_emu3.py's fields), tiny."""
    return dict(model_type="Emu3", architectures=["Emu3ForCausalLM"],
                auto_map={"AutoConfig": "configuration_emu3.Emu3Config",
                          "AutoModelForCausalLM": "modeling_emu3.Emu3ForCausalLM"},
                vocab_size=len(ids) + ids["<|endoftext|>"], hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                hidden_act="silu", max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=1000000.0,
                rope_scaling=None, attention_dropout=0.1, tie_word_embeddings=False,
                pad_token_id=ids["<|endoftext|>"], bos_token_id=ids["<|extra_203|>"], eos_token_id=ids["<|extra_204|>"],
                img_token_id=ids["<|image token|>"], boi_token_id=ids["<|image start|>"],
                eoi_token_id=ids["<|image end|>"], eol_token_id=ids["<|extra_200|>"],
                eof_token_id=ids["<|extra_201|>"], image_area=1048576, torch_dtype="bfloat16")


def qwen3_config(config: dict):
    """The same network as transformers' Qwen3Config (what the tests' reference loop runs)."""
    from transformers import Qwen3Config

    fields = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps")
    return Qwen3Config(**{name: config[name] for name in fields}, tie_word_embeddings=False,
                       rope_theta=config["rope_theta"])  # transformers 4.x ignores rope_parameters


def write_shards(state: dict[str, torch.Tensor], folder: Path) -> None:
    """Two shards (embeddings and layer 0 / the rest) plus model.safetensors.index.json."""
    from safetensors.torch import save_file

    first = {k: v for k, v in state.items() if k.startswith(("model.embed_tokens.", "model.layers.0."))}
    shards = {"model-00001-of-00002.safetensors": first,
              "model-00002-of-00002.safetensors": {k: v for k, v in state.items() if k not in first}}
    weight_map = {}
    for file_name, tensors in shards.items():
        save_file(tensors, str(folder / file_name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, file_name))
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
             "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def vq_state(seed: int) -> dict[str, torch.Tensor]:
    """Random IBQ weights in the checkpoint's names (encoder., decoder., quantize.embedding, quant convs)."""
    torch.manual_seed(seed)
    widths = (WIDTH,) * LEVELS
    decoder = VQDecoder(DecoderSpec(codebook_size=IMAGE_CODES, embed_dim=EMBED_DIM, z_channels=Z_CHANNELS,
                                    widths=widths, num_res_blocks=1, attn_levels=frozenset(), spatial_norm=False))
    encoder = VQEncoder(EncoderSpec(codebook_size=IMAGE_CODES, embed_dim=EMBED_DIM, z_channels=Z_CHANNELS,
                                    base_width=WIDTH, widths=widths, num_res_blocks=1, attn_levels=frozenset()))
    with torch.no_grad():  # codebook entries of different lengths: IBQ's dot product and the nearest entry differ
        decoder.quantize.embedding.weight.mul_(torch.linspace(0.2, 3.0, IMAGE_CODES).unsqueeze(1))
    return {**encoder.state_dict(), **decoder.state_dict()}


def write_vision_tokenizer(folder: Path, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    ddconfig = dict(double_z=False, z_channels=Z_CHANNELS, resolution=256, in_channels=3, out_ch=3, ch=WIDTH,
                    ch_mult=[1] * LEVELS, num_res_blocks=1, attn_resolutions=[], dropout=0.0)
    import yaml

    (folder / "config.yaml").write_text(yaml.safe_dump(dict(ddconfig=ddconfig, n_embed=IMAGE_CODES,
                                                            embed_dim=EMBED_DIM, use_entropy_loss=False)))
    torch.save({"state_dict": vq_state(seed), "epoch": 3, "global_step": 1000}, str(folder / "model.ckpt"))
    return folder


# The base copy's story (greedy): its answer starts "Q", then an image of 10 x 20 codes it writes the size of ("10*20":
# bigrams <|image start|> 1, 1 0, * 2, 2 0); after each image "Z" and the next image.  Variants (`plant_story`'s
# `variant`): "eos" ends with EOS after the first image; "stray_end" writes an <|image end|> as text after "Q".
STORY_BIGRAMS = {"<|extra_100|>": "Q", "Q": "<|image start|>", "<|image start|>": "1", "1": "0", "*": "2", "2": "0",
                 "<|image end|>": "Z", "Z": "<|image start|>"}
STORY_SIZE = (10, 20)
STORY_POSITIONS = 1024


def byte_id(character: str) -> int:
    """The tiny tokenizer's id of a one-byte character (its rank)."""
    return byte_order().index(ord(character))


VARIANTS = {"text": {}, "eos": {"<|image end|>": "<|extra_204|>"}, "stray_end": {"Q": "<|image end|>"}}


def plant_story(network: torch.nn.Module, ids: dict[str, int], variant: str) -> None:
    """Make the random network follow STORY_BIGRAMS greedily: each source token's embedding a long vector of its own
    (orthonormal directions, so the residual stream at its position points there whatever the layers add), each
    target's head row along its sources' directions."""
    bigrams = {**STORY_BIGRAMS, **VARIANTS[variant]}
    token = lambda name: ids[name] if name in ids else byte_id(name)
    sources = sorted(bigrams)
    directions, _ = torch.linalg.qr(torch.randn(network.config.hidden_size, len(sources)))
    with torch.no_grad():
        for i, source in enumerate(sources):
            network.model.embed_tokens.weight[token(source)] = 40.0 * directions[:, i]
        for target in set(bigrams.values()):
            row = sum(directions[:, i] for i, source in enumerate(sources) if bigrams[source] == target)
            network.lm_head.weight[token(target)] = 4.0 * row


def write_tiny_emu3p5(folder: Path, seed: int = 0, story: str = "") -> Path:
    """Write the tiny checkpoint into `folder` (created if needed) and return it; `story` (a VARIANTS key) plants
    the base copy's story (`plant_story`) and gives it STORY_POSITIONS positions."""
    from transformers import Qwen3ForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(folder)
    config = tiny_config(ids)
    if story:
        config["max_position_embeddings"] = STORY_POSITIONS
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    torch.manual_seed(seed)
    network = Qwen3ForCausalLM(qwen3_config(config)).eval()
    with torch.no_grad():  # std-0.2 weights: logits far from uniform, so samplers differ visibly
        for name, param in network.named_parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.2)
            elif name.endswith(("q_norm.weight", "k_norm.weight")):
                param.uniform_(0.5, 1.5)  # norms that are not all ones, so leaving them out shows
    if story:
        plant_story(network, ids, story)
    write_shards({k: v.contiguous() for k, v in network.state_dict().items()}, folder)
    write_vision_tokenizer(folder / "vision_tokenizer", seed)
    return folder


def reference_network(folder: Path) -> torch.nn.Module:
    """transformers' Qwen3ForCausalLM with every lm_head row, filled from the shards apart from load_model, in
    float64."""
    from safetensors.torch import load_file
    from transformers import Qwen3ForCausalLM

    config = json.loads((folder / "config.json").read_text())
    net = Qwen3ForCausalLM(qwen3_config(config))
    state = {}
    for shard in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(shard)))
    net.load_state_dict(state, strict=True)
    return net.double().eval()


@pytest.fixture(scope="session")
def tiny_emu3p5_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder named like the published Emu3.5-Image, holding the tiny checkpoint, written once per session."""
    return write_tiny_emu3p5(tmp_path_factory.mktemp("models") / "Emu3.5-Image")


@pytest.fixture(scope="session")
def tiny_emu3p5_base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder named like the published base model (BAAI/Emu3.5) whose copy tells STORY_BIGRAMS' story."""
    return write_tiny_emu3p5(tmp_path_factory.mktemp("models") / "Emu3.5", story="text")
