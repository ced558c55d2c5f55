"""Cosmos-1.0 autoregressive adapter on tiny folders in NVIDIA's layout (model.pt + TorchScript tokenizer)."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from pace import assert_each_row_matches, tree_logits
from cosmos_fixture import (CONTEXT_DIM, FRAME_SIZE, TINY, context_frames, write_cosmos, write_nvidia_config,
                            write_tokenizer)
from scd_core import ModelLoadError, SamplerConfig, generate, load_model
from scd_core.models.families.cosmos import (TOKENIZER_FOLDER, VideoContext, config_for, detect, official_keys,
                                             read_state_dict, rope_table_3d, sincos_table_3d, yarn_factors, BASE_12B,
                                             SIZES)

FRAME_TOKENS = TINY["video_latent_shape"][1] * TINY["video_latent_shape"][2]
NUM_TOKENS = TINY["generated_frames"] * FRAME_TOKENS


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cosmos")
    return {"4B": write_cosmos(root, "4B"), "12B": write_cosmos(root, "12B", nested=False, seed=1),
            "5B-Video2World": write_cosmos(root, "5B-Video2World", seed=2)}


def _context(model, frames: int = 9) -> VideoContext:
    prompt = "a red cat" if model.config.cross_attention else None
    return model.encode_video(context_frames(frames), prompt)


@pytest.mark.parametrize("size", ["4B", "12B", "5B-Video2World"])
def test_window_logits_equal_sequential(folders, size):
    tokens = torch.randint(0, TINY["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(0))
    for dtype, tolerance in ((torch.float64, 1e-10), (torch.float32, 1e-4)):
        model = load_model(folders[size], "cpu", dtype)
        cond = _context(model)
        window = model.start(cond, 2)
        window.prefill()
        cond_logits, uncond = window.forward(tokens)
        assert uncond is None and cond_logits.shape == (2, 9, TINY["vocab_size"])
        single = model.start(cond, 2)
        single.prefill()
        steps = torch.cat([single.forward(tokens[:, i:i + 1])[0] for i in range(9)], dim=1)
        torch.testing.assert_close(cond_logits, steps, rtol=tolerance, atol=tolerance)


def test_window_logits_equal_sequential_with_the_real_head_split(tmp_path):
    """head_dim 128 as published: 44 time / 42 height / 42 width channels, 12B YaRN on."""
    model = load_model(write_cosmos(tmp_path, "12B", dim=64, n_heads=2, n_kv_heads=1, head_dim=128), "cpu",
                       torch.float64)
    assert model.config.head_dim == 128 and model.config.yarn_scale == 2.0
    tokens = torch.randint(0, TINY["vocab_size"], (1, 9), generator=torch.Generator().manual_seed(1))
    cond = _context(model)
    window = model.start(cond, 1)
    window.prefill()
    single = model.start(cond, 1)
    single.prefill()
    steps = torch.cat([single.forward(tokens[:, i:i + 1])[0] for i in range(9)], dim=1)
    torch.testing.assert_close(window.forward(tokens)[0], steps, rtol=1e-10, atol=1e-10)


def test_rewind_then_refeed_matches_fresh_session(folders):
    model = load_model(folders["4B"], "cpu", torch.float64)
    cond = _context(model)
    first, second = torch.tensor([[5, 6, 7, 8, 9]]), torch.tensor([[5, 6, 1, 2, 3]])
    session = model.start(cond, 1)
    session.prefill()
    session.forward(first)
    session.rewind(3)
    rewound, _ = session.forward(second[:, 2:])
    fresh = model.start(cond, 1)
    fresh.prefill()
    expected, _ = fresh.forward(second)
    torch.testing.assert_close(rewound, expected[:, 2:], rtol=0, atol=1e-10)
    with pytest.raises(ValueError):
        session.rewind(99)


def test_context_conditions_the_logits(folders):
    model = load_model(folders["4B"], "cpu", torch.float32)
    one = model.start(_context(model, 1), 1).prefill()[0]
    nine = model.start(_context(model, 9), 1).prefill()[0]
    other = model.start(model.encode_video(context_frames(9, seed=5)), 1).prefill()[0]
    assert one.shape == nine.shape == (1, 1, TINY["vocab_size"])
    assert (nine - one).abs().max() > 1e-3 and (nine - other).abs().max() > 1e-3


def test_tree_of_chains_gives_each_chains_sequential_logits(folders):
    """Candidates at the first draft: every chain of a tree call, and the call after keeping one chain per row."""
    model = load_model(folders["4B"], "cpu", torch.float64)
    ids = torch.randint(0, model.vocab_size, (2, model.num_tokens + 5), generator=torch.Generator().manual_seed(4))
    assert_each_row_matches(tree_logits(model, _context(model), ids), 1e-10)


@pytest.mark.parametrize("draft_init", ["previous_frame", "above"])
def test_faithful_window_reproduces_autoregressive_tokens(folders, draft_init):
    model = load_model(folders["4B"], "cpu", torch.float64)
    cond = _context(model)
    ar = generate(model, cond, SamplerConfig(coupler="faithful", window=1, seed=11), batch_size=2)
    assert ar.nfe == model.num_tokens == NUM_TOKENS
    for window in (4, 8):
        fast = generate(model, cond, SamplerConfig(coupler="faithful", window=window, seed=11, draft_init=draft_init),
                        batch_size=2)
        assert torch.equal(fast.tokens, ar.tokens)
        assert fast.nfe <= ar.nfe
    other_seed = generate(model, cond, SamplerConfig(coupler="faithful", window=1, seed=12), batch_size=2)
    assert not torch.equal(other_seed.tokens, ar.tokens)


def test_defaults_and_layout(folders):
    model = load_model(folders["4B"], "cpu", torch.float32)
    assert (model.family, model.size, model.grid, model.num_tokens) == ("cosmos", "4B", (2, 2, 3), NUM_TOKENS)
    assert (model.default_cfg_scale, model.default_top_k, model.default_temperature) == (None, None, 1.0)
    assert (model.default_top_p, model.default_draft_init) == (0.8, "previous_frame")
    assert model.context_frame_counts == (1, 9)
    big = load_model(folders["12B"], "cpu", torch.float32)
    assert big.default_top_p == 0.9 and big.config.yarn_scale == 2.0
    session = model.start(_context(model), 1)
    assert torch.equal(session.prefix_tokens, _context(model).codes) and session.prefix_tokens.shape == (2 * FRAME_TOKENS,)


# NVIDIA's Cosmos-1.0 autoregressive README (github:NVIDIA/Cosmos before its code moved to
# nvidia-cosmos/cosmos-predict1, whose examples repeat 4B 0.8 and 5B-Video2World 0.7): the top-p of each model's
# commands, "tuned ... to achieve the best performance"; temperature 1, no top-k, no guidance for all
AUTHORS_TOP_P = {"4B": 0.8, "12B": 0.9, "5B-Video2World": 0.7, "13B-Video2World": 0.8}


def test_default_sampling_law_is_the_authors(folders, tmp_path):
    """Left at the model's values, each size samples NVIDIA's law: softmax at temperature 1, then top-p at its
    README's value, as transformers' own warpers compute it, for the same logits."""
    from sampling_law import assert_same_law, default_probs, processed_probs, spread_logits, warpers

    for size, folder in folders.items():
        model = load_model(folder, "cpu", torch.float32)
        logits = spread_logits(model.vocab_size)
        assert_same_law(default_probs(model, logits), processed_probs(warpers(1.0, None, AUTHORS_TOP_P[size]), logits))
    assert {size: config_for(tmp_path / f"Cosmos-1.0-Autoregressive-{size}").top_p for size in SIZES} == AUTHORS_TOP_P


def test_generate_and_decode(folders):
    model = load_model(folders["4B"], "cpu", torch.float32)
    cond = _context(model)
    result = generate(model, cond, SamplerConfig(coupler="maximal", window=8), batch_size=3)
    assert result.tokens.shape == (3, NUM_TOKENS) and result.nfe < NUM_TOKENS
    continuation = model.decode(result.tokens)  # 2 generated latent frames -> 1 + 8 frames per row
    assert continuation.shape == (3 * 9, *FRAME_SIZE, 3) and continuation.dtype == torch.float32
    clip = model.decode(result.tokens, cond)  # context (2 latent frames) in front -> 1 + 3 * 8 frames per row
    assert clip.shape == (3 * 25, *FRAME_SIZE, 3)
    assert 0 <= clip.min() and clip.max() <= 1 and clip.std() > 0
    # the context comes back as the tokenizer reconstructs it: the first frame of each row
    torch.testing.assert_close(clip[0], clip[25])
    assert (clip[0] - context_frames(9)[0]).abs().mean() < 0.2
    with pytest.raises(ValueError, match="shape"):
        model.decode(result.tokens[:, :5])


def test_a_continuation_fills_every_free_latent_frame_unless_asked_for_fewer(folders):
    """As NVIDIA's pipeline: after 1 context frame, every latent frame the positions leave (the tiny model: 3 of
    4); after 9, 2.  new_frames asks for fewer; each context keeps its length whatever was encoded last."""
    model = load_model(folders["4B"], "cpu", torch.float32)
    config = SamplerConfig(coupler="maximal", window=8)
    one, nine = model.encode_video(context_frames(1)), model.encode_video(context_frames(9))
    short = model.encode_video(context_frames(1), new_frames=16)
    for cond, latent_frames in ((one, 3), (nine, 2), (short, 2)):
        tokens = generate(model, cond, config, batch_size=1).tokens
        assert tokens.shape == (1, latent_frames * FRAME_TOKENS) and model.grid == (latent_frames, 2, 3)
        clip = model.decode(tokens, cond)  # the context in front
        assert clip.shape[0] == 1 + 8 * (cond.codes.numel() // FRAME_TOKENS + latent_frames - 1)
    with pytest.raises(ValueError, match="new_frames must be 0 .* or a multiple of 8 up to 24, got 12"):
        model.encode_video(context_frames(1), new_frames=12)
    with pytest.raises(ValueError, match="up to 16, got 24"):
        model.encode_video(context_frames(9), new_frames=24)


def test_cosmos_positions_continue_one_frame_to_33_and_nine_to_33(tmp_path):
    """Cosmos-1.0's 5 latent frames of positions (tiny rows and columns): 1 context frame + 32 new frames, or
    9 + 24, the lengths NVIDIA's pipeline generates; new_frames=24 keeps the former 25-frame continuation."""
    model = load_model(write_cosmos(tmp_path, "4B", video_latent_shape=[5, 2, 3], generated_frames=3), "cpu")
    assert model.context_frame_counts == (1, 9)
    assert (model.latent_frames_to_sample(1), model.latent_frames_to_sample(9)) == (4, 3)
    assert model.latent_frames_to_sample(1, new_frames=24) == 3
    for frames, new_frames, length in ((1, 0, 33), (9, 0, 33), (1, 24, 25)):
        cond = model.encode_video(context_frames(frames), new_frames=new_frames)
        tokens = generate(model, cond, SamplerConfig(coupler="maximal", window=16), batch_size=1).tokens
        assert model.decode(tokens, cond).shape[0] == length


