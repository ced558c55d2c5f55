"""The GLM-Image adapter on a tiny random folder in the published layout, against transformers and diffusers.

The oldest tier (transformers 4.x, no GLM-Image there) runs only the loader's refusal; the tests that build the
tiny folder need transformers 5 and are skipped there by the explicit version check below.
"""

from __future__ import annotations

import builtins
import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from packaging.version import Version

from pace import assert_each_row_matches, assert_own_pace_gives_ar_tokens, staggered_logits

from scd_core import ModelLoadError, SamplerConfig, TokenModel, generate, load_model, set_decoding
from scd_core.models.families import glm_image
from scd_core.decoding.run_settings import start_session
from scd_core.models.pixels import one_thread

HAS_GLM_IMAGE = Version(transformers.__version__) >= Version(glm_image.TRANSFORMERS_NEEDED)
needs_glm_image = pytest.mark.skipif(not HAS_GLM_IMAGE, reason="GLM-Image needs transformers >= 5 (oldest tier)")
needs_bnb = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None,
                               reason="bitsandbytes (tests/requirements.txt) is not installed")
PROMPT = "a red cube"
NEGATIVE = "a blue cat"  # as many tokens as PROMPT: transformers' CFG then positions the uncond pass right


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from glm_image_fixture import write_tiny_glm_image

    return write_tiny_glm_image(tmp_path_factory.mktemp("tiny_glm_image"))


def loaded(folder: Path, dtype: object) -> glm_image.GlmImageModel:
    from glm_image_fixture import HEIGHT, WIDTH

    model = load_model(folder, device="cpu", dtype=dtype)
    model.set_image_size(WIDTH, HEIGHT)
    return model


@pytest.fixture(scope="module")
def model(folder: Path) -> glm_image.GlmImageModel:
    return loaded(folder, "float32")


@pytest.fixture(scope="module")
def model64(folder: Path) -> glm_image.GlmImageModel:
    return loaded(folder, torch.float64)


def chat_inputs(model: glm_image.GlmImageModel, text: str) -> dict:
    """What the pipeline's `generate_prior_tokens` gives transformers' generate for `text`."""
    messages = [[{"role": "user", "content": [{"type": "text", "text": text}]}]]
    height, width = model.size
    return model.processor.apply_chat_template(messages, tokenize=True, padding=False, target_h=height,
                                               target_w=width, return_dict=True, return_tensors="pt")


@needs_glm_image
def test_loaded_model_describes_itself(model: glm_image.GlmImageModel) -> None:
    from glm_image_fixture import CODES

    assert isinstance(model, TokenModel) and model.family == "glm_image"
    assert model.grids == ((18, 13), (4, 3)) and model.grid == (4, 3)
    assert (model.num_tokens, model.vocab_size) == (18 * 13 + 4 * 3, CODES)
    # the folder's generation_config.json, which the pipeline samples with
    assert (model.default_temperature, model.default_top_p, model.default_cfg_scale) == (0.9, 0.75, 1.0)
    assert not hasattr(model.module.model, "visual")  # text-to-image never runs the source-image tower


@needs_glm_image
def test_prompt_and_grids_are_the_processors(model: glm_image.GlmImageModel) -> None:
    inputs = chat_inputs(model, PROMPT)
    prompt = model.encode(PROMPT, NEGATIVE)
    assert list(prompt.cond) == inputs["input_ids"][0].tolist()
    assert list(prompt.uncond) == chat_inputs(model, NEGATIVE)["input_ids"][0].tolist()
    assert model.encode(PROMPT).uncond == tuple(chat_inputs(model, "")["input_ids"][0].tolist())
    # the processor lists the large grid then the preview; generation runs them in reverse
    grids = [tuple(grid[1:]) for grid in inputs["image_grid_thw"].tolist()]
    assert tuple(reversed(grids)) == model.grids


