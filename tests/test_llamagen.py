"""LlamaGen adapter on tiny checkpoints written in the original on-disk formats."""

from __future__ import annotations

import argparse
import json
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from pace import assert_each_row_matches, assert_own_pace_gives_ar_tokens, staggered_logits, tree_logits
from llamagen_fixture import (IMAGE_SIZE, TINY_GPT, original_gpt_keys, write_original_c2i, write_safetensors_c2i,
                              write_t2i, write_training_c2i)
from scd_core import ModelLoadError, SamplerConfig, generate, load_model
from scd_core.models.text.captions import clean_caption
from scd_core.models.weights.checkpoints import read_weights
from scd_core.models.families.llamagen import Caption, ClassLabel, GPTConfig, detect, rope_table_2d


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("llamagen")
    return {"pt": write_original_c2i(root / "original"), "safetensors": write_safetensors_c2i(root / "st"),
            "t2i": write_t2i(root / "t2i", with_t5=True)}


def _prompt(model) -> str:
    return "a red cat on the mat" if model.config.task == "t2i" else "3"


def _window_and_sequential(model, tokens: torch.Tensor) -> tuple[tuple, tuple]:
    cond = model.encode(_prompt(model))
    window = model.start(cond, tokens.shape[0])
    window.prefill()
    at_once = window.forward(tokens)
    single = model.start(cond, tokens.shape[0])
    single.prefill()
    steps = [single.forward(tokens[:, i:i + 1]) for i in range(tokens.shape[1])]
    return at_once, tuple(torch.cat([s[b] for s in steps], dim=1) for b in range(2))