def test_context_of_another_size_is_resized_and_bad_counts_refused(folders):
    model = load_model(folders["4B"], "cpu", torch.float32)
    resized = model.encode_video(context_frames(9, size=(40, 40)))
    assert resized.codes.shape == (2 * FRAME_TOKENS,)
    with pytest.raises(ValueError, match="1 or 9 context frames, got 5"):
        model.encode_video(context_frames(5))
    with pytest.raises(ValueError, match=r"\(frames, height, width, 3\)"):
        model.encode_video(torch.rand(9, *FRAME_SIZE, 4))
    with pytest.raises(ValueError, match="no text input"):
        model.encode_video(context_frames(1), "a prompt")
    with pytest.raises(ValueError, match="context frames"):
        model.encode("a prompt")


def test_video2world_reads_the_prompt(folders):
    model = load_model(folders["5B-Video2World"], "cpu", torch.float32)
    assert model.config.cross_attention and model.config.abs_pos_emb and model.config.context_dim == CONTEXT_DIM
    cat = model.encode_video(context_frames(9), "a red cat")
    dog = model.encode_video(context_frames(9), "a blue dog")
    assert cat.text.shape == (512, CONTEXT_DIM) and cat.text[3:].abs().max() == 0  # zeros after the tokens
    diff = model.start(cat, 1).prefill()[0] - model.start(dog, 1).prefill()[0]
    assert diff.abs().max() > 1e-3
    with pytest.raises(ValueError, match="prompt"):
        model.encode_video(context_frames(9))
    # cross-attention sees the prompt's tokens only: what lies under the mask changes nothing
    noisy = VideoContext(cat.codes, torch.where(cat.text_mask[:, None], cat.text, torch.randn_like(cat.text)),
                         cat.text_mask)
    torch.testing.assert_close(model.start(noisy, 1).prefill()[0], model.start(cat, 1).prefill()[0])
    # <bov> (id 64000 for the real model: one past the codes) opens the sequence, embedded but never predicted
    net = model.module["transformer"]
    assert net.tok_embeddings.weight.shape[0] == TINY["vocab_size"] + 1 == net.output.weight.shape[0] + 1
    assert model.start(cat, 1).context[0, 0] == TINY["vocab_size"] and model.start(cat, 1).prefix == 1 + 2 * FRAME_TOKENS
    assert net.rope[0].abs().max() == 0 and net.pos_emb[0].abs().max() == 0 and net.rope[1 + 7].abs().max() > 0