@needs_glm_image
def test_positions_are_transformers_mrope(model: glm_image.GlmImageModel) -> None:
    """Every slot of a left-padded uncond row and of a cond row gets get_rope_index's position."""
    cond = model.encode(PROMPT)  # the uncond ("" prompt) is shorter: left-padded
    session = model.start(cond, 1)
    rows = session.cache
    backbone = session.network._make_backbone(rows)  # the backbone the session builds for its cache
    slots = torch.arange(rows.prefix + model.num_tokens).expand(2, -1)
    ours = backbone.positions(slots)
    net = model.module.model
    for row, ids in enumerate((cond.cond, cond.uncond)):
        inputs = chat_inputs(model, PROMPT if row == 0 else "")
        prompt_positions, _ = net.get_rope_index(inputs["input_ids"], inputs["image_grid_thw"],
                                                 inputs["images_per_sample"], inputs["attention_mask"])
        decode = net._cached_decode_position_ids[0, :, :model.num_tokens]
        pads = rows.prefix - len(ids)
        assert torch.equal(ours[:, row, pads:rows.prefix], prompt_positions[:, 0])
        assert torch.equal(ours[:, row, rows.prefix:], decode)


def transformers_greedy(model: glm_image.GlmImageModel, folder: Path, cfg: float) -> torch.Tensor:
    """transformers' own generate on the processor's prompt, greedy among the image codes, CFG through its
    `guidance_scale` with the negative prompt's ids."""
    from transformers import GlmImageForConditionalGeneration

    reference = GlmImageForConditionalGeneration.from_pretrained(str(folder / glm_image.AR_FOLDER)).eval()
    inputs = chat_inputs(model, PROMPT)
    extra = {} if cfg == 1 else dict(guidance_scale=cfg,
                                     negative_prompt_ids=chat_inputs(model, NEGATIVE)["input_ids"])
    heads = reference.config.text_config.vision_vocab_size
    out = reference.generate(**inputs, max_new_tokens=model.num_tokens, do_sample=False,
                             suppress_tokens=list(range(model.vocab_size, heads)), **extra)
    return out[0, inputs["input_ids"].shape[1]:]


@needs_glm_image
@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_greedy_tokens_equal_transformers_generate(model: glm_image.GlmImageModel, folder: Path,
                                                   cfg: float) -> None:
    expected = transformers_greedy(model, folder, cfg)
    assert expected.shape == (model.num_tokens,) and len(set(expected.tolist())) > 10  # not a stuck oracle
    cond = model.encode(PROMPT, NEGATIVE)
    for coupler, window in (("maximal", 1), ("maximal", 8), ("faithful", 8)):
        config = SamplerConfig(coupler=coupler, window=window, top_k=1, cfg_scale=cfg, seed=0)
        assert torch.equal(generate(model, cond, config).tokens[0], expected), (coupler, window)


@needs_glm_image
def test_default_sampling_law_is_the_pipelines(model: glm_image.GlmImageModel, folder: Path) -> None:
    """Left at the model's values, the engine samples the law of the pipeline's `generate(..., do_sample=True)`
    on the same folder: transformers' own logits processors, built by generate from the folder's
    generation_config.json (as published: temperature 0.9, top_p 0.75, no top_k) and its global defaults, which
    add top-k 50."""
    from glm_image_fixture import PUBLISHED_SAMPLING
    from sampling_law import assert_same_law, default_probs, processed_probs, spread_logits
    from transformers import GlmImageForConditionalGeneration

    saved = json.loads((folder / glm_image.AR_FOLDER / "generation_config.json").read_text())
    assert {key: saved.get(key) for key in ("do_sample", "temperature", "top_p", "top_k")} == \
        {**PUBLISHED_SAMPLING, "top_k": None}
    net = GlmImageForConditionalGeneration.from_pretrained(str(folder / glm_image.AR_FOLDER))
    generation, _ = net._prepare_generation_config(None, do_sample=True)  # what the pipeline's call builds
    processors = net._get_logits_processor(generation_config=generation, input_ids_seq_length=1,
                                           encoder_input_ids=None, prefix_allowed_tokens_fn=None,
                                           logits_processor=None)
    logits = spread_logits(model.vocab_size)
    assert_same_law(default_probs(model, logits), processed_probs(processors, logits))
    assert (model.default_temperature, model.default_top_k, model.default_top_p) == (0.9, 50, 0.75)


