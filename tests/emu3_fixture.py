"""A tiny random Emu3-Gen checkpoint in the on-disk format of BAAI/Emu3-Gen-hf.

`write_tiny_emu3(folder)` writes config.json (model_type "emu3", with the
`vocabulary_map` that lists the visual tokens), generation_config.json, two
safetensors shards with their index under the published repository's key
names (`text_model.model.*`, `text_model.lm_head.*`, `vqmodel.*`), and a
byte-level BPE tokenizer.json carrying Emu3's special tokens plus the tokenizer
config files.  Import the session-scoped pytest fixture with
`from emu3_fixture import tiny_emu3_dir`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

PAD = "<|endoftext|>"
BOS = "<|extra_203|>"
EOS = "<|extra_204|>"
EOL = "<|extra_200|>"
EOF = "<|extra_201|>"
BOI = "<|image start|>"
EOI = "<|image end|>"
IMAGE_WRAPPER = "<|image token|>"
IMAGE = "<image>"
SPECIAL_TOKENS = (PAD, BOS, EOS, EOL, EOF, BOI, EOI, IMAGE_WRAPPER, IMAGE)
IMAGE_CODES = 64
VISUAL_TOKENS = tuple(f"<|visual token {code:06d}|>" for code in range(IMAGE_CODES))
SPATIAL_FACTOR = 8  # the VQ decoder's upsampling: 2 ** (len(channel_multiplier) - 1)


def write_tokenizer(folder: Path) -> dict[str, int]:
    """tokenizer.json (byte-level BPE + Emu3 specials + visual tokens) and its config files; returns the vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS) + list(VISUAL_TOKENS))
    tokenizer.save(str(folder / "tokenizer.json"))
    names = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": PAD}
    (folder / "special_tokens_map.json").write_text(json.dumps(names))
    # The published tokenizer_config.json names Emu3's framing tokens; Emu3Processor reads them from there.
    extra = dict(image_token=IMAGE, boi_token=BOI, eoi_token=EOI, image_wrapper_token=IMAGE_WRAPPER, eof_token=EOF)
    tokenizer_config = dict(names, tokenizer_class="GPT2TokenizerFast", model_max_length=9216,
                            extra_special_tokens=extra, **extra)
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return tokenizer.get_vocab(with_added_tokens=True)


def tiny_config(vocab: dict[str, int]):
    """An Emu3Config small enough to run the whole real code path in milliseconds."""
    from transformers import Emu3Config

    text = dict(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                initializer_range=0.2, attention_dropout=0.0, pad_token_id=vocab[PAD],
                bos_token_id=vocab[BOS], eos_token_id=vocab[EOS])
    vq = dict(codebook_size=IMAGE_CODES, embed_dim=4, latent_channels=4, base_channels=32,
              channel_multiplier=[1, 1, 1, 1], num_res_blocks=1, attn_resolutions=[],
              temporal_downsample_factor=4, hidden_size=32, num_attention_heads=1)
    return Emu3Config(text_config=text, vq_config=vq, vocabulary_map=vocab)


def legacy_key(name: str) -> str:
    """transformers' module names -> the key names of the published BAAI/Emu3-Gen-hf shards."""
    for new, old in (("model.text_model.", "text_model.model."), ("lm_head.", "text_model.lm_head."),
                     ("model.vqmodel.", "vqmodel.")):
        if name.startswith(new):
            return old + name[len(new):]
    raise AssertionError(f"unexpected Emu3 parameter {name}")


def write_shards(model: torch.nn.Module, folder: Path) -> None:
    """Two shards (language model / VQ) plus model.safetensors.index.json, as the real repository is split."""
    from safetensors.torch import save_file

    state = {legacy_key(name): tensor.contiguous() for name, tensor in model.state_dict().items()}
    shards = {"model-00001-of-00002.safetensors": {k: v for k, v in state.items() if k.startswith("text_model.")},
              "model-00002-of-00002.safetensors": {k: v for k, v in state.items() if k.startswith("vqmodel.")}}
    weight_map = {}
    for file_name, tensors in shards.items():
        save_file(tensors, str(folder / file_name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, file_name))
    size = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": size}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def write_tiny_emu3(folder: Path, seed: int = 0) -> Path:
    """Write the tiny checkpoint into `folder` (created if needed) and return it."""
    from transformers import Emu3ForConditionalGeneration

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(folder)
    torch.manual_seed(seed)
    model = Emu3ForConditionalGeneration(tiny_config(vocab)).eval()
    with torch.no_grad():  # std-0.2 weights everywhere: logits far from uniform, so samplers differ visibly
        for name, param in model.named_parameters():
            if name.startswith(("model.text_model", "lm_head")) and param.dim() == 2:
                param.normal_(0.0, 0.2)
    model.config.save_pretrained(str(folder))
    model.generation_config.save_pretrained(str(folder))
    write_shards(model, folder)
    return folder


@pytest.fixture(scope="session")
def tiny_emu3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the tiny Emu3 checkpoint, written once per test session."""
    return write_tiny_emu3(tmp_path_factory.mktemp("tiny_emu3"))
