"""A tiny random Janus checkpoint in the real Hugging Face on-disk format.

`write_tiny_janus(folder)` saves a JanusForConditionalGeneration of 3.5M
parameters (14 MB) through save_pretrained (config.json, generation_config.json,
model.safetensors) plus a byte-level BPE tokenizer.json carrying Janus's special
tokens and the tokenizer config files.  Import the session-scoped pytest fixture
with `from janus_fixture import tiny_janus_dir`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
CFG_PAD = "<｜▁pad▁｜>"
BOI = "<begin_of_image>"
EOI = "<end_of_image>"
IMAGE_PLACEHOLDER = "<image_placeholder>"
SPECIAL_TOKENS = (BOS, EOS, CFG_PAD, IMAGE_PLACEHOLDER, BOI, EOI)
BYTE_TOKENS = 256  # the byte-level alphabet, one token per byte
TEXT_VOCAB = 272  # bytes, the special tokens, and spare rows like the real embedding table
IMAGE_SIZE, PATCH_SIZE = 64, 16  # a 4 x 4 token grid
IMAGE_CODES = 128


def write_tokenizer(folder: Path) -> dict[str, int]:
    """tokenizer.json (byte-level BPE + Janus specials) and its config files; returns special ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer.save(str(folder / "tokenizer.json"))
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    # As in the real folder, the tokenizer's own pad token is not the one Janus uses for CFG rows.
    names = {"bos_token": BOS, "eos_token": EOS, "pad_token": EOS}
    (folder / "special_tokens_map.json").write_text(json.dumps(names, ensure_ascii=False))
    tokenizer_config = dict(names, tokenizer_class="LlamaTokenizerFast", add_bos_token=True,
                            add_eos_token=False, model_max_length=16384, image_token=IMAGE_PLACEHOLDER,
                            boi_token=BOI, eoi_token=EOI)
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, ensure_ascii=False))
    return ids


def tiny_config(ids: dict[str, int]):
    """A JanusConfig small enough to run the whole real code path in milliseconds."""
    from transformers import JanusConfig

    text = dict(model_type="llama", vocab_size=TEXT_VOCAB, hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=512, initializer_range=0.2,
                bos_token_id=ids[BOS], eos_token_id=ids[EOS], pad_token_id=ids[EOS])
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=IMAGE_SIZE,
                  patch_size=PATCH_SIZE, num_image_tokens=(IMAGE_SIZE // PATCH_SIZE) ** 2, projection_dim=64)
    vq = dict(embed_dim=8, num_embeddings=IMAGE_CODES, base_channels=32, latent_channels=32,
              channel_multiplier=[1, 1, 2, 2, 4], num_res_blocks=1, projection_dim=64,
              image_token_embed_dim=64, initializer_range=0.2)
    return JanusConfig(text_config=text, vision_config=vision, vq_config=vq,
                       image_token_id=ids[IMAGE_PLACEHOLDER], initializer_range=0.2)


def sharpen_image_path(model: torch.nn.Module, gain: float = 2.0) -> None:
    """Re-draw the image embedding/head weights so the token distributions are far from uniform.

    transformers initialises them with std 0.02, which at this width gives logits
    within +-0.05 of each other: every sampler would then look alike.
    """
    parts = model.model
    with torch.no_grad():
        parts.generation_embeddings.weight.normal_(0.0, 1.0)
        for module in (parts.generation_aligner, parts.generation_head):
            for layer in module.modules():
                if isinstance(layer, torch.nn.Linear):
                    layer.weight.normal_(0.0, gain / layer.in_features ** 0.5)


def write_tiny_janus(folder: Path, seed: int = 0) -> Path:
    """Write the tiny checkpoint into `folder` (created if needed) and return it."""
    from transformers import JanusForConditionalGeneration

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(folder)
    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(tiny_config(ids)).eval()
    sharpen_image_path(model)
    # The converter for the published checkpoints sets these; transformers' generate reads them.
    model.generation_config.pad_token_id = ids[CFG_PAD]
    model.generation_config.bos_token_id = ids[BOS]
    model.generation_config.boi_token_id = ids[BOI]
    model.generation_config.guidance_scale = 5
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


@pytest.fixture(scope="session")
def tiny_janus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the tiny Janus checkpoint, written once per test session."""
    return write_tiny_janus(tmp_path_factory.mktemp("tiny_janus"))