@needs_glm_image
def test_unset_sampling_settings_sample_as_generate_reads_the_folder(model: glm_image.GlmImageModel) -> None:
    """Left at "the model's value" (SamplerConfig's None, the node's -1 / 0 widgets, the CLI without
    --temperature / --top-k / --top-p) GLM-Image samples at its generation_config's 0.9 and 0.75 and generate's
    top-k 50: the tokens of those values set by hand."""
    import argparse

    from scd_core.frontends.cli_shared import add_sampler_arguments, sampler_config
    from scd_core.decoding.run_settings import sampling_settings
    from scd_core.decoding.sampling import Sampling

    parser = argparse.ArgumentParser()
    add_sampler_arguments(parser)
    for config in (SamplerConfig(window=8, seed=5), sampler_config(parser.parse_args(["--window", "8"]), 5)):
        assert sampling_settings(model, config) == Sampling(cfg_scale=1.0, temperature=0.9, top_k=50, top_p=0.75)
    cond = model.encode(PROMPT)
    unset = generate(model, cond, SamplerConfig(window=8, seed=5)).tokens
    assert torch.equal(unset, generate(model, cond, SamplerConfig(window=8, seed=5, temperature=0.9, top_k=50,
                                                                  top_p=0.75)).tokens)


def source_picture() -> object:
    from PIL import Image

    pixels = torch.rand(96, 64, 3, generator=torch.Generator().manual_seed(0))
    return Image.fromarray((pixels * 255).to(torch.uint8).numpy())


@pytest.fixture(scope="module")
def edit_reference(model: glm_image.GlmImageModel, folder: Path) -> tuple[object, dict, torch.Tensor]:
    """(a source picture, the processor's inputs for it and PROMPT, transformers' greedy generate on them:
    the large grid's codes)."""
    from transformers import GlmImageForConditionalGeneration

    picture = source_picture()
    messages = [[{"role": "user", "content": [{"type": "image", "image": picture},
                                              {"type": "text", "text": PROMPT}]}]]
    inputs = model.processor.apply_chat_template(messages, tokenize=True, target_h=model.size[0],
                                                 target_w=model.size[1], return_dict=True, return_tensors="pt")
    reference = GlmImageForConditionalGeneration.from_pretrained(str(folder / glm_image.AR_FOLDER)).eval()
    rows, cols = glm_image.grid_sizes(*model.size)[1]
    heads = reference.config.text_config.vision_vocab_size
    expected = reference.generate(**inputs, max_new_tokens=rows * cols, do_sample=False,
                                  suppress_tokens=list(range(model.vocab_size, heads)))
    return picture, inputs, expected[0, inputs["input_ids"].shape[1]:]


@needs_glm_image
def test_image_to_image_greedy_tokens_equal_transformers_generate(model: glm_image.GlmImageModel,
                                                                  edit_reference: tuple) -> None:
    """The source image's codes in the prompt (from the AR model's own vision tower and VQ), 2-D positions for
    them, only the large grid sampled: as transformers' generate does from the processor's pixels."""
    picture, inputs, expected = edit_reference
    cond = model.encode(PROMPT, image=picture)
    assert cond.source.grid == tuple(inputs["image_grid_thw"][0, 1:].tolist())
    assert len(cond.source.codes) == cond.source.grid[0] * cond.source.grid[1] > 1
    assert len(cond.cond) == inputs["input_ids"].shape[1]
    rows, cols = glm_image.grid_sizes(*model.size)[1]
    for coupler, window in (("maximal", 1), ("faithful", 8)):
        config = SamplerConfig(coupler=coupler, window=window, top_k=1, cfg_scale=1.0, seed=0)
        tokens = generate(model, cond, config).tokens[0]
        assert model.grids == ((rows, cols),) and torch.equal(tokens, expected), (coupler, window)
    set_decoding(model, steps=2)
    images = model.decode(tokens[None])
    assert images.shape == (1, *model.size, 3)
    generate(model, model.encode(PROMPT), SamplerConfig(window=8, seed=0))  # back to text-to-image
    assert len(model.grids) == 2


