"""Tiny random MammothModa2-Preview and -Dev folders in the published layout.

`write_tiny_mammothmoda2(folder, dev=False)` writes what the authors' code reads from a MammothModa2 folder
(modeling_mammothmoda2.py from_pretrained; configuration_mammothmoda2.py; tokenization_mammothmoda2_*.py):
config.json of model_type "mammothmoda2" whose llm_config names the language model ("mammothmoda2_qwen2_5_vl" for
Preview, "mammothmoda2_qwen3_vl" for Dev) with its text_config, moe_type and generation vocabulary;
t2i_generation_config.json (the visual ids, eol_token_id and the sampling values); mammothu.tiktoken (all 256
bytes and a few merges) and mammothu_vision_tokens.txt (<|image start|>, <|image token|>, <|image end|>, the visual
tokens); two safetensors shards under the checkpoint's names (llm_model.model.language_model.*, llm_model.lm_head,
llm_model.gen_head, a vision tower and DiT weights the token stage never reads).  The real ids are kept
(specials from 151643, EOL 152064, visual codes from 152072), with 24 codes and a 48-id generation vocabulary (200 on
Dev), so the authors' scope (152072 to the end of the logits, 40 ids; 64 on Dev) and the codes' (24 ids) differ.
Dev's text vocabulary is Qwen3-VL's 151936, so the logits' columns 151936.. are gen_head's and a column is not
152064 + the gen_head row.  Import the fixtures with `from mammothmoda2_fixture import tiny_preview_dir,
tiny_dev_dir`.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import torch
from emu3p5_fixture import byte_order

CODES = 24
GEN_VOCAB = {False: 48, True: 200}  # Preview's 48 ids from 152064; Dev's gen_head columns start at 151936
VISUAL_START, EOL = 152072, 152064
VISION_LINES = ("<|image start|>", "<|image token|>", "<|image end|>",
                *(f"<|visual token {code:06d}|>" for code in range(CODES)))
# "assistant" one token, as in the published ranks: the uncond row's 10 tokens then span what they span there
MERGES = (b"as", b"ss", b"is", b"st", b"ist", b"an", b"ant", b"ass", b"assist", b"assistant", b"th", b"the", b"in",
          b"er")
# the decoder, scaled down from the published shapes (a 2 x 2-patch Lumina2 DiT over a 16-channel KL VAE):
# head width 8 = sum(axes_dim_rope); the VAE halves once (the published one three times)
DIT_CONFIG = dict(_class_name="Transformer2DModel", patch_size=2, in_channels=4, hidden_size=32, num_layers=2,
                  num_refiner_layers=1, num_attention_heads=4, num_kv_heads=2, multiple_of=16,
                  ffn_dim_multiplier=None, norm_eps=1e-5, axes_dim_rope=[4, 2, 2], axes_lens=[300, 512, 512],
                  text_feat_dim=32, timestep_scale=1000.0)
VAE_CONFIG = dict(_class_name="AutoencoderKL", in_channels=3, out_channels=3, latent_channels=4,
                  down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
                  block_out_channels=[8, 8], layers_per_block=1, norm_num_groups=4, sample_size=32,
                  scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False)
GENERATION = dict(visual_token_start_id=VISUAL_START, visual_token_end_id=VISUAL_START + CODES, eol_token_id=EOL,
                  do_sample=True, temperature=0.9, top_k=5, top_p=0.95, transformers_version="4.53.2")


def text_config(dev: bool) -> dict:
    shared = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, hidden_act="silu", max_position_embeddings=2048, rms_norm_eps=1e-6,
                  extra_gen_vocab=True)
    shared["gen_vocab_size"] = GEN_VOCAB[dev]
    if dev:  # Qwen3-VL: q/k norms, its own head_dim and rope theta, the experts in every layer
        return dict(shared, model_type="mammothmoda2_qwen3_vl_text", vocab_size=151936, head_dim=8,
                    rope_theta=5000000.0, gen_vocab_start_index=EOL, moe_type="ffn",
                    rope_scaling=dict(rope_type="default", mrope_section=[2, 1, 1], mrope_interleaved=True))
    # Preview: Qwen2.5-VL; its experts in the last layers only ("ffn-14:28" in vLLM-Omni's reading, scaled down)
    return dict(shared, model_type="mammothmoda2_qwen2_5_vl_text", vocab_size=152064, rope_theta=1000000.0,
                moe_type="ffn-1:3", rope_scaling=dict(type="mrope", mrope_section=[2, 1, 1]))


def tiny_config(dev: bool) -> dict:
    llm = dict(model_type="mammothmoda2_qwen3_vl" if dev else "mammothmoda2_qwen2_5_vl",
               text_config=text_config(dev), vision_config=dict(depth=1, hidden_size=16), image_token_id=151655)
    refiner = dict(num_queries=8, num_layers=1) if dev else dict(num_queries=8, num_layers=1, num_heads=2)
    # Dev (main's configuration_mammothmoda2.py) averages hidden layers and conditions on text and image
    condition = dict(gen_condition_mode="text_image", gen_condition_layers=[-1, -2],
                     gen_text_condition_with_answer=False) if dev else dict(gen_condition_mode="image")
    return dict(model_type="mammothmoda2", architectures=["Mammothmoda2Model"], llm_config=llm,
                gen_vae_config=VAE_CONFIG, gen_dit_config=DIT_CONFIG, gen_image_condition_refiner_config=refiner,
                gen_axes_dim_rope=[4, 2, 2], gen_axes_lens=[300, 512, 512], gen_transport_config={},
                **condition, torch_dtype="bfloat16")


def write_tokenizer(folder: Path) -> None:
    tokens = [bytes([b]) for b in byte_order()] + list(MERGES)
    lines = [f"{base64.b64encode(token).decode()} {rank}" for rank, token in enumerate(tokens)]
    (folder / "mammothu.tiktoken").write_text("\n".join(lines) + "\n")
    (folder / "mammothu_vision_tokens.txt").write_text("\n".join(VISION_LINES) + "\n")


def qwen_config(config: dict):
    """The text network as transformers' Qwen2Config / Qwen3Config (what the reference loop runs)."""
    from transformers import Qwen2Config, Qwen3Config

    text = config["llm_config"]["text_config"]
    dev = config["llm_config"]["model_type"].endswith("qwen3_vl")
    names = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "rope_theta", *(("head_dim",) * dev))
    return (Qwen3Config if dev else Qwen2Config)(**{name: text[name] for name in names}, tie_word_embeddings=False)


