"""Janus-4o editing (text + image -> image) against its authors' inference loop, written out here over
transformers' own Janus modules: their prompt, their three rows (full, part, uncond), their guidance."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from janus_fixture import BOI, BOS, CFG_PAD, EOI, IMAGE_PLACEHOLDER

from scd_core import SamplerConfig, generate, load_model
from scd_core.images.image_input import prepare_images
from scd_core.images.image_prompt import add_image
from scd_core.models.families import janus
from scd_core.models.sessions.hf_cache import cache_keyword, new_cache
from scd_core.decoding.run_settings import start_session

PROMPT = "Turn the image into a nighttime scene."


@pytest.fixture(scope="module")
def janus4o_dir(tiny_janus_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Janus checkpoint in a folder named as a converted Janus-4o (docs/models.md)."""
    return Path(shutil.copytree(tiny_janus_dir, tmp_path_factory.mktemp("models") / "Janus-4o-tiny"))


@pytest.fixture(scope="module")
def model64(janus4o_dir: Path) -> janus.JanusModel:
    return load_model(janus4o_dir, device="cpu", dtype=torch.float64)


def source_image(height: int = 48, width: int = 64) -> torch.Tensor:
    """A ComfyUI IMAGE of another size than the model's square (fitted, padded in grey)."""
    return torch.rand(1, height, width, 3, generator=torch.Generator().manual_seed(3))


def authors_ids(folder: Path, text: str, image_tokens: int) -> list[int]:
    """Their sft string (an empty system prompt), tokenized by transformers' tokenizer for the folder after
    BOS (the published tokenizer adds it, add_bos_token; the tiny one's tokenizer.json has no post-processor)."""
    from transformers import AutoTokenizer

    image = BOI + IMAGE_PLACEHOLDER * image_tokens + EOI + BOI + CFG_PAD * image_tokens + EOI
    sft = f"<|User|>: {image + text}\n\n<|Assistant|>:" + BOI
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return [tokenizer.convert_tokens_to_ids(BOS), *tokenizer.encode(sft, add_special_tokens=False)]


def authors_tokens(folder: Path, model: janus.JanusModel, image: torch.Tensor, cfg_weight: float,
                   cfg_weight2: float) -> torch.Tensor:
    """Their greedy loop: three rows, features at the placeholders (full, part), the codes' generation
    embeddings after the first end-of-image (full), uncond all pad but BOS and begin-of-image."""
    from transformers import AutoTokenizer, JanusForConditionalGeneration

    reference = JanusForConditionalGeneration.from_pretrained(str(folder)).double().eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    ids = torch.tensor(authors_ids(folder, PROMPT, model.num_tokens))
    pad, end = tokenizer.convert_tokens_to_ids(CFG_PAD), tokenizer.convert_tokens_to_ids(EOI)
    tokens = ids.repeat(3, 1)
    tokens[2, 1:-1] = pad
    side = model.image_pixels
    pixels = prepare_images(image, (side, side), "pad", fill=janus.PAD_GREY).pixels.double()
    with torch.no_grad():
        features = reference.model.get_image_features(pixels)
        features = getattr(features, "pooler_output", features)  # transformers 5: an output, before: a tensor
        embeds = reference.get_input_embeddings()(tokens)
        placeholder = tokens[:2] == reference.config.image_token_id
        embeds[:2][placeholder] = features.reshape(-1, features.shape[-1]).repeat(2, 1)
        offset = int((tokens[0] == end).nonzero()[0]) + 2
        codes = model.encode_image(image)[0]
        embeds[0, offset:offset + model.num_tokens] = reference.prepare_embeddings_for_image_generation(codes)
        # one cache, filled in place, under the keyword this release takes (transformers 5.24 renamed it `cache`)
        generated, past = [], new_cache()
        for _ in range(model.num_tokens):
            out = reference.model.language_model(inputs_embeds=embeds, use_cache=True, **{cache_keyword(): past})
            logits = reference.model.generation_head(out.last_hidden_state[:, -1])
            full, part, uncond = logits
            cond = (full + cfg_weight2 * part) / (1 + cfg_weight2)
            guided = uncond + cfg_weight * (cond - uncond)
            token = guided.argmax()
            generated.append(int(token))
            embeds = reference.prepare_embeddings_for_image_generation(token.repeat(3))[:, None]
    return torch.tensor([generated])