@needs_glm_image
def test_add_image_is_the_image_prompt_path(model: glm_image.GlmImageModel, edit_reference: tuple) -> None:
    """The shared image-prompt interface (task "edit") on a ComfyUI IMAGE builds the prompt `encode(...,
    image=)` builds from the same pixels, at the conditioning's size, so its greedy tokens are transformers'."""
    from glm_image_fixture import HEIGHT, WIDTH

    picture, _, expected = edit_reference
    images = torch.tensor(np.asarray(picture), dtype=torch.float32).unsqueeze(0) / 255  # (1, H, W, 3) in 0..1
    assert model.image_tasks == ("edit",)
    text_only = model.encode(PROMPT, NEGATIVE)
    model.set_image_size(64, 64)  # the conditioning's size wins, as in start
    edit = model.add_image(text_only, images, "edit")
    assert model.size == edit.size == text_only.size == (HEIGHT, WIDTH)
    direct = model.encode(PROMPT, NEGATIVE, image=picture)
    assert (edit.cond, edit.uncond, edit.text, edit.negative) == (direct.cond, direct.uncond, PROMPT, NEGATIVE)
    assert (edit.source.codes, edit.source.grid, edit.source.positions) == \
        (direct.source.codes, direct.source.grid, direct.source.positions)
    assert edit.uncond != model.add_image(model.encode(PROMPT), images, "edit").uncond  # the negative kept
    config = SamplerConfig(coupler="faithful", window=8, top_k=1, cfg_scale=1.0, seed=0)
    assert torch.equal(generate(model, edit, config).tokens[0], expected)
    with pytest.raises(ValueError, match=r"task 'depth' is not one the GLM-Image checkpoint .* takes edit"):
        model.add_image(text_only, images, "depth")
    with pytest.raises(ValueError, match="one source image per prompt, got a batch of 2"):
        model.add_image(text_only, images.expand(2, -1, -1, -1), "edit")
    with pytest.raises(ValueError, match="already holds a source image"):
        model.add_image(edit, images, "edit")
    with pytest.raises(ValueError, match="cond must come from GlmImageModel.encode"):
        model.add_image("a red cube", images, "edit")
    generate(model, text_only, SamplerConfig(window=8, seed=0))  # back to text-to-image
    assert len(model.grids) == 2


class TwoBranches:
    """The model with a `start` that cannot leave the uncond rows out (no `guided` parameter): the two-branch
    path at any guidance scale, as every run took before `run_settings.start_session`."""

    def __init__(self, model: glm_image.GlmImageModel) -> None:
        self.model = model

    def __getattr__(self, name: str) -> object:
        return getattr(self.model, name)

    def start(self, cond: glm_image.GlmImagePrompt, batch_size: int) -> object:
        return self.model.start(cond, batch_size)


@needs_glm_image
@pytest.mark.parametrize("edit", [False, True], ids=["text-to-image", "image-to-image"])
def test_cfg_1_without_uncond_rows_gives_the_two_branch_tokens(model64: glm_image.GlmImageModel, edit: bool) -> None:
    """At CFG 1 (GLM-Image's default) the uncond logits are never read: `start_session` then starts the session
    with guided=False, which feeds one row per image (the two-branch path two) and samples the same tokens in
    the same calls."""
    cond = model64.encode(PROMPT, NEGATIVE, image=source_picture() if edit else None)
    for config, copies in ((SamplerConfig(), 1), (SamplerConfig(cfg_scale=1.0), 1), (SamplerConfig(cfg_scale=3.0), 2)):
        assert start_session(model64, cond, 2, config).copies == copies, config.cfg_scale
    session = model64.start(cond, 2, guided=False)
    assert session.prefill()[1] is None and session.cache.lengths.shape == (2,)
    rows: list[int] = []  # rows of each backbone call
    hook = model64.module.model.language_model.register_forward_hook(
        lambda module, args, kwargs, out: rows.append(kwargs["inputs_embeds"].shape[0]), with_kwargs=True)
    try:
        for coupler, window in (("faithful", 8),) if edit else (("faithful", 8), ("maximal", 4)):
            config = SamplerConfig(coupler=coupler, window=window, cfg_scale=1.0, seed=3)
            both = generate(TwoBranches(model64), cond, config, batch_size=2)
            both_rows = rows[:]
            rows.clear()
            cond_only = generate(model64, cond, config, batch_size=2)  # generate starts it through start_session
            assert torch.equal(cond_only.tokens, both.tokens) and cond_only.nfe == both.nfe, (coupler, window)
            # call for call, one row per image still decoding (a finished image leaves the batch) against two
            assert rows[0] == 2 and both_rows == [2 * count for count in rows] and len(rows) == cond_only.nfe
            rows.clear()
    finally:
        hook.remove()


