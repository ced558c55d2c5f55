"""The Janus-Pro adapter on a tiny random checkpoint written in the real format."""

from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path

import pytest
import torch
from janus_fixture import BOI, BOS, CFG_PAD, IMAGE_CODES, IMAGE_SIZE
from pace import (assert_each_row_matches, assert_own_pace_gives_ar_tokens, staggered_logits, tree_logits,
                  window_and_stepwise_logits)

from scd_core import COUPLERS, ModelLoadError, SamplerConfig, TokenModel, generate, load_model
from scd_core.models.families import janus
from scd_core.models.weights.tokenizer_files import TextTokenizer

CPU = torch.device("cpu")
PROMPT = "a red cube on a wooden table"


@pytest.fixture(scope="module")
def model32(tiny_janus_dir: Path) -> janus.JanusModel:
    return load_model(tiny_janus_dir, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def model64(tiny_janus_dir: Path) -> janus.JanusModel:
    return load_model(tiny_janus_dir, device="cpu", dtype=torch.float64)


def test_loaded_model_describes_itself(model32: janus.JanusModel, tiny_janus_dir: Path) -> None:
    assert isinstance(model32, TokenModel)
    assert model32.family == "janus"
    assert (model32.grid, model32.num_tokens, model32.vocab_size) == ((4, 4), 16, IMAGE_CODES)
    assert model32.default_cfg_scale == 5.0
    assert isinstance(model32.module, torch.nn.Module)
    assert model32.device == CPU
    assert all(p.dtype == torch.float32 for p in model32.module.parameters())


def test_prompt_layout_follows_transformers(model32: janus.JanusModel, tiny_janus_dir: Path) -> None:
    tokenizer = TextTokenizer(tiny_janus_dir)
    bos, pad, boi = (tokenizer.token_id(t) for t in (BOS, CFG_PAD, BOI))
    prompt = model32.encode(PROMPT)
    assert list(prompt.cond) == [bos, *tokenizer.encode(f"<|User|>: {PROMPT}\n\n<|Assistant|>:"), boi]
    # uncond rows: every token except BOS and begin-of-image replaced by Janus's pad
    assert list(prompt.uncond) == [bos] + [pad] * (len(prompt.cond) - 2) + [boi]
    negative = model32.encode(PROMPT, negative_prompt="blurry")
    assert list(negative.uncond) == [bos, *tokenizer.encode("<|User|>: blurry\n\n<|Assistant|>:"), boi]
    assert model32.encode(PROMPT, negative_prompt="  ") == prompt


def test_default_sampling_law_is_the_authors(model32: janus.JanusModel) -> None:
    """Left at the model's values, Janus-Pro samples DeepSeek's law (generation_inference.py, the README's
    Janus-Pro example, demo/app_januspro.py: cfg_weight 5, temperature 1, softmax over every image code, no
    top-k or top-p): logits = uncond + 5 (cond - uncond), then transformers' temperature warper at 1."""
    from sampling_law import assert_same_law, default_probs, guided, processed_probs, spread_logits, warpers

    cond, uncond = spread_logits(model32.vocab_size, seed=0), spread_logits(model32.vocab_size, seed=1)
    reference = processed_probs(warpers(1.0, None, 1.0), guided(cond, uncond, 5.0))
    assert_same_law(default_probs(model32, cond, uncond), reference)


@pytest.mark.parametrize("coupler", COUPLERS)
def test_generate_and_decode_with_every_coupler(model32: janus.JanusModel, coupler: str) -> None:
    config = SamplerConfig(coupler=coupler, window=4, seed=3)
    result = generate(model32, model32.encode(PROMPT), config, batch_size=2)
    assert result.tokens.shape == (2, 16) and result.tokens.dtype == torch.long
    assert 0 <= int(result.tokens.min()) and int(result.tokens.max()) < IMAGE_CODES
    # per-row pace: `committed` counts what the slowest row committed in each call
    assert len(result.committed) == result.nfe and sum(result.committed) == 16 and 4 <= result.nfe <= 16
    images = model32.decode(result.tokens)
    assert images.shape == (2, IMAGE_SIZE, IMAGE_SIZE, 3)
    assert images.dtype == torch.float32 and images.device == CPU
    assert 0 <= float(images.min()) and float(images.max()) <= 1 and float(images.std()) > 0


def window_and_stepwise(model: janus.JanusModel, negative: str | None = None) -> tuple:
    """Logits of an 8-token window, then of the same tokens fed one at a time after a rewind."""
    tokens = torch.randint(0, IMAGE_CODES, (2, 8), generator=torch.Generator().manual_seed(0))
    return window_and_stepwise_logits(model, model.encode(PROMPT, negative), tokens)


def test_window_forward_equals_token_by_token(model32: janus.JanusModel, model64: janus.JanusModel) -> None:
    window, stepwise = window_and_stepwise(model32)
    for branch in (0, 1):
        assert window[branch].shape == (2, 8, IMAGE_CODES)
        torch.testing.assert_close(window[branch], stepwise[branch], atol=1e-4, rtol=1e-4)
    window, stepwise = window_and_stepwise(model64, negative="blurry, low quality")
    for branch in (0, 1):
        assert window[branch].dtype == torch.float64
        assert float((window[branch] - stepwise[branch]).abs().max()) <= 1e-12


def test_faithful_window_gives_the_autoregressive_tokens(model64: janus.JanusModel) -> None:
    prompt = model64.encode(PROMPT)
    for seed in (0, 1):
        ar = generate(model64, prompt, SamplerConfig(coupler="faithful", window=1, seed=seed), batch_size=2)
        jacobi = generate(model64, prompt, SamplerConfig(coupler="faithful", window=8, seed=seed), batch_size=2)
        assert ar.nfe == 16  # window 8 may need as many calls on a random model; its tokens must not change
        assert torch.equal(ar.tokens, jacobi.tokens)


@pytest.mark.parametrize("negative", [None, "blurry"])
def test_rows_at_different_positions_give_each_rows_sequential_logits(model64: janus.JanusModel,
                                                                       negative: str | None) -> None:
    """Rows at different lengths in one call, over slots they rejected; "blurry" left-pads the uncond rows."""
    tokens = torch.randint(0, IMAGE_CODES, (3, 16), generator=torch.Generator().manual_seed(2))
    calls = [(tokens[:, :6], [5, 2, 0]), (tokens[:, 6:10], [2, 5, 3]), (tokens[:, 10:13], [0, 0, 1], [2, 0]),
             (tokens[[2, 0], 13:16], [0, 0])]  # row 1 finished: the session drops it
    assert_each_row_matches(staggered_logits(model64, model64.encode(PROMPT, negative), calls), 1e-12)


def test_tree_of_chains_gives_each_chains_sequential_logits(model64: janus.JanusModel) -> None:
    """Candidates at the first draft: every chain of a tree call, and the call after keeping one chain per row."""
    ids = torch.randint(0, IMAGE_CODES, (2, model64.num_tokens + 5), generator=torch.Generator().manual_seed(4))
    assert_each_row_matches(tree_logits(model64, model64.encode(PROMPT), ids), 1e-10)


def test_cache_is_allocated_once_and_rewound_in_place(model32: janus.JanusModel) -> None:
    session = model32.start(model32.encode(PROMPT), 2)
    session.prefill()
    rows = session.cache
    prefix = rows.prefix
    keys = rows.keys[0]
    assert keys.shape[0] == 4 and keys.shape[2] == prefix + 16
    session.forward(torch.zeros(2, 5, dtype=torch.long))
    session.rewind(torch.tensor([4, 1]))
    session.forward(torch.ones(2, 5, dtype=torch.long))
    assert rows.keys[0] is keys and rows.lengths.tolist() == [prefix + 6, prefix + 9] * 2
    with pytest.raises(ValueError, match="rewind"):
        session.rewind(torch.tensor([7, 0]))  # row 0 holds 6 image tokens


def test_faithful_rows_at_their_own_pace_give_the_window_1_and_batch_1_tokens(model64: janus.JanusModel) -> None:
    assert_own_pace_gives_ar_tokens(model64, model64.encode(PROMPT), seed=0)


def test_cfg_branches_differ_and_scale_matters(model32: janus.JanusModel) -> None:
    cond, uncond = model32.start(model32.encode(PROMPT), batch_size=1).prefill()
    assert float((cond - uncond).abs().max()) > 0.1
    prompt = model32.encode(PROMPT)
    tokens = {scale: generate(model32, prompt, SamplerConfig(coupler="faithful", window=1, cfg_scale=scale),
                              batch_size=4).tokens for scale in (1.0, 5.0)}
    assert not torch.equal(tokens[1.0], tokens[5.0])


def test_negative_prompt_of_other_length_is_masked_not_attended(model64: janus.JanusModel) -> None:
    """The shorter row group is left-padded; its logits must equal an unpadded run of it alone."""
    tokens = torch.randint(0, IMAGE_CODES, (1, 5), generator=torch.Generator().manual_seed(1))
    encoded = model64.encode(PROMPT, negative_prompt="blurry")
    assert len(encoded.uncond) < len(encoded.cond)
    mixed = model64.start(encoded, batch_size=1)
    alone = model64.start(janus.JanusPrompt(cond=encoded.uncond, uncond=encoded.uncond), batch_size=1)
    for step in (lambda s: s.prefill(), lambda s: s.forward(tokens)):
        padded_uncond, reference = step(mixed)[1], step(alone)[1]
        assert float((padded_uncond - reference).abs().max()) <= 1e-12


def test_low_precision_dtypes_return_float32_logits(tiny_janus_dir: Path) -> None:
    model = load_model(tiny_janus_dir, device="cpu", dtype="bfloat16")
    assert next(model.module.parameters()).dtype == torch.bfloat16
    result = generate(model, model.encode(PROMPT), SamplerConfig(window=8), batch_size=1)
    assert result.tokens.shape == (1, 16)
    cond, uncond = model.start(model.encode(PROMPT), 1).prefill()
    assert cond.dtype == uncond.dtype == torch.float32
    assert model.decode(result.tokens).dtype == torch.float32


def test_bad_arguments_raise_value_errors(model32: janus.JanusModel) -> None:
    with pytest.raises(ValueError, match="prompt"):
        model32.encode(42)
    with pytest.raises(ValueError, match="batch_size"):
        model32.start(model32.encode(PROMPT), 0)
    with pytest.raises(ValueError, match=r"cond must come from JanusModel\.encode\(\), got str"):
        model32.start(PROMPT, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\(batch, 16\)"):
        model32.decode(torch.zeros(1, 15, dtype=torch.long))
    with pytest.raises(ValueError, match="0..127"):
        model32.decode(torch.full((1, 16), IMAGE_CODES))
    session = model32.start(model32.encode(PROMPT), 1)
    session.prefill()
    session.forward(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="rewind"):
        session.rewind(4)


# ---- folders that must be refused with a clear ModelLoadError ----

def copy_of(tiny_janus_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_janus_dir, tmp_path / "model"))


def live_janus_modules() -> int:
    from transformers import JanusForConditionalGeneration

    gc.collect()
    return sum(type(obj) is JanusForConditionalGeneration for obj in gc.get_objects())


def test_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no config.json"):
        janus.load(tmp_path, CPU, torch.float32)
    with pytest.raises(ModelLoadError, match="not a model folder"):
        load_model(tmp_path)


def test_wrong_model_type(tiny_janus_dir: Path, tmp_path: Path) -> None:
    folder = copy_of(tiny_janus_dir, tmp_path)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert not janus.detect(folder)
    with pytest.raises(ModelLoadError, match="model_type 'llama'"):
        janus.load(folder, CPU, torch.float32)


def test_original_deepseek_layout_points_to_hf_format(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "multi_modality", "language_config": {}}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not opened")
    assert janus.detect(tmp_path)
    with pytest.raises(ModelLoadError, match="deepseek-community/Janus-Pro-1B"):
        load_model(tmp_path, device="cpu")








def test_mismatched_weights_leave_nothing_loaded(tiny_janus_dir: Path, tmp_path: Path) -> None:
    folder = copy_of(tiny_janus_dir, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] = 3  # weights hold 2 layers
    (folder / "config.json").write_text(json.dumps(config))
    before = live_janus_modules()
    with pytest.raises(ModelLoadError, match="do not match"):
        load_model(folder, device="cpu")
    assert live_janus_modules() == before


# ---- benchmarks on the same checkpoint ----

def test_model_benchmark_rows(tiny_janus_dir: Path) -> None:
    from scd_core.bench.tables import markdown
    from scd_core.bench.shapes import model_benchmark

    rows = model_benchmark(str(tiny_janus_dir), couplers=("maximal",), windows=(4,), seeds=(0,), device="cpu")
    assert [(row["method"], row["window"]) for row in rows] == [("AR", 1), ("SCD-maximal", 4)]
    assert rows[0]["nfe"] == 16 and rows[0]["tokens_per_call"] == 1.0
    assert 4 <= rows[1]["nfe"] <= 16
    assert all(row["decode_s"] > 0 and row["peak_mem_mb"] > 0 for row in rows)
    assert "SCD-maximal" in markdown(rows, list(rows[0]))


def test_shape_benchmark_one_layer() -> None:
    from scd_core.bench.shapes import shape_benchmark

    rows = shape_benchmark("1B", windows=(2, 1), device="cpu", layers=1, prefix=8, repeats=1)
    assert [row["window"] for row in rows] == [1, 2]
    assert rows[0]["ratio"] == 1.0 and rows[1]["ratio"] > 0
    assert rows[0]["layers"] == 1 and rows[0]["full_layers"] == 24
    with pytest.raises(ValueError, match="size"):
        shape_benchmark("3B")