def expert_layers(config: dict) -> range:
    text = config["llm_config"]["text_config"]
    span = text["moe_type"].partition("-")[2]
    return range(*map(int, span.split(":"))) if span else range(text["num_hidden_layers"])


def random_state(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors: the text model under llm_model.model.language_model, both heads, the generation
    embedding and experts, and a few weights of the parts the token stage skips."""
    from transformers import Qwen2Model, Qwen3Model

    torch.manual_seed(seed)
    qwen = qwen_config(config)
    net = (Qwen3Model if qwen.model_type == "qwen3" else Qwen2Model)(qwen)
    hidden, prefix = qwen.hidden_size, "llm_model.model.language_model."
    state = {prefix + k: v for k, v in net.state_dict().items() if "rotary" not in k}
    mlp_shapes = {k: v.shape for k, v in net.layers[0].mlp.state_dict().items()}
    for index in expert_layers(config):
        state.update({f"{prefix}layers.{index}.gen_mlp.{k}": torch.empty(shape) for k, shape in mlp_shapes.items()})
    gen_vocab = config["llm_config"]["text_config"]["gen_vocab_size"]
    state.update({prefix + "gen_embed_tokens.weight": torch.empty(gen_vocab, hidden),
                  "llm_model.lm_head.weight": torch.empty(qwen.vocab_size, hidden),
                  "llm_model.gen_head.weight": torch.empty(gen_vocab, hidden),
                  "llm_model.model.visual.patch_embed.proj.weight": torch.empty(16, 3),
                  **decoder_state(config)})
    for name, value in state.items():  # std-0.2 weights: logits far from uniform, so samplers differ visibly
        if value.dim() == 2:
            value.normal_(0.0, 0.2)
        elif name.endswith("norm.weight"):
            value.uniform_(0.5, 1.5)
        else:  # biases and the 1-D stand-ins
            value.normal_(0.0, 0.1)
    return {k: v.contiguous() for k, v in state.items()}


def decoder_state(config: dict) -> dict[str, torch.Tensor]:
    """The decoder's tensors under the published names (gen_transformer.*, gen_vae.*, and Preview's
    gen_image_condition_refiner.*), with the image-editing weights text-to-image never reads."""
    from scd_core.models.families.mammothmoda2_decode import MammothDecoder

    dev = config["llm_config"]["model_type"].endswith("qwen3_vl")
    decoder = MammothDecoder(config, config["llm_config"]["text_config"]["hidden_size"], dev)
    state = {key: torch.empty(value.shape) for key, value in decoder.state_dict().items()}
    width = config["gen_dit_config"]["hidden_size"]
    state.update({"gen_transformer.ref_image_patch_embedder.weight": torch.empty(width, 16),
                  "gen_transformer.image_index_embedding": torch.empty(5, width)})
    return state


def write_tiny_mammothmoda2(folder: Path, dev: bool = False, seed: int = 0, **generation) -> Path:
    """Write the tiny checkpoint into `folder` (created if needed) and return it; `generation` overrides keys of
    t2i_generation_config.json."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = tiny_config(dev)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "t2i_generation_config.json").write_text(json.dumps({**GENERATION, **generation}, indent=2))
    (folder / "und_generation_config.json").write_text(json.dumps(dict(do_sample=False), indent=2))
    write_tokenizer(folder)
    write_shards(random_state(config, seed), folder)
    return folder


def write_shards(state: dict[str, torch.Tensor], folder: Path) -> None:
    """Two shards (the embeddings and layer 0 / the rest) plus model.safetensors.index.json."""
    from safetensors.torch import save_file

    first = {k: v for k, v in state.items() if "embed_tokens." in k or ".layers.0." in k}
    shards = {"model-00001-of-00002.safetensors": first,
              "model-00002-of-00002.safetensors": {k: v for k, v in state.items() if k not in first}}
    for file_name, tensors in shards.items():
        save_file(tensors, str(folder / file_name), metadata={"format": "pt"})
    weight_map = {key: name for name, tensors in shards.items() for key in tensors}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict(sorted(weight_map.items()))}))


@pytest.fixture(scope="session")
def tiny_preview_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_mammothmoda2(tmp_path_factory.mktemp("models") / "MammothModa2-Preview")


@pytest.fixture(scope="session")
def tiny_dev_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_mammothmoda2(tmp_path_factory.mktemp("models") / "MammothModa2-Dev", dev=True, seed=1)