@needs_glm_image
@pytest.mark.parametrize("negative", [None, "blurry"])
def test_rows_at_different_positions_give_each_rows_sequential_logits(model64: glm_image.GlmImageModel,
                                                                       negative: str | None) -> None:
    """Rows at different lengths in one call, over slots they rejected; the uncond prompts ("" and "blurry")
    are left-padded."""
    tokens = torch.randint(0, model64.vocab_size, (3, 16), generator=torch.Generator().manual_seed(2))
    calls = [(tokens[:, :6], [5, 2, 0]), (tokens[:, 6:10], [2, 5, 3]), (tokens[:, 10:13], [0, 0, 1], [2, 0]),
             (tokens[[2, 0], 13:16], [0, 0])]  # row 1 finished: the session drops it
    assert_each_row_matches(staggered_logits(model64, model64.encode(PROMPT, negative), calls), 1e-10)


@needs_glm_image
def test_faithful_rows_at_their_own_pace_give_the_window_1_and_batch_1_tokens(model64: glm_image.GlmImageModel
                                                                              ) -> None:
    assert_own_pace_gives_ar_tokens(model64, model64.encode(PROMPT), seed=0)


@needs_glm_image
def test_decode_equals_the_pipeline_for_the_same_tokens(model: glm_image.GlmImageModel, folder: Path) -> None:
    from diffusers import GlmImagePipeline

    tokens = torch.randint(0, model.vocab_size, (2, model.num_tokens), generator=torch.Generator().manual_seed(1))
    set_decoding(model, steps=2)
    images = model.decode(tokens, model.encode('a sign saying "hi"'))
    height, width = model.size
    assert images.shape == (2, height, width, 3) and images.dtype == torch.float32
    pipeline = GlmImagePipeline.from_pretrained(str(folder))
    rows, cols = model.grids[-1]
    for row in range(2):
        large = tokens[row, -rows * cols:].view(1, 1, rows, cols).float()
        prior = torch.nn.functional.interpolate(large, scale_factor=2, mode="nearest").long().view(1, -1)
        out = pipeline(prompt='a sign saying "hi"', prior_token_ids=prior, height=height, width=width,
                       num_inference_steps=2, generator=torch.Generator().manual_seed(0), output_type="pt")
        torch.testing.assert_close(images[row], out.images[0].permute(1, 2, 0).float(), atol=1e-5, rtol=0)
    assert not torch.equal(images[0], images[1])


