"""A tiny random GLM-Image folder in the published zai-org/GLM-Image layout (diffusers' pipeline layout).

`write_tiny_glm_image(folder)` builds a GlmImageForConditionalGeneration from transformers' GlmImageConfig
with small sizes, a GLM-Image processor (a byte-level tokenizer whose first ids are the `<|dit_token_N|>`
tokens, as in the real vocabulary, plus the grid and image markers), a tiny glyph encoder (T5 + ByT5
tokenizer), DiT, VAE and scheduler, and saves them all with `GlmImagePipeline.save_pretrained`: model_index.json
and one subfolder per component.  Needs transformers >= 5 and diffusers.  Import the session-scoped fixture with
`from glm_image_fixture import tiny_glm_image_dir`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

CODES = 64  # the VQ codebook: generated image ids are 0..CODES-1 (16384 in the real model)
VISION_VOCAB = CODES + 16  # the AR head's width: codes, image start/end and spares (16512 in the real model)
IMAGE_START, IMAGE_END = CODES, CODES + 1  # <|dit_token_64|> / <|dit_token_65|>, as 16384 / 16385 really
GRID_BOS, GRID_EOS, IMAGE_TOKEN = "<sop>", "<eop>", "<|image|>"
PAD = "<|endoftext|>"
# what the published chat template renders: each source image as start, placeholder, end, then the text
CHAT_TEMPLATE = ("{%- for message in messages -%}{%- if message.content is string -%}{{ message.content }}"
                 "{%- else -%}{%- for item in message.content -%}"
                 "{%- if item.type == 'image' -%}<|dit_token_" + str(IMAGE_START) + "|><|image|><|dit_token_"
                 + str(IMAGE_END) + "|>{%- elif item.type == 'text' -%}{{ item.text }}{%- endif -%}"
                 "{%- endfor -%}{%- endif -%}{%- endfor -%}")
# the sampling keys of zai-org/GLM-Image's vision_language_encoder/generation_config.json: no top_k, which
# generate then takes from transformers' global defaults (50)
PUBLISHED_SAMPLING = {"do_sample": True, "temperature": 0.9, "top_p": 0.75}
HEIGHT, WIDTH = 128, 96  # a 4 x 3 grid of 32 px tokens (the preview grid is 18 x 13)


def dit_token(index: int) -> str:
    return f"<|dit_token_{index}|>"


def write_tokenizer() -> object:
    """A fast tokenizer: ids 0..VISION_VOCAB-1 are the dit tokens, then the byte-level alphabet and markers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {dit_token(i): i for i in range(VISION_VOCAB)}
    vocab.update({ch: VISION_VOCAB + i for i, ch in enumerate(alphabet)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([dit_token(i) for i in range(VISION_VOCAB)] + [GRID_BOS, GRID_EOS, IMAGE_TOKEN, PAD])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=dit_token(IMAGE_START),
                                   eos_token=dit_token(IMAGE_END), pad_token=PAD,
                                   extra_special_tokens={"image_token": IMAGE_TOKEN, "grid_bos_token": GRID_BOS,
                                                         "grid_eos_token": GRID_EOS})


def tiny_processor() -> object:
    from transformers import GlmImageImageProcessor, GlmImageProcessor

    # one code per 32 px of a source image, as the pipeline's decoder expects (it upsamples them 2x)
    images = GlmImageImageProcessor(patch_size=32, temporal_patch_size=1, merge_size=1,
                                    size={"shortest_edge": 32 * 32, "longest_edge": 128 * 128})
    return GlmImageProcessor(image_processor=images, tokenizer=write_tokenizer(), chat_template=CHAT_TEMPLATE)


def tiny_ar_model(tokenizer: object) -> torch.nn.Module:
    """The AR stage: 2 layers of width 128 (heads of 32, half of them rotated, as GLM-4's), 3-D M-RoPE."""
    from transformers import GlmImageConfig, GlmImageForConditionalGeneration

    text = dict(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                vision_vocab_size=VISION_VOCAB, initializer_range=0.2, pad_token_id=tokenizer.pad_token_id,
                eos_token_id=IMAGE_END,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                 "mrope_section": [2, 3, 3]})
    vision = dict(depth=1, hidden_size=32, num_heads=2, image_size=64, patch_size=32, intermediate_size=32)
    vq = dict(embed_dim=16, num_embeddings=CODES, latent_channels=32)
    config = GlmImageConfig(text_config=text, vision_config=vision, vq_config=vq,
                            image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
                            image_start_token_id=IMAGE_START, image_end_token_id=IMAGE_END)
    model = GlmImageForConditionalGeneration(config).eval()
    # transformers' init leaves greedy decoding stuck on one or two ids at this width; re-drawn weights give
    # logits far from uniform that depend on the context and positions, so an oracle can tell paths apart
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 3.0 / 128 ** 0.5)
        for name, weight in model.model.language_model.named_parameters():
            if name.endswith("proj.weight"):
                weight.normal_(0.0, 1.5 / weight.shape[1] ** 0.5)
    model.generation_config.update(**PUBLISHED_SAMPLING)
    return model


def tiny_pipeline() -> object:
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, GlmImagePipeline, GlmImageTransformer2DModel
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    processor = tiny_processor()
    ar_model = tiny_ar_model(processor.tokenizer)
    glyph = T5EncoderModel(T5Config(vocab_size=384, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2))
    # patch 2 x VAE factor 8 = 16 px: the 32 px AR tokens upsampled 2x, as in the published pipeline
    transformer = GlmImageTransformer2DModel(patch_size=2, in_channels=4, out_channels=4, num_layers=2,
                                             attention_head_dim=8, num_attention_heads=2, text_embed_dim=32,
                                             time_embed_dim=16, condition_dim=8,
                                             prior_vq_quantizer_codebook_size=CODES)
    vae = AutoencoderKL(block_out_channels=(4, 8, 16, 16), in_channels=3, out_channels=3,
                        down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
                        latent_channels=4, norm_num_groups=4, sample_size=128, latents_mean=[0.0] * 4,
                        latents_std=[1.0] * 4)
    return GlmImagePipeline(tokenizer=ByT5Tokenizer(), processor=processor, text_encoder=glyph,
                            vision_language_encoder=ar_model, vae=vae,
                            transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler())


def write_tiny_glm_image(folder: Path, seed: int = 0) -> Path:
    """Write the tiny pipeline into `folder` (created if needed) and return it."""
    folder = Path(folder)
    torch.manual_seed(seed)
    tiny_pipeline().save_pretrained(str(folder), safe_serialization=True)
    return folder


@pytest.fixture(scope="session")
def tiny_glm_image_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the tiny GLM-Image pipeline, written once per test session."""
    return write_tiny_glm_image(tmp_path_factory.mktemp("tiny_glm_image"))