def test_official_key_names(folders):
    state = read_state_dict(folders["4B"] / "model.pt")
    raw = torch.load(folders["4B"] / "model.pt", weights_only=True)["model"]
    assert all(key.startswith("model.") for key in raw) and any(key.endswith("_extra_state") for key in raw)
    assert set(state) == official_keys(config_for(folders["4B"]))
    assert "layers.1.attention.q_norm.weight" in state and "layers.0.feed_forward.w3.weight" in state
    video2world = read_state_dict(folders["5B-Video2World"] / "model.pt")
    assert "layers.1.cross_attention.wk.weight" in video2world and "layers.0.cross_attention_norm.weight" in video2world
    assert video2world["layers.0.cross_attention.wk.weight"].shape == (TINY["n_kv_heads"] * TINY["head_dim"], CONTEXT_DIM)


def test_rope_splits_head_channels_44_42_42():
    cfg = BASE_12B.__class__(dim=256, n_layers=1, n_heads=2, n_kv_heads=1, latent_shape=(3, 4, 5), yarn_scale=None)
    table = rope_table_3d(cfg).view(3, 4, 5, 128)
    torch.testing.assert_close(table[..., :64], table[..., 64:])
    half = table[..., :64]
    time, height, width = half[..., :22], half[..., 22:43], half[..., 43:]
    assert time[0].abs().max() == 0 and height[:, 0].abs().max() == 0 and width[:, :, 0].abs().max() == 0
    assert torch.equal(time[2, 1, 3], time[2, 0, 0]) and torch.equal(height[1, 3, 2], height[0, 3, 0])
    torch.testing.assert_close(time[1, 0, 0], 1 / 500000 ** (torch.arange(0, 44, 2).float() / 44))
    torch.testing.assert_close(width[0, 0, 1], 1 / 500000 ** (torch.arange(0, 42, 2).float() / 42))
    # YaRN (12B): the slowest frequencies are divided by the scale, the fastest kept
    inv = 1 / 500000 ** (torch.arange(0, 42, 2).double() / 42)
    factors = yarn_factors(inv, 40, BASE_12B)
    assert factors[0] == 1 and factors[-1] == 0.5 and (factors[1:] <= factors[:-1]).all()