def test_edit_prompt_is_the_authors(model64: janus.JanusModel, janus4o_dir: Path) -> None:
    assert model64.understanding.module is None  # nothing loaded before an image is given
    edit = add_image(model64, model64.encode(PROMPT), source_image(), "edit").cond
    assert list(edit.ids) == authors_ids(janus4o_dir, PROMPT, model64.num_tokens)
    assert model64.understanding.module is not None
    pad = model64._pad
    assert edit.uncond == (edit.ids[0],) + (pad,) * (len(edit.ids) - 2) + (edit.ids[-1],)
    assert edit.ids[edit.codes_at:edit.codes_at + model64.num_tokens] == (pad,) * model64.num_tokens
    assert edit.image_cfg == janus.DEFAULT_IMAGE_CFG


@pytest.mark.parametrize("window,coupler", [(1, "maximal"), (8, "maximal"), (8, "faithful")])
def test_greedy_edit_equals_the_authors_loop(model64: janus.JanusModel, janus4o_dir: Path, window: int,
                                             coupler: str) -> None:
    image = source_image()
    edit = add_image(model64, model64.encode(PROMPT), image, "edit", image_cfg=3.0).cond
    expected = authors_tokens(janus4o_dir, model64, image, cfg_weight=4.0, cfg_weight2=3.0)
    config = SamplerConfig(window=window, coupler=coupler, top_k=1, cfg_scale=4.0)
    assert torch.equal(generate(model64, edit, config).tokens, expected)
    assert not torch.equal(generate(model64, model64.encode(PROMPT), config).tokens, expected)  # the image counts


def test_sampled_edit_reproduces_its_seed_at_any_window_and_batch(model64: janus.JanusModel) -> None:
    edit = add_image(model64, model64.encode(PROMPT), source_image(), "edit").cond
    alone = generate(model64, edit, SamplerConfig(window=1, seed=5)).tokens
    batched = generate(model64, edit, SamplerConfig(window=8, seed=4), batch_size=2).tokens
    assert torch.equal(batched[1:], alone)  # row 1 of seed 4 is seed 5


def test_cfg_1_leaves_the_uncond_rows_out(model64: janus.JanusModel) -> None:
    edit = add_image(model64, model64.encode(PROMPT), source_image(), "edit").cond
    config = SamplerConfig(cfg_scale=1.0, top_k=1, window=4)
    assert start_session(model64, edit, 1, config).copies == 2
    all_rows = model64.start(edit, 1)
    assert all_rows.copies == 3
    kept = generate(model64, edit, config).tokens
    monkey = pytest.MonkeyPatch()
    monkey.setattr(janus.JanusModel, "start", lambda self, cond, batch_size: all_rows)  # no guided keyword
    try:
        assert torch.equal(generate(model64, edit, config).tokens, kept)
    finally:
        monkey.undo()


def test_plain_janus_pro_refuses_to_edit(tiny_janus_dir: Path) -> None:
    model = load_model(tiny_janus_dir, device="cpu", dtype=torch.float32)
    assert model.understanding is None and model.image_tasks == ()
    with pytest.raises(ValueError, match="Janus-4o"):
        add_image(model, model.encode(PROMPT), source_image(), "edit")


def test_bad_edit_inputs_are_refused(model64: janus.JanusModel) -> None:
    cond = model64.encode(PROMPT)
    with pytest.raises(ValueError, match="one image per prompt"):
        add_image(model64, cond, source_image().repeat(2, 1, 1, 1), "edit")
    with pytest.raises(ValueError, match="image_cfg"):
        add_image(model64, cond, source_image(), "edit", image_cfg=-2.0)
    with pytest.raises(ValueError, match="image_cfg"):
        add_image(model64, cond, source_image(), "continue", image_cfg=2.0)


def test_negative_prompt_replaces_the_all_pad_uncond_rows(model64: janus.JanusModel) -> None:
    cond = model64.encode(PROMPT, negative_prompt="blurry")
    edit = add_image(model64, cond, source_image(), "edit").cond
    assert edit.uncond == cond.uncond and len(edit.uncond) < len(edit.ids)  # left-padded, masked
    config = SamplerConfig(window=1, seed=2)
    assert torch.equal(generate(model64, edit, SamplerConfig(window=8, seed=2)).tokens,
                       generate(model64, edit, config).tokens)
    plain = add_image(model64, model64.encode(PROMPT), source_image(), "edit").cond
    assert not torch.equal(generate(model64, plain, config).tokens, generate(model64, edit, config).tokens)


def test_compiled_edit_gives_the_eager_tokens(janus4o_dir: Path, model64: janus.JanusModel) -> None:
    compiled = load_model(janus4o_dir, device="cpu", dtype=torch.float64, compile=True)
    image, config = source_image(), SamplerConfig(window=8, seed=1)
    edit = add_image(model64, model64.encode(PROMPT), image, "edit").cond
    compiled_edit = add_image(compiled, compiled.encode(PROMPT), image, "edit").cond
    assert torch.equal(generate(compiled, compiled_edit, config).tokens, generate(model64, edit, config).tokens)