@needs_glm_image
@pytest.mark.parametrize("width, height", [(44, 40), (150, 150)])
def test_image_to_image_decode_resizes_the_source_as_the_pipeline(model: glm_image.GlmImageModel, folder: Path,
                                                                  width: int, height: int) -> None:
    """The pipeline resizes the source itself (lanczos, to its size floored to 16 px): where that is the size the
    codes describe (44 x 40: 32 x 32, one code of the tiny processor), the decoded pixels are the pipeline's given
    the source as it is.  Where it is not (150 x 150: 144 x 144 against 2 x 2 codes, 64 x 64 px), the pipeline
    itself fails, and the decoded pixels are the pipeline's given the source resized to the codes' size."""
    from diffusers import GlmImagePipeline
    from PIL import Image

    pixels = torch.rand(height, width, 3, generator=torch.Generator().manual_seed(3))
    picture = Image.fromarray((pixels * 255).to(torch.uint8).numpy())
    cond = model.encode(PROMPT, image=picture)
    tokens = generate(model, cond, SamplerConfig(window=8, seed=0)).tokens
    set_decoding(model, steps=2)
    images = model.decode(tokens, cond)
    assert images.shape == (1, *model.size, 3)
    (rows, cols), (source_rows, source_cols) = model.grid, cond.source.grid
    up = lambda codes, r, c: torch.nn.functional.interpolate(codes.view(1, 1, r, c).float(), scale_factor=2,
                                                             mode="nearest").long().view(1, -1)
    pipeline = GlmImagePipeline.from_pretrained(str(folder))
    call = dict(prompt=PROMPT, image=[picture], prior_token_ids=up(tokens[0], rows, cols), height=model.size[0],
                width=model.size[1], prior_token_image_ids=[up(torch.tensor(cond.source.codes), source_rows,
                                                                source_cols)[0]],
                source_image_grid_thw=[torch.tensor([[1, 2 * source_rows, 2 * source_cols]])],
                num_inference_steps=2, generator=torch.Generator().manual_seed(0), output_type="pt")
    fits = (height // 16 * 16, width // 16 * 16) == (source_rows * 32, source_cols * 32)
    assert fits == (width == 44)
    if not fits:
        with pytest.raises(Exception):  # its own resize leaves the latents and the codes apart
            pipeline(**call)
        # what decode hands it instead: the source at the codes' size
        call.update(image=[picture.resize((source_cols * 32, source_rows * 32))],
                    generator=torch.Generator().manual_seed(0))
    with one_thread():  # as `decode` runs (models/pixels.py): float sums follow the thread count
        expected = pipeline(**call).images[0].permute(1, 2, 0).float()
    torch.testing.assert_close(images[0], expected, atol=1e-6, rtol=0)
    generate(model, model.encode(PROMPT), SamplerConfig(window=8, seed=0))  # back to text-to-image


@needs_glm_image
def test_missing_diffusers_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def without_diffusers(name: str, *args, **kwargs):
        if name.split(".")[0] == "diffusers":
            raise ImportError("No module named 'diffusers'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_diffusers)
    with pytest.raises(ModelLoadError, match=r"diffusers 0\.37 or newer.*'glm' extra"):
        glm_image.require_diffusers()


def published_layout(root: Path) -> Path:
    """The published folder's files without weights: enough for the checks that come before reading them."""
    folder = root / "GLM-Image"
    for name in (glm_image.AR_FOLDER, glm_image.PROCESSOR_FOLDER, *glm_image.DECODER_FOLDERS):
        (folder / name).mkdir(parents=True)
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "GlmImagePipeline"}))
    (folder / glm_image.AR_FOLDER / "config.json").write_text(json.dumps({"model_type": "glm_image"}))
    return folder


@pytest.mark.skipif(HAS_GLM_IMAGE, reason="transformers here has GLM-Image (the oldest tier runs this)")
def test_old_transformers_is_told_the_version_it_needs(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=rf"needs transformers 5\.0 or newer.*{transformers.__version__}"):
        load_model(published_layout(tmp_path), device="cpu", dtype="float32")


def test_missing_parts_are_named(tmp_path: Path) -> None:
    folder = published_layout(tmp_path)
    shutil.rmtree(folder / "vae")
    with pytest.raises(ModelLoadError, match="lacks the GLM-Image subfolder.*vae.*zai-org/GLM-Image"):
        load_model(folder, device="cpu", dtype="float32")
    (folder / "vae").mkdir()
    (folder / glm_image.AR_FOLDER / "config.json").write_text(json.dumps({"model_type": "glm4v"}))
    with pytest.raises(ModelLoadError, match="model_type 'glm4v', not 'glm_image'"):
        load_model(folder, device="cpu", dtype="float32")