def test_sincos_position_embedding_layout():
    cfg = BASE_12B.__class__(dim=24, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=12, latent_shape=(2, 3, 4))
    table = sincos_table_3d(cfg).view(2, 3, 4, 24)
    time, height, width = table[..., :8], table[..., 8:16], table[..., 16:]
    torch.testing.assert_close(time[1, 2, 3, :4], torch.sin(1 / 10000 ** (torch.arange(4) / 4.0)))
    torch.testing.assert_close(height[0, 0, 0], torch.tensor([0.0] * 4 + [1.0] * 4))
    assert torch.equal(width[1, 2, 3], width[0, 0, 3])


def test_tokenizer_found_in_subfolder_or_model_folder(tmp_path, folders):
    for place in ("tokenizer", "."):
        root = tmp_path / place.strip(".") / "r"
        folder = root / "Cosmos-1.0-Autoregressive-4B"
        shutil.copytree(folders["4B"], folder)
        write_tokenizer(folder / place)
        assert load_model(folder, "cpu").num_tokens == NUM_TOKENS


def test_missing_tokenizer_file_is_named(tmp_path):
    folder = write_cosmos(tmp_path, "4B")
    (tmp_path / TOKENIZER_FOLDER / "decoder.jit").unlink()
    with pytest.raises(ModelLoadError, match="no decoder.jit"):
        load_model(folder, "cpu")
    shutil.rmtree(tmp_path / TOKENIZER_FOLDER)
    with pytest.raises(ModelLoadError, match="encoder.jit / decoder.jit"):
        load_model(folder, "cpu")