@pytest.mark.parametrize("kind", ["pt", "safetensors", "t2i"])
def test_window_logits_equal_sequential(folders, kind):
    tokens = torch.randint(0, TINY_GPT["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(0))
    at_once, one_by_one = _window_and_sequential(load_model(folders[kind], "cpu", torch.float64), tokens)
    for a, b in zip(at_once, one_by_one):
        assert a.shape == (2, 7, TINY_GPT["vocab_size"])
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    at_once, one_by_one = _window_and_sequential(load_model(folders[kind], "cpu", torch.float32), tokens)
    for a, b in zip(at_once, one_by_one):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["pt", "t2i"])
def test_rewind_then_refeed_matches_fresh_session(folders, kind):
    model = load_model(folders[kind], "cpu", torch.float64)
    cond = model.encode(_prompt(model))
    first, second = torch.tensor([[5, 6, 7, 8, 9]]), torch.tensor([[5, 6, 1, 2, 3]])
    session = model.start(cond, 1)
    session.prefill()
    session.forward(first)
    session.rewind(3)
    rewound = session.forward(second[:, 2:])
    fresh = model.start(cond, 1)
    fresh.prefill()
    expected = fresh.forward(second)
    for a, b in zip(rewound, expected):
        torch.testing.assert_close(a, b[:, 2:], rtol=0, atol=1e-10)
    with pytest.raises(ValueError):
        session.rewind(99)


@pytest.mark.parametrize("kind", ["pt", "t2i"])
def test_cond_and_uncond_branches_differ(folders, kind):
    model = load_model(folders[kind], "cpu", torch.float32)
    cond, uncond = model.start(model.encode(_prompt(model)), 1).prefill()
    assert cond.shape == uncond.shape == (1, 1, TINY_GPT["vocab_size"])
    assert (cond - uncond).abs().max() > 1e-2


def test_faithful_window_reproduces_autoregressive_tokens(folders):
    model = load_model(folders["pt"], "cpu", torch.float64)
    cond = model.encode("7")
    ar = generate(model, cond, SamplerConfig(coupler="faithful", window=1, seed=11), batch_size=2)
    assert ar.nfe == model.num_tokens
    for window in (4, 16):
        fast = generate(model, cond, SamplerConfig(coupler="faithful", window=window, seed=11), batch_size=2)
        assert torch.equal(fast.tokens, ar.tokens)
        assert fast.nfe <= ar.nfe
    other_seed = generate(model, cond, SamplerConfig(coupler="faithful", window=1, seed=12), batch_size=2)
    assert not torch.equal(other_seed.tokens, ar.tokens)


@pytest.mark.parametrize("kind", ["pt", "t2i"])
def test_rows_at_different_positions_give_each_rows_sequential_logits(folders, kind):
    model = load_model(folders[kind], "cpu", torch.float64)
    tokens = torch.randint(0, TINY_GPT["vocab_size"], (3, 16), generator=torch.Generator().manual_seed(2))
    # rows hold 1 / 4 / 6 image tokens after the first call, then 3 / 3 / 7 after the second
    calls = [(tokens[:, :6], [5, 2, 0]), (tokens[:, 6:10], [2, 5, 3]), (tokens[:, 10:13], [0, 0, 1], [2, 0]),
             (tokens[[2, 0], 13:16], [0, 0])]  # row 1 finished: the session drops it
    assert_each_row_matches(staggered_logits(model, model.encode(_prompt(model)), calls), 1e-10)


@pytest.mark.parametrize("kind", ["pt", "t2i"])
def test_tree_of_chains_gives_each_chains_sequential_logits(folders, kind):
    """Candidates at the first draft: every chain of a tree call, and the call after keeping one chain per row."""
    model = load_model(folders[kind], "cpu", torch.float64)
    ids = torch.randint(0, TINY_GPT["vocab_size"], (2, model.num_tokens + 5),
                        generator=torch.Generator().manual_seed(4))
    assert_each_row_matches(tree_logits(model, model.encode(_prompt(model)), ids), 1e-10)


def test_cache_is_allocated_once_and_rewound_in_place(folders):
    model = load_model(folders["t2i"], "cpu", torch.float32)
    session = model.start(model.encode(_prompt(model)), 2)
    session.prefill()
    keys = session.cache.keys[0]
    assert keys.shape == (4, TINY_GPT["n_kv_head"], 8 + 16, TINY_GPT["dim"] // TINY_GPT["n_head"])
    session.forward(torch.zeros(2, 5, dtype=torch.long))
    session.rewind(torch.tensor([4, 1]))
    session.forward(torch.ones(2, 5, dtype=torch.long))
    assert session.cache.keys[0] is keys and session.cache.lengths.tolist() == [8 + 6, 8 + 9] * 2
    with pytest.raises(ValueError, match="rewind"):
        session.rewind(torch.tensor([7, 0]))  # row 0 holds 6 image tokens
    with pytest.raises(ValueError, match="pass the 16 cached positions"):
        session.forward(torch.zeros(2, 11, dtype=torch.long))  # 6 + 11 > 16 for the slowest row


def test_pace_benchmark_rows(folders):
    from scd_core.bench.pace import pace_rows

    model = load_model(folders["pt"], "cpu", torch.float32)
    rows = pace_rows(model, model.encode("3"), (1, 3), 4, (0, 1))
    assert [(row["batch"], row["pace"]) for row in rows] == [(b, pace) for b in (1, 3)
                                                             for pace in ("shared", "per-row", "regrouped")]
    assert rows[0]["calls"] == rows[1]["calls"] == rows[2]["calls"] == rows[1]["row_calls"]
    assert rows[1]["calls_ratio"] == 1.0
    shared, per_row, regrouped = rows[3:]
    assert shared["row_calls"] == shared["calls"]  # at a shared pace every row ends with the slowest
    assert per_row["row_calls"] < per_row["calls"] <= model.num_tokens
    assert regrouped["row_calls"] < regrouped["calls"] <= model.num_tokens


def test_faithful_rows_at_their_own_pace_give_the_window_1_and_batch_1_tokens(folders):
    model = load_model(folders["pt"], "cpu", torch.float64)
    assert_own_pace_gives_ar_tokens(model, model.encode("7"), seed=11, windows=(4, 8))


def test_generate_and_decode(folders):
    model = load_model(folders["safetensors"], "cpu", torch.float32)
    assert (model.family, model.grid, model.num_tokens) == ("llamagen", (4, 4), 16)
    assert (model.default_cfg_scale, model.default_top_k) == (2.5, 20)
    result = generate(model, model.encode("2"), SamplerConfig(coupler="maximal", window=8), batch_size=3)
    # per-row pace: `committed` counts what the slowest row committed in each call
    assert result.tokens.shape == (3, 16) and len(result.committed) == result.nfe and sum(result.committed) == 16
    images = model.decode(result.tokens)
    assert images.shape == (3, IMAGE_SIZE, IMAGE_SIZE, 3) and images.dtype == torch.float32
    assert images.device.type == "cpu" and 0 <= images.min() and images.max() <= 1 and images.std() > 0
    with pytest.raises(ValueError):
        model.decode(result.tokens[:, :5])


def test_original_names_and_defaults(folders):
    state = read_weights(folders["pt"] / "c2i_B_16.pt")
    assert set(state) == original_gpt_keys(TINY_GPT["n_layer"], "c2i")
    t2i_state = read_weights(folders["t2i"] / "t2i_B_stage1_16.pt")
    assert set(t2i_state) == original_gpt_keys(TINY_GPT["n_layer"], "t2i")
    model = load_model(folders["pt"], "cpu", torch.float32)
    assert (model.default_cfg_scale, model.config.n_head, model.config.num_classes) == (4.0, 12, 10)
    assert set(model.module.state_dict()) >= {f"gpt.{k}" for k in state}
    t2i = load_model(folders["t2i"], "cpu", torch.float32)
    assert (t2i.default_cfg_scale, t2i.config.cls_token_num, t2i.config.caption_dim) == (7.5, 8, 16)
    assert "t5" in dict(t2i.module.named_children())


# LlamaGen's autoregressive/sample/sample_c2i.py and sample_t2i.py argparse defaults: (cfg, top-k, temperature, top-p)
AUTHORS = {"c2i": (4.0, 2000, 1.0, 1.0), "t2i": (7.5, 1000, 1.0, 1.0)}


def test_default_sampling_law_is_the_authors(folders):
    """Left at the model's values, LlamaGen samples its authors' law: uncond + cfg (cond - uncond), then
    temperature, top-k and top-p (their filtering, taken from transformers: here transformers' own warpers; a
    top-k at or above the tiny vocabulary keeps every token, as their clamp to the vocabulary does)."""
    from sampling_law import (assert_same_law, default_probs, guided, processed_probs, sampling_settings,
                              spread_logits, warpers)

    for name in ("pt", "t2i"):
        model = load_model(folders[name], "cpu", torch.float32)
        cfg, top_k, temperature, top_p = AUTHORS[model.config.task]
        # the tiny vocabulary is below the authors' top-k, so the law alone would not see a wrong one
        assert sampling_settings(model, SamplerConfig()).top_k == top_k
        cond, uncond = spread_logits(model.vocab_size, seed=0), spread_logits(model.vocab_size, seed=1)
        reference = warpers(temperature, min(top_k, model.vocab_size), top_p)
        assert_same_law(default_probs(model, cond, uncond), processed_probs(reference, guided(cond, uncond, cfg)))


def test_rope_table_matches_published_layout():
    table = rope_table_2d(GPTConfig(dim=32, n_layer=1, n_head=2, n_kv_head=2, ffn_hidden=8, vocab_size=4,
                                    grid_size=3, cls_token_num=2))
    assert table.shape == (2 + 9, 8, 2)
    assert table[:2].abs().max() == 0  # conditioning rows: cos = sin = 0 as in the original
    row, col = 1, 2  # image position 5 in the 3 x 3 grid
    freqs = 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8)
    angles = torch.cat([row * freqs, col * freqs])
    torch.testing.assert_close(table[2 + 5], torch.stack([angles.cos(), angles.sin()], -1))


def test_encode_class_prompts(folders):
    model = load_model(folders["pt"], "cpu", torch.float32)
    assert model.encode(" 7 ") == ClassLabel(7)
    for bad in ("seven", "10", "-1", "3.5"):
        with pytest.raises(ValueError):
            model.encode(bad)
    with pytest.raises(ValueError):
        model.encode("3", negative_prompt="4")
    t2i = load_model(folders["t2i"], "cpu", torch.float32)
    caption = t2i.encode("a blue dog")
    assert isinstance(caption, Caption) and caption.features.shape == (8, 16)
    assert caption.mask.tolist() == [False] * 5 + [True] * 3  # left padding, as LlamaGen samples
    assert caption.features[:5].abs().max() == 0
    with pytest.raises(ValueError):
        t2i.start(ClassLabel(1), 1)


def test_detect(folders, tmp_path):
    assert all(detect(folder) for folder in folders.values())
    (tmp_path / "notes.txt").write_text("hello")
    assert not detect(tmp_path)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


@dataclass
class _RunArguments:  # any class but argparse.Namespace: a module the loader would have to import and trust
    lr: float = 1e-4


def _assert_clean_refusal(err: ModelLoadError, file_name: str) -> None:
    message = str(err)
    assert file_name in message and ".safetensors" in message and "was refused" in message
    assert "\x1b" not in message and "\n" not in message and "weights_only" not in message


def test_pickled_code_is_refused_in_one_clean_sentence(tmp_path):
    folder = write_original_c2i(tmp_path / "m")
    with open(folder / "c2i_B_16.pt", "wb") as f:
        pickle.dump({"model": _Exploit()}, f)
    with pytest.raises(ModelLoadError) as legacy:
        load_model(folder, "cpu")
    _assert_clean_refusal(legacy.value, "c2i_B_16.pt")
    torch.save({"model": {"w": torch.ones(2)}, "hook": _Exploit()}, folder / "c2i_B_16.pt")
    with pytest.raises(ModelLoadError) as zipped:
        load_model(folder, "cpu")
    _assert_clean_refusal(zipped.value, "c2i_B_16.pt")
    assert "system" in str(zipped.value)  # names what was refused


def _prefill_logits(folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    model = load_model(folder, "cpu", torch.float64)
    return model.start(model.encode("3"), 1).prefill()


def test_training_checkpoint_with_optimizer_and_arguments_loads(tmp_path):
    expected = _prefill_logits(write_original_c2i(tmp_path / "plain"))
    folder = write_training_c2i(tmp_path / "training")
    raw = torch.load(folder / "c2i_B_16.pt", map_location="cpu", weights_only=False)  # our own file: trusted
    assert isinstance(raw["args"], argparse.Namespace) and raw["optimizer"]["state"]
    for got, want in zip(_prefill_logits(folder), expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_training_checkpoint_with_another_class_is_refused(tmp_path):
    folder = write_training_c2i(tmp_path / "m", args=_RunArguments())
    with pytest.raises(ModelLoadError) as refused:
        load_model(folder, "cpu")
    _assert_clean_refusal(refused.value, "c2i_B_16.pt")
    assert "_RunArguments" in str(refused.value)


def test_stored_rotary_table_is_ignored_other_extra_keys_are_named(tmp_path):
    expected = _prefill_logits(write_original_c2i(tmp_path / "plain"))
    rope = write_training_c2i(tmp_path / "rope", extra={"freqs_cis": torch.randn(17, 2, 2)})
    for got, want in zip(_prefill_logits(rope), expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    extra = write_training_c2i(tmp_path / "extra", extra={"freqs_cis": torch.randn(17, 2, 2),
                                                           "layers.0.attention.bias": torch.zeros(3)})
    with pytest.raises(ModelLoadError, match=r"c2i_B_16.pt .*unexpected layers.0.attention.bias$"):
        load_model(extra, "cpu")


@pytest.mark.parametrize("caption, cleaned", [
    ("A Red CAT on the Mat", "a red cat on the mat"),
    ("A photo of a cat https://example.com/cat.jpg by @CatLover", "a photo of a cat by"),
    ('<b>Sunset</b> over the sea &amp; sky <a href="http://x.com">link</a>', "sunset over the sea sky link"),
    ("\u201cQuoted\u201d   text \u2014 with dashes\u2026 and\n spaces ", '"quoted" text - with dashes and spaces'),
    ("this-is-my-cute-cat", "this is my cute cat"),
    ('  "***A Dog*** [in] {the} park", ', "a dog in the park"),
    ("www.shop.com/item?id=3 Blue Vase, #1", "blue vase, 1"),
])
def test_captions_are_cleaned_as_in_training(caption, cleaned):
    assert clean_caption(caption) == cleaned
    assert clean_caption(cleaned) == cleaned  # a clean caption stays as it is


def test_t2i_prompt_is_cleaned_before_the_text_encoder(folders):
    t2i = load_model(folders["t2i"], "cpu", torch.float32)
    shouted, plain = t2i.encode("A RED Cat on the <i>MAT</i>"), t2i.encode("a red cat on the mat")
    assert torch.equal(shouted.mask, plain.mask) and torch.equal(shouted.features, plain.features)
    assert not torch.equal(t2i.encode("a blue dog").features, plain.features)


def test_truncated_file_is_refused(tmp_path):
    folder = write_safetensors_c2i(tmp_path / "m")
    data = (folder / "gpt.safetensors").read_bytes()
    (folder / "gpt.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(folder, "cpu")
    folder = write_original_c2i(tmp_path / "o")
    data = (folder / "vq_ds4_c2i.pt").read_bytes()
    (folder / "vq_ds4_c2i.pt").write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelLoadError, match="vq_ds4_c2i.pt"):
        load_model(folder, "cpu")


def test_missing_pieces_are_named(tmp_path):
    folder = write_original_c2i(tmp_path / "novq")
    (folder / "vq_ds4_c2i.pt").unlink()
    with pytest.raises(ModelLoadError, match="no VQ tokenizer"):
        load_model(folder, "cpu")
    folder = write_t2i(tmp_path / "not5", with_t5=False)
    with pytest.raises(ModelLoadError, match="FLAN-T5"):
        load_model(folder, "cpu")
    folder = write_safetensors_c2i(tmp_path / "swapped")
    (folder / "vq.safetensors").rename(folder / "other.safetensors")
    with pytest.raises(ModelLoadError, match="vq.safetensors"):
        load_model(folder, "cpu")


def _write_settings(folder: Path, **settings: object) -> Path:
    (folder / "llamagen.json").write_text(json.dumps({
        "model_type": "llamagen", "gpt_checkpoint": "gpt.safetensors", "vq_checkpoint": "vq.safetensors",
        "image_size": IMAGE_SIZE, **settings}))
    return folder


def test_null_settings_mean_the_defaults(tmp_path):
    folder = _write_settings(write_safetensors_c2i(tmp_path / "m"), n_head=None, preset="GPT-B",
                             vq={"norm_groups": None}, t5_folder=None, cfg_scale=None, top_k=None, family=None,
                             class_names=None)
    model = load_model(folder, "cpu", torch.float32)
    assert (model.family, model.config.n_head, model.default_cfg_scale, model.class_names) == ("llamagen", 12, 4.0,
                                                                                                None)
    with pytest.raises(ModelLoadError, match="lacks gpt_checkpoint"):
        load_model(_write_settings(folder, gpt_checkpoint=None), "cpu")


@pytest.mark.parametrize("n_head", [5, 96])
def test_heads_that_do_not_split_the_width_are_refused(tmp_path, n_head):
    folder = _write_settings(write_safetensors_c2i(tmp_path / "m"), n_head=n_head)
    with pytest.raises(ModelLoadError, match=f"do not split into {n_head} heads"):
        load_model(folder, "cpu")


def test_mismatched_weights_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = write_safetensors_c2i(tmp_path / "m")
    state = load_file(str(folder / "gpt.safetensors"))
    del state["layers.1.ffn_norm.weight"]
    save_file(state, str(folder / "gpt.safetensors"))
    with pytest.raises(ModelLoadError, match="missing layers.1.ffn_norm.weight$"):
        load_model(folder, "cpu")