@needs_glm_image
def test_progress_preview_is_a_token_map_of_the_grid_being_sampled(model: glm_image.GlmImageModel) -> None:
    (preview_rows, preview_cols), (rows, cols) = model.grids
    codes = torch.arange(model.num_tokens).remainder(model.vocab_size).unsqueeze(0)
    early = model.preview_frame(codes[:, :5])
    side = glm_image.PREVIEW_PIXELS // preview_rows
    assert early.shape == (preview_rows * side, preview_cols * side, 3)
    assert (early[:side, 5 * side:] == glm_image.PENDING_GRAY).all()  # cells not sampled yet
    assert not (early[:side, :5 * side] == glm_image.PENDING_GRAY).all()
    late = model.preview_frame(codes[:, :preview_rows * preview_cols + cols])  # the first large row
    side = glm_image.PREVIEW_PIXELS // rows
    assert late.shape == (rows * side, cols * side, 3)
    assert (late[side:] == glm_image.PENDING_GRAY).all() and not (late[:side] == glm_image.PENDING_GRAY).all()


@needs_glm_image
@pytest.mark.parametrize("precision", ["int8", pytest.param("nf4", marks=needs_bnb)])
def test_quantized_rows_see_their_own_prefix_only_and_faithful_keeps_its_tokens(folder: Path,
                                                                                precision: str) -> None:
    """The decoder layers at `precision`: a window's first logits ignore later drafts and the other sample,
    and faithful window 8 gives the window-1 tokens."""
    from glm_image_fixture import HEIGHT, WIDTH

    quantized = load_model(folder, device="cpu", dtype="float32", quantize=precision)
    quantized.set_image_size(WIDTH, HEIGHT)
    cond = quantized.encode(PROMPT, NEGATIVE)
    drafts = torch.randint(0, quantized.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    changed = drafts.clone()
    changed[0, 3:], changed[1] = drafts[0, 3:].flip(0), drafts[1].roll(1)

    def window(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        session = quantized.start(cond, 2)
        session.prefill()
        return session.forward(tokens)

    for before, after in zip(window(drafts), window(changed)):
        assert torch.equal(before[0, :3], after[0, :3])
    tokens = [generate(quantized, cond, SamplerConfig(coupler="faithful", window=w, seed=3)).tokens for w in (1, 8)]
    assert torch.equal(tokens[0], tokens[1])


@needs_glm_image
def test_memory_estimates_count_each_stage(model: glm_image.GlmImageModel, folder: Path) -> None:
    estimate = glm_image.memory_estimate(folder)
    layers = model.module.model.language_model.layers
    linear = sum(m.weight.numel() for m in layers.modules() if isinstance(m, torch.nn.Linear))
    assert estimate.block_weights == linear
    decoder = model.decoder()
    parts = sum(p.numel() for part in (decoder.transformer, decoder.vae, decoder.text_encoder)
                for p in part.parameters())
    ar_other = sum(p.numel() for p in model.module.parameters()) - linear
    heads = model.module.config.text_config.vision_vocab_size - model.vocab_size  # rows sliced off at load
    assert estimate.other_weights == ar_other + heads * model.module.config.text_config.hidden_size
    assert glm_image.decoder_weights(folder) == parts
    assert estimate.kv_channels == 2 * len(layers) * model.module.config.text_config.num_key_value_heads * 32


@needs_glm_image
def test_broken_ar_weights_and_processor_are_refused_clearly(folder: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A truncated or pickled AR checkpoint and a processor without its tokenizer: one ModelLoadError each,
    naming the file; the pickle is never opened."""
    broken = Path(shutil.copytree(folder, tmp_path / "GLM-Image"))
    ar = broken / glm_image.AR_FOLDER
    weights = ar / "model.safetensors"
    with open(weights, "r+b") as handle:
        handle.truncate(weights.stat().st_size // 2)
    with pytest.raises(ModelLoadError, match="model.safetensors.*truncated"):
        load_model(broken, device="cpu", dtype="float32")
    weights.unlink()
    torch.save({"w": torch.zeros(2)}, ar / "pytorch_model.bin")
    monkeypatch.setattr(torch, "load", lambda *args, **kwargs: pytest.fail("the pickle was opened"))
    with pytest.raises(ModelLoadError, match="pickled weights"):
        load_model(broken, device="cpu", dtype="float32")
    monkeypatch.undo()
    shutil.copy(folder / glm_image.AR_FOLDER / "model.safetensors", weights)
    (broken / glm_image.PROCESSOR_FOLDER / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="processor is not a readable GLM-Image processor"):
        load_model(broken, device="cpu", dtype="float32")