def test_wrong_keys_are_refused_by_name(tmp_path):
    folder = write_cosmos(tmp_path, "4B", nested=False)
    state = torch.load(folder / "model.pt", weights_only=True)
    del state["layers.1.attention.k_norm.weight"]
    state["layers.0.attention.wqkv.weight"] = torch.zeros(1)
    torch.save(state, folder / "model.pt")
    with pytest.raises(ModelLoadError, match=r"missing layers\.1\.attention\.k_norm\.weight; "
                                             r"unexpected layers\.0\.attention\.wqkv\.weight"):
        load_model(folder, "cpu")


def test_wrong_size_is_refused(tmp_path):
    folder = write_cosmos(tmp_path, "4B", nested=False)
    state = torch.load(folder / "model.pt", weights_only=True)
    state["output.weight"] = torch.zeros(10, TINY["dim"])
    torch.save(state, folder / "model.pt")
    with pytest.raises(ModelLoadError, match="output.weight"):
        load_model(folder, "cpu")


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_pickled_code_is_refused(tmp_path):
    folder = write_cosmos(tmp_path, "4B")
    with open(folder / "model.pt", "wb") as f:
        pickle.dump({"model": _Exploit()}, f)
    with pytest.raises(ModelLoadError, match="model.pt"):
        load_model(folder, "cpu")


def test_detect_and_size_from_name(tmp_path, folders):
    assert all(detect(folder) for folder in folders.values())
    for size, expected in SIZES.items():  # the real sizes, from NVIDIA's folder names alone
        named = tmp_path / "real" / f"Cosmos-1.0-Autoregressive-{size}"
        named.mkdir(parents=True)
        assert config_for(named) == expected
    assert SIZES["4B"].head_dim == 128 and (SIZES["12B"].dim, SIZES["12B"].n_layers) == (5120, 40)
    assert not detect(folders["4B"].parent / TOKENIZER_FOLDER)
    unnamed = tmp_path / "my-video-model"
    shutil.copytree(folders["4B"], unnamed)
    (unnamed / "config.json").unlink()
    assert not detect(unnamed)
    (unnamed / "config.json").write_text('{"n_layers": 2}')
    with pytest.raises(ModelLoadError, match="Cosmos size"):
        config_for(unnamed)
    bad = tmp_path / "Cosmos-1.0-Autoregressive-4B"
    shutil.copytree(folders["4B"], bad)
    (bad / "config.json").write_text('{"video_latent_shape": [4, 2]}')
    with pytest.raises(ModelLoadError, match="video_latent_shape"):
        load_model(bad, "cpu")


def _heads(folder: Path) -> tuple[int, int, int, int]:
    cfg = load_model(folder, "cpu").config  # loads strictly: the weights must fit the sizes read
    return cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim


def test_nvidia_model_config_with_null_head_dim_derives_it(tmp_path):
    """NVIDIA's config.json: head_dim null (dim // n_heads), its other unset fields null too, YaRN off."""
    folder = write_nvidia_config(write_cosmos(tmp_path, "4B"))  # weights of head_dim 12 = 48 // 4
    assert _heads(folder) == (48, 4, 2, 12)
    cfg = config_for(folder)
    assert cfg.yarn_scale is None and (cfg.yarn_beta_fast, cfg.yarn_beta_slow) == (4.0, 1.0)
    assert cfg.latent_shape == tuple(TINY["video_latent_shape"]) and cfg.original_latent_shape == (3, 40, 64)
    assert not cfg.cross_attention and cfg.context_dim == 1024


def test_new_dim_and_heads_without_head_dim_derive_it(tmp_path):
    """Not the size's base head_dim (128 for the 4B, 128 for the 12B whose dim // n_heads is 160)."""
    for size in ("4B", "12B"):
        folder = write_cosmos(tmp_path / size, size, dim=64, n_heads=2, n_kv_heads=1, head_dim=32)
        write_nvidia_config(folder, dim=64, n_heads=2, n_kv_heads=1, head_dim="drop")
        assert _heads(folder) == (64, 2, 1, 32)


def test_null_n_kv_heads_means_one_per_head(tmp_path):
    folder = write_nvidia_config(write_cosmos(tmp_path, "4B", n_kv_heads=TINY["n_heads"]), n_kv_heads=None)
    assert _heads(folder) == (48, 4, 4, 12)


@pytest.mark.parametrize("field, value", [("n_heads", 0), ("dim", "48"), ("head_dim", 12.0), ("n_layers", True)])
def test_sizes_must_be_positive_integers(tmp_path, field, value):
    folder = write_nvidia_config(write_cosmos(tmp_path, "4B"), **{field: value})
    with pytest.raises(ModelLoadError, match=f"{field} must be a positive integer"):
        config_for(folder)


def test_preview_shows_the_latent_frame_being_sampled(folders):
    model = load_model(folders["4B"], "cpu", torch.float32)
    tokens = generate(model, _context(model), SamplerConfig(window=8), batch_size=1).tokens
    cols = TINY["video_latent_shape"][2]
    partial = model.preview_frame(tokens[:, :FRAME_TOKENS + cols])  # frame 1: its first code row sampled
    assert partial.shape == (*FRAME_SIZE, 3)
    assert (partial[16:] == 0.5).all() and (partial[:16] != 0.5).any()
    # the tiny decoder maps each latent frame on its own, so the finished preview is that frame of the clip
    torch.testing.assert_close(model.preview_frame(tokens), model.decode(tokens)[1])


def test_rows_rewound_by_different_counts_match_fresh_sessions(folders):
    model = load_model(folders["4B"], "cpu", torch.float64)
    cond = _context(model)
    fed = torch.tensor([[5, 6, 7, 8, 9], [1, 2, 3, 4, 5]])
    session = model.start(cond, 2)
    session.prefill()
    session.forward(fed)
    session.rewind(torch.tensor([1, 3]))  # row 0 keeps 4 codes, row 1 keeps 2
    logits, _ = session.forward(torch.tensor([[10, 11], [12, 13]]))
    for row, kept in ((0, 4), (1, 2)):
        fresh = model.start(cond, 1)
        fresh.prefill()
        new = torch.tensor([[10, 11], [12, 13]])[row:row + 1]
        expected, _ = fresh.forward(torch.cat([fed[row:row + 1, :kept], new], 1))
        torch.testing.assert_close(logits[row], expected[0, -2:], rtol=0, atol=1e-10)


@pytest.mark.parametrize("size, billions", [("4B", 4), ("12B", 12), ("5B-Video2World", 5), ("13B-Video2World", 13)])
def test_published_sizes_have_their_parameter_counts(size, billions):
    from scd_core.models.families.cosmos import SIZES, CosmosTransformer

    with torch.device("meta"):
        net = CosmosTransformer(SIZES[size])
    count = sum(p.numel() for p in net.parameters())
    assert abs(count / 1e9 - billions) / billions < 0.12, f"{size}: {count / 1e9:.2f}B parameters"


def test_tokenizer_traced_for_whole_chunks_gets_padded_clips(tmp_path, folders):
    model = load_model(folders["4B"], "cpu", torch.float32)
    strict_root = tmp_path / "strict"
    folder = strict_root / folders["4B"].name
    shutil.copytree(folders["4B"], folder)
    write_tokenizer(strict_root / TOKENIZER_FOLDER, fixed_length=True)
    strict = load_model(folder, "cpu", torch.float32)
    with pytest.raises(torch.jit.Error):  # the files really refuse a short clip
        strict.module["decoder"](torch.zeros(1, 2, 2, 3, dtype=torch.long))
    for frames in (1, 9):
        clip = context_frames(frames)
        assert torch.equal(strict.encode_video(clip).codes, model.encode_video(clip).codes)
    tokens = generate(model, _context(model), SamplerConfig(window=8), batch_size=2).tokens
    torch.testing.assert_close(strict.decode(tokens), model.decode(tokens))
    torch.testing.assert_close(strict.decode(tokens, _context(model)), model.decode(tokens, _context(model)))
    torch.testing.assert_close(strict.preview_frame(tokens[:1, :9]), model.preview_frame(tokens[:1, :9]))
