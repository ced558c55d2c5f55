"""Lumina-mGPT 1 and 2.0 on tiny random checkpoints written in the real on-disk layouts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from lumina_fixture import (BOI, CODES_1, CODES_2, END_OF_TURN, EOI, HEAD_DIM, HEADS, MOVQ_OFFSET, NUM_TOKENS,
                            RESOLUTION_1, RESOLUTION_2, ROW_END, SHARDS, SIDE, SPECIAL_IDS_1, SPECIAL_IDS_2,
                            fork_config, tiny_lumina2_dir, tiny_lumina_dir, write_tokenizer)  # noqa: F401

from pace import assert_each_row_matches, staggered_logits, tree_logits, window_and_stepwise_logits

from scd_core import COUPLERS, ModelLoadError, SamplerConfig, TokenModel, generate, load_model
from scd_core.models.families import lumina
from scd_core.models.weights.tokenizer_files import TextTokenizer

PROMPT = "a red cube on a wooden table"
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model32(tiny_lumina_dir: Path) -> lumina.LuminaModel:
    return load_model(tiny_lumina_dir, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def model64(tiny_lumina_dir: Path) -> lumina.LuminaModel:
    return load_model(tiny_lumina_dir, device="cpu", dtype=torch.float64)


@pytest.fixture(scope="module")
def model2(tiny_lumina2_dir: Path) -> lumina.LuminaModel:
    return load_model(tiny_lumina2_dir, device="cpu", dtype="float32")


def forced_layout(row_end: int, end_of_image: int) -> dict[int, int]:
    forced = {row * (SIDE + 1) + SIDE: row_end for row in range(SIDE)}
    forced[NUM_TOKENS - 1] = end_of_image
    return forced


def test_lumina1_describes_itself(model32: lumina.LuminaModel) -> None:
    assert isinstance(model32, TokenModel) and isinstance(model32.module, torch.nn.Module)
    assert model32.family == "lumina-mgpt" and model32.image_size == (RESOLUTION_1, RESOLUTION_1)
    assert (model32.grid, model32.num_tokens, model32.vocab_size) == ((SIDE, SIDE + 1), NUM_TOKENS, CODES_1)
    assert torch.equal(model32.code_ids, torch.arange(4, 4 + CODES_1))  # Chameleon's IMGIMG ids, in code order
    assert model32.forced_tokens == forced_layout(SPECIAL_IDS_1[ROW_END], SPECIAL_IDS_1[EOI])
    assert (model32.default_cfg_scale, model32.default_top_k, model32.default_temperature) == (3.0, 2000, 1.0)
    assert model32.device == CPU and all(p.dtype == torch.float32 for p in model32.module.parameters())
    assert not model32.module.training  # the fork's config carries dropout 0.05


def test_lumina2_describes_itself(model2: lumina.LuminaModel) -> None:
    assert model2.family == "lumina-mgpt-2" and model2.image_size == (RESOLUTION_2, RESOLUTION_2)
    assert (model2.grid, model2.num_tokens, model2.vocab_size) == ((SIDE, SIDE + 1), NUM_TOKENS, CODES_2)
    assert torch.equal(model2.code_ids, torch.arange(MOVQ_OFFSET, MOVQ_OFFSET + CODES_2))
    assert model2.forced_tokens == forced_layout(SPECIAL_IDS_2[ROW_END], SPECIAL_IDS_2[EOI])
    assert (model2.default_cfg_scale, model2.default_top_k) == (4.0, 4096)


def test_default_sampling_law_is_the_authors(model32: lumina.LuminaModel, model2: lumina.LuminaModel) -> None:
    """Left at the model's values, each generation samples its authors' law: CFG as their guidance processor
    (uncond + cfg (cond - uncond)), top-k over the image codes, temperature 1; transformers' own warpers here.
    Lumina-mGPT: `FlexARInferenceSolver.generate` without a logits processor builds `create_logits_processor()`,
    cfg 3, image_top_k 2000 (their README's example passes cfg 4.0).  Lumina-mGPT 2.0: generate.py has no
    defaults; the README and scripts/sample.sh run --cfg 4.0 --top_k 4096 --temperature 1.0 (4096 keeps all of
    the tiny codebook's 256 codes, as their top-k clamps to the vocabulary)."""
    from sampling_law import (assert_same_law, default_probs, guided, processed_probs, sampling_settings,
                              spread_logits, warpers)

    for model, (cfg, top_k) in ((model32, (3.0, 2000)), (model2, (4.0, 4096))):
        # the tiny codebook is below the authors' top-k, so the law alone would not see a wrong one
        assert sampling_settings(model, SamplerConfig()).top_k == top_k
        cond, uncond = spread_logits(model.vocab_size, seed=0), spread_logits(model.vocab_size, seed=1)
        reference = warpers(1.0, min(top_k, model.vocab_size), 1.0)
        assert_same_law(default_probs(model, cond, uncond), processed_probs(reference, guided(cond, uncond, cfg)))


@pytest.mark.parametrize("which", ["1", "2"])
def test_prompt_layout_follows_the_authors(which: str, model32: lumina.LuminaModel, model2: lumina.LuminaModel,
                                           tiny_lumina_dir: Path, tiny_lumina2_dir: Path) -> None:
    model, folder, ids, size = ((model32, tiny_lumina_dir, SPECIAL_IDS_1, RESOLUTION_1) if which == "1" else
                                (model2, tiny_lumina2_dir, SPECIAL_IDS_2, RESOLUTION_2))
    text = TextTokenizer(folder).encode(f"Generate an image of {size}x{size} according to the following prompt:\n"
                                        f"{PROMPT}")
    size_token = ids[f"<reserved{8800 + size // 32:05d}>"]  # height and width, in 32 px cells
    header = [ids[BOI], size_token, size_token]
    prompt = model.encode(PROMPT)
    assert list(prompt.cond) == [ids["<s>"], *text, ids[END_OF_TURN], *header]
    assert list(prompt.uncond) == header  # the authors' unconditional context: the image header alone
    assert model.encode(PROMPT, negative_prompt="  ") == prompt
    negative = model.encode(PROMPT, negative_prompt="blurry")
    assert negative.uncond[-3:] == tuple(header) and len(negative.uncond) > 3


def test_qk_norm_rows_are_repeated_over_the_heads_of_their_shard(model32: lumina.LuminaModel,
                                                                  tiny_lumina_dir: Path) -> None:
    from safetensors import safe_open

    key = "model.layers.0.self_attn.q_norm.weight"
    with safe_open(str(tiny_lumina_dir / "model-00001-of-00002.safetensors"), framework="pt") as handle:
        stored = handle.get_tensor(key)
    assert stored.shape == (SHARDS, HEAD_DIM)  # the fork's layout: one row per model-parallel shard
    loaded = model32.module["lm"].state_dict()[key]
    assert loaded.shape == (HEADS, HEAD_DIM)
    per_shard = HEADS // SHARDS
    for head in range(HEADS):
        assert torch.equal(loaded[head], stored[head // per_shard])


def reference_logits(folder: Path, model: lumina.LuminaModel, ids: list[int]) -> torch.Tensor:
    """Plain transformers forward of one unpadded sequence, code rows of lm_head, in float64."""
    from safetensors.torch import load_file
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    config = ChameleonConfig.from_pretrained(str(folder))
    reference = ChameleonForConditionalGeneration(config).double().eval()
    state = {}
    for shard in sorted(folder.glob("*.safetensors")):
        for key, value in load_file(str(shard)).items():
            if "_norm." in key and "self_attn" in key:
                value = value.repeat_interleave(HEADS // value.shape[0], dim=0)
            state[key] = value.double()
    missing, unexpected = reference.load_state_dict(state, strict=False)
    assert not unexpected and all(key.startswith("model.vqmodel.") for key in missing)
    with torch.no_grad():
        hidden = reference.model(input_ids=torch.tensor([ids])).last_hidden_state
    return hidden @ reference.lm_head.weight[model.code_ids].T


def test_session_equals_plain_forward_of_each_branch(model64: lumina.LuminaModel, tiny_lumina_dir: Path) -> None:
    """Left padding, position ids, the shared cache and the code rows change nothing in either branch."""
    prompt = model64.encode(PROMPT)
    tokens = [int(model64.code_ids[i]) for i in (5, 900, 17, 4000)] + [model64.forced_tokens[SIDE], 4 + 77]
    session = model64.start(prompt, batch_size=1)
    first = session.prefill()
    window = session.forward(torch.tensor([tokens]))
    for branch, prefix in ((0, prompt.cond), (1, prompt.uncond)):
        expected = reference_logits(tiny_lumina_dir, model64, list(prefix) + tokens)[:, len(prefix) - 1:]
        got = torch.cat([first[branch], window[branch]], dim=1)
        assert torch.allclose(got, expected, atol=1e-9, rtol=1e-9), (got - expected).abs().max()


def window_and_stepwise(model: lumina.LuminaModel) -> tuple:
    """Logits of an 8-token window, then of the same tokens fed one at a time after a rewind."""
    codes = torch.randint(0, model.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    tokens = model.code_ids[codes]
    tokens[:, SIDE] = model.forced_tokens[SIDE]  # a row-end inside the window, as the engine feeds it
    return window_and_stepwise_logits(model, model.encode(PROMPT), tokens)


def test_window_forward_equals_token_by_token(model32: lumina.LuminaModel, model64: lumina.LuminaModel) -> None:
    for model, tolerance in ((model32, 1e-4), (model64, 1e-10)):
        window, stepwise = window_and_stepwise(model)
        for branch in (0, 1):
            assert window[branch].shape == (2, 8, CODES_1) and window[branch].dtype == model.module["lm"].dtype
            assert torch.allclose(window[branch], stepwise[branch], atol=tolerance, rtol=0)


def test_faithful_window_gives_the_autoregressive_tokens(model64: lumina.LuminaModel) -> None:
    prompt = model64.encode(PROMPT)
    ar = generate(model64, prompt, SamplerConfig(coupler="faithful", window=1, seed=5), batch_size=2)
    for window in (3, 8):
        result = generate(model64, prompt, SamplerConfig(coupler="faithful", window=window, seed=5), batch_size=2)
        assert torch.equal(result.tokens, ar.tokens)
        assert result.nfe < ar.nfe


@pytest.mark.parametrize("negative", [None, "blurry"])
def test_rows_at_different_positions_give_each_rows_sequential_logits(model64: lumina.LuminaModel,
                                                                       negative: str | None) -> None:
    """Samples at different lengths in one call, over slots they rejected, then without the one that finished."""
    tokens = model64.code_ids[torch.randint(0, CODES_1, (3, 16), generator=torch.Generator().manual_seed(2))]
    calls = [(tokens[:, :6], [5, 2, 0]), (tokens[:, 6:10], [2, 5, 3]), (tokens[:, 10:13], [0, 0, 1], [2, 0]),
             (tokens[[2, 0], 13:16], [0, 0])]
    assert_each_row_matches(staggered_logits(model64, model64.encode(PROMPT, negative), calls), 1e-10)


def test_tree_of_chains_gives_each_chains_sequential_logits(model64: lumina.LuminaModel) -> None:
    """Candidates at the first draft: every chain of a tree call, and the call after keeping one chain per row."""
    ids = model64.code_ids[torch.randint(0, CODES_1, (2, model64.num_tokens + 5),
                                         generator=torch.Generator().manual_seed(4))]
    assert_each_row_matches(tree_logits(model64, model64.encode(PROMPT), ids), 1e-10)


def test_cfg_branches_differ_and_scale_matters(model32: lumina.LuminaModel) -> None:
    session = model32.start(model32.encode(PROMPT), batch_size=1)
    cond, uncond = session.prefill()
    assert (cond - uncond).abs().max() > 0.1
    prompt = model32.encode(PROMPT)
    plain = generate(model32, prompt, SamplerConfig(coupler="faithful", window=4, seed=1, cfg_scale=1.0))
    guided = generate(model32, prompt, SamplerConfig(coupler="faithful", window=4, seed=1, cfg_scale=3.0))
    assert not torch.equal(plain.tokens, guided.tokens)


@pytest.mark.parametrize("which", ["1", "2"])
@pytest.mark.parametrize("coupler", COUPLERS)
def test_generate_places_forced_tokens_and_decodes(which: str, coupler: str, model32: lumina.LuminaModel,
                                                   model2: lumina.LuminaModel) -> None:
    model, pixels = (model32, RESOLUTION_1) if which == "1" else (model2, RESOLUTION_2)
    result = generate(model, model.encode(PROMPT), SamplerConfig(coupler=coupler, window=6, seed=2), batch_size=2)
    # per-row pace: `committed` counts what the slowest row committed in each call
    assert result.tokens.shape == (2, NUM_TOKENS) and len(result.committed) == result.nfe
    assert sum(result.committed) <= NUM_TOKENS and result.nfe <= NUM_TOKENS
    for position in range(NUM_TOKENS):
        column = result.tokens[:, position]
        if position in model.forced_tokens:
            assert (column == model.forced_tokens[position]).all()
        else:
            assert torch.isin(column, model.code_ids).all()
    images = model.decode(result.tokens)
    assert images.shape == (2, pixels, pixels, 3) and images.dtype == torch.float32 and images.device == CPU
    assert 0 <= float(images.min()) and float(images.max()) <= 1 and float(images.std()) > 0


def test_size_can_be_picked_where_the_model_supports_several(model2: lumina.LuminaModel,
                                                            model32: lumina.LuminaModel) -> None:
    old_prompt = model2.encode(PROMPT)
    try:
        model2.set_image_size(64, 64)  # 2.0 at 64 px: 8 x 8 codes of 8 px
        assert (model2.grid, model2.num_tokens) == ((8, 9), 8 * 9 + 1)
        assert model2.forced_tokens[8] == SPECIAL_IDS_2[ROW_END] and model2.forced_tokens[72] == SPECIAL_IDS_2[EOI]
        prompt = model2.encode(PROMPT)
        assert prompt.cond[-2:] == prompt.uncond[-2:] == (SPECIAL_IDS_2["<reserved08802>"],) * 2
        result = generate(model2, prompt, SamplerConfig(coupler="maximal", window=16, seed=0))
        assert model2.decode(result.tokens).shape == (1, 64, 64, 3)
        old = generate(model2, old_prompt, SamplerConfig(coupler="maximal", window=16, seed=0))
        assert model2.image_size == (RESOLUTION_2, RESOLUTION_2)  # the prompt's size
        assert old.tokens.shape[1] == model2.num_tokens
        for width, height in ((100, 64), (64, 0), (64, True)):
            with pytest.raises(ValueError, match="multiple of 32"):
                model2.set_image_size(width, height)
        with pytest.raises(ValueError, match="square"):
            model32.set_image_size(64, 32)  # Lumina-mGPT 1 stays square here
        assert model32.image_size == (RESOLUTION_1, RESOLUTION_1)
    finally:
        model2.set_image_size(RESOLUTION_2, RESOLUTION_2)


def test_lumina2_generates_wide_images(model2: lumina.LuminaModel) -> None:
    """64 x 32 px: 4 rows of 8 codes and a row-end each; the header and the prompt carry height, then width."""
    try:
        model2.set_image_size(64, 32)
        assert (model2.size, model2.grid, model2.num_tokens) == ((4, 8), (4, 9), 4 * 9 + 1)
        assert model2.forced_tokens == {**{row * 9 + 8: SPECIAL_IDS_2[ROW_END] for row in range(4)},
                                        36: SPECIAL_IDS_2[EOI]}
        prompt = model2.encode(PROMPT)
        header = (SPECIAL_IDS_2[BOI], SPECIAL_IDS_2["<reserved08801>"], SPECIAL_IDS_2["<reserved08802>"])
        assert prompt.cond[-3:] == prompt.uncond == header and prompt.image_size == (64, 32)
        model2.set_image_size(32, 64)  # the prompt keeps its size
        result = generate(model2, prompt, SamplerConfig(coupler="maximal", window=8, seed=0), batch_size=2)
        assert model2.image_size == (64, 32) and result.tokens.shape == (2, 37)
        images = model2.decode(result.tokens)
        assert images.shape == (2, 32, 64, 3) and float(images.std()) > 0
    finally:
        model2.set_image_size(RESOLUTION_2, RESOLUTION_2)


def test_decode_rejects_tokens_that_are_not_codes(model32: lumina.LuminaModel) -> None:
    tokens = torch.tensor([[int(model32.code_ids[0])] * NUM_TOKENS])
    model32.decode(tokens)  # row-end and end-of-image columns are not read
    tokens[0, 0] = SPECIAL_IDS_1[BOI]
    with pytest.raises(ValueError, match="not an image code"):
        model32.decode(tokens)
    with pytest.raises(ValueError, match="tokens must be"):
        model32.decode(tokens[:, :5])


def test_512_layout_with_chameleon_subfolder(tiny_lumina_dir: Path, model32: lumina.LuminaModel,
                                             tmp_path: Path) -> None:
    """Lumina-mGPT-7B-512 ships no tokenizer: Chameleon's text_tokenizer.json and VQGAN sit in chameleon/."""
    folder = tmp_path / "Lumina-mGPT-7B-64"
    shutil.copytree(tiny_lumina_dir, folder)
    chameleon = folder / "chameleon"
    chameleon.mkdir()
    (folder / "tokenizer.json").rename(chameleon / "text_tokenizer.json")
    (folder / "tokenizer_config.json").unlink()
    for name in ("vqgan.ckpt", "vqgan.yaml"):
        (folder / name).rename(chameleon / name)
    model = load_model(folder, device="cpu", dtype="float32")
    assert model.encode(PROMPT) == model32.encode(PROMPT)


def test_lumina2_command_line_at_64_by_32(tiny_lumina2_dir: Path, model2: lumina.LuminaModel, tmp_path: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    """`python -m scd_core generate --width 64 --height 32` writes the image the library samples at that size."""
    import numpy as np
    from PIL import Image

    from scd_core.frontends.cli import main

    output = tmp_path / "wide.png"
    code = main(["generate", "--model", str(tiny_lumina2_dir), "--prompt", PROMPT, "--width", "64", "--height",
                 "32", "--window", "4", "--seed", "3", "--cfg", "7.5", "--device", "cpu", "-o", str(output)])
    assert code == 0, capsys.readouterr().err
    image = np.asarray(Image.open(output))
    assert image.shape == (32, 64, 3)
    try:
        model2.set_image_size(64, 32)
        result = generate(model2, model2.encode(PROMPT), SamplerConfig(window=4, seed=3, cfg_scale=7.5))
        expected = (model2.decode(result.tokens).clamp(0, 1) * 255).round().byte().numpy()[0]
    finally:
        model2.set_image_size(RESOLUTION_2, RESOLUTION_2)
    assert np.array_equal(image, expected)


def authors_prompt_ids(folder: Path, prompt: str, width: int, height: int) -> list[int]:
    """The 2.0 prompt as the authors' text-to-image path builds it, restated: their tokenizer wrapper loads the
    folder with transformers' AutoTokenizer and starts with its bos_token_id, or its eos_token_id when that is
    None; the conversation is the question then "<reserved08706>" (the prompt unstripped), encoded as one
    string without special tokens.  The header is what the model then writes: begin-of-image, height and
    width tokens <reserved{8800 + cells}>."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    first = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    question = f"Generate an image of {width}x{height} according to the following prompt:\n{prompt}"
    header = tokenizer.convert_tokens_to_ids([BOI, f"<reserved{8800 + height // 32:05d}>",
                                              f"<reserved{8800 + width // 32:05d}>"])
    return [first, *tokenizer.encode(question + END_OF_TURN, add_special_tokens=False), *header]


@pytest.mark.parametrize("bos", ["named", "null", "absent"])
def test_lumina2_prompt_ids_are_the_authors(bos: str, tiny_lumina2_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / tiny_lumina2_dir.name
    shutil.copytree(tiny_lumina2_dir, folder)
    if bos != "named":  # Qwen-style: no BOS in the vocabulary, the config names none
        write_tokenizer(folder, {k: v for k, v in SPECIAL_IDS_2.items() if k != "<s>"}, 0, {})
        config = {"eos_token": "</s>", "tokenizer_class": "PreTrainedTokenizerFast"}
        (folder / "tokenizer_config.json").write_text(json.dumps(config | ({"bos_token": None} if bos == "null"
                                                                           else {})))
    model = load_model(folder, device="cpu", dtype="float32")
    first = SPECIAL_IDS_2["<s>" if bos == "named" else "</s>"]
    for prompt in (PROMPT, "  a cube \n", "\ta cube on a table\n\n"):
        for width, height in ((32, 32), (64, 32)):
            model.set_image_size(width, height)
            ids = model.encode(prompt).cond
            assert list(ids) == authors_prompt_ids(folder, prompt, width, height) and ids[0] == first
    assert model.encode(" a cube").cond != model.encode("a cube").cond  # whitespace is kept


def broken_copy(source: Path, tmp_path: Path, name: str | None = None) -> Path:
    folder = tmp_path / (name or source.name)
    shutil.copytree(source, folder)
    return folder


def test_missing_vq_checkpoint(tiny_lumina_dir: Path, tmp_path: Path) -> None:
    folder = broken_copy(tiny_lumina_dir, tmp_path)
    (folder / "vqgan.ckpt").unlink()
    with pytest.raises(ModelLoadError, match="vqgan.ckpt.*movqgan_270M.ckpt"):
        load_model(folder, device="cpu")


@pytest.mark.parametrize("which", ["1", "2"])
def test_vq_checkpoint_with_wrong_keys(which: str, tiny_lumina_dir: Path, tiny_lumina2_dir: Path,
                                       tmp_path: Path) -> None:
    folder = broken_copy(tiny_lumina_dir if which == "1" else tiny_lumina2_dir, tmp_path)
    name = "vqgan.ckpt" if which == "1" else "movqgan_270M.ckpt"
    data = torch.load(str(folder / name), weights_only=True)
    state = data["state_dict"] if which == "1" else data
    state["decoder.mid.attn_1.proj.weight"] = state.pop("decoder.mid.attn_1.proj_out.weight")
    torch.save(data, str(folder / name))
    with pytest.raises(ModelLoadError, match=rf"{name}.*proj_out.weight"):
        load_model(folder, device="cpu")


def test_movqgan_checkpoint_with_extra_entries_loads_and_names_them_once(tiny_lumina2_dir: Path, tmp_path: Path,
                                                                          model2: lumina.LuminaModel) -> None:
    """The upstream loads movqgan_270M.ckpt non-strictly: entries the decoder does not use are set aside."""
    folder = broken_copy(tiny_lumina2_dir, tmp_path)
    path = folder / "movqgan_270M.ckpt"
    state = torch.load(str(path), weights_only=True)
    state["ema_decoder.conv_in.weight"] = torch.zeros(2, 2)  # training extras beside the decoder
    state["quantize.used"] = torch.arange(4)
    state["loss.discriminator.main.0.weight"] = torch.zeros(1)  # a known training part: silently set aside
    torch.save(state, str(path))
    with pytest.warns(UserWarning) as caught:
        model = load_model(folder, device="cpu", dtype="float32")
    messages = [str(w.message) for w in caught if "set aside" in str(w.message)]
    assert len(messages) == 1 and "2 entries" in messages[0] and "ema_decoder.conv_in.weight" in messages[0] \
        and "quantize.used" in messages[0] and "loss." not in messages[0]
    tokens = generate(model2, model2.encode(PROMPT), SamplerConfig(coupler="maximal", window=6, seed=3)).tokens
    assert torch.equal(model.decode(tokens), model2.decode(tokens))


@pytest.mark.parametrize("change", ["missing", "misshaped"])
def test_movqgan_checkpoint_without_a_needed_weight_is_refused(change: str, tiny_lumina2_dir: Path,
                                                               tmp_path: Path) -> None:
    folder = broken_copy(tiny_lumina2_dir, tmp_path)
    path = folder / "movqgan_270M.ckpt"
    state = torch.load(str(path), weights_only=True)
    key = "decoder.norm_out.conv_y.weight"
    if change == "missing":
        del state[key]
    else:
        state[key] = state[key][:, :2]
    torch.save(state, str(path))
    expected = (rf"missing \['{key}'\]" if change == "missing" else
                rf"wrong shape \['{key} \[32, 2, 1, 1\] \(expected \[32, 4, 1, 1\]\)")
    with pytest.raises(ModelLoadError, match=rf"movqgan_270M.ckpt.*{expected}"):
        load_model(folder, device="cpu")


def test_movqgan_decodes_in_float32_whatever_the_model_dtype(tiny_lumina2_dir: Path,
                                                             model2: lumina.LuminaModel) -> None:
    """As the authors decode: a bfloat16 load gives the pixels of a float32 load."""
    bf16 = load_model(tiny_lumina2_dir, device="cpu", dtype="bfloat16")
    assert bf16.module["lm"].dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in bf16.module["vq"].parameters())
    tokens = generate(model2, model2.encode(PROMPT), SamplerConfig(coupler="maximal", window=6, seed=4),
                      batch_size=2).tokens
    assert torch.equal(bf16.decode(tokens), model2.decode(tokens))


def test_vq_checkpoint_with_pickled_code_is_refused(tiny_lumina_dir: Path, tmp_path: Path) -> None:
    folder = broken_copy(tiny_lumina_dir, tmp_path)
    torch.save({"state_dict": {"x": torch.zeros(1)}, "hook": print}, str(folder / "vqgan.ckpt"))
    with pytest.raises(ModelLoadError, match="vqgan.ckpt.*refused"):
        load_model(folder, device="cpu")


def test_missing_shard(tiny_lumina_dir: Path, tmp_path: Path) -> None:
    folder = broken_copy(tiny_lumina_dir, tmp_path)
    (folder / "model-00001-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="lacks weight shards model-00001-of-00002.safetensors"):
        load_model(folder, device="cpu")


def test_weights_that_do_not_fit_config(tiny_lumina_dir: Path, tmp_path: Path) -> None:
    folder = broken_copy(tiny_lumina_dir, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["num_attention_heads"] = 8  # q/k-norm rows no longer divide into the heads, projections still fit
    config["num_key_value_heads"] = 8
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"self_attn\.[qk]_norm\.(weight|bias) has shape \[2, 8\]"):
        load_model(folder, device="cpu")
    config = fork_config(8500)  # the code ids still fit, the embedding table does not
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="embed_tokens.weight has shape"):
        load_model(folder, device="cpu")


def test_vocab_size_left_out_or_null_is_not_zero(tiny_lumina_dir: Path, tmp_path: Path) -> None:
    folder = broken_copy(tiny_lumina_dir, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    del config["vocab_size"]  # transformers' 65536: the code ids fit, the embedding table does not
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"embed_tokens.weight has shape \[\d+, \d+\] where config.json "
                                             r"implies \[65536,"):
        load_model(folder, device="cpu")
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": None}))
    with pytest.raises(ModelLoadError, match="could not be loaded as Lumina-mGPT"):  # transformers' field
        load_model(folder, device="cpu")
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": "large"}))
    with pytest.raises(ModelLoadError, match="vocab_size must be a positive integer, got 'large'"):
        load_model(folder, device="cpu")


def test_resolution_must_come_from_the_folder_name(tiny_lumina_dir: Path, tmp_path: Path) -> None:
    folder = broken_copy(tiny_lumina_dir, tmp_path, "my-lumina")
    with pytest.raises(ModelLoadError, match="resolution of .*my-lumina"):
        load_model(folder, device="cpu")


def test_bad_arguments(model32: lumina.LuminaModel, model2: lumina.LuminaModel) -> None:
    with pytest.raises(ValueError, match="prompt must be a string"):
        model32.encode(7)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="LuminaModel.encode"):
        model32.start("text", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size"):
        model32.start(model32.encode(PROMPT), 0)
    session = model32.start(model32.encode(PROMPT), 1)
    with pytest.raises(RuntimeError, match="prefill"):
        session.forward(torch.tensor([[4]]))
    session.prefill()
    with pytest.raises(ValueError, match="rewind"):
        session.rewind(1)


def test_shape_benchmark_lumina_one_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    from scd_core.bench import shapes as bench_models

    # the Chameleon build and the timing loop at a narrow width (the 4096-wide layer takes ~20 s to build here)
    narrow = dict(bench_models.LUMINA_SHAPES["lumina-7b"], hidden_size=256, num_attention_heads=4,
                  num_key_value_heads=4, intermediate_size=512)
    monkeypatch.setitem(bench_models.LUMINA_SHAPES, "lumina-7b", narrow)
    rows = bench_models.shape_benchmark("lumina-7b", windows=(2, 1), device="cpu", layers=1, prefix=8, repeats=1)
    assert [row["window"] for row in rows] == [1, 2]
    assert rows[0]["ratio"] == 1.0 and rows[1]["ratio"] > 0
    assert rows[0]["layers"] == 1 and rows[0]["full_layers"] == 32


def test_taming_decoder_equals_llamagens_vq_decoder_of_the_same_design() -> None:
    """An independent implementation of the same structure (vq16, other key names) computes the same pixels."""
    import re

    from scd_core.models.tokenizers import taming, vq16

    cfg = vq16.VQConfig(codebook_size=16, codebook_embed_dim=4, z_channels=8, ch=32, ch_mult=(1, 2, 2),
                        num_res_blocks=1, with_encoder=False)
    reference = vq16.Decoder(cfg).double().eval()
    spec = taming.DecoderSpec(codebook_size=16, embed_dim=4, z_channels=8, widths=(32, 64, 64), num_res_blocks=1,
                              attn_levels=frozenset({2}), spatial_norm=False)  # vq16 attends at the coarsest level
    decoder = taming.Decoder(spec).double().eval()
    levels = len(cfg.ch_mult)

    def taming_name(key: str) -> str:
        key = re.sub(r"^mid\.(\d)", lambda m: "mid." + ("block_1", "attn_1", "block_2")[int(m.group(1))], key)
        key = re.sub(r"^conv_blocks\.(\d+)\.res", lambda m: f"up.{levels - 1 - int(m.group(1))}.block", key)
        return re.sub(r"^conv_blocks\.(\d+)\.", lambda m: f"up.{levels - 1 - int(m.group(1))}.", key)

    decoder.load_state_dict({taming_name(k): v for k, v in reference.state_dict().items()}, strict=True)
    z = torch.randn(2, 8, 3, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        expected, got = reference(z), decoder(z, None)
    assert got.shape == (2, 3, 12, 20) and torch.allclose(got, expected, atol=1e-12)


def test_spatial_norms_sit_where_the_group_norms_do() -> None:
    """MoVQ's norm with scale 1 and shift 0 from the latent is GroupNorm: same pixels as the plain decoder."""
    from scd_core.models.tokenizers import taming

    common = dict(codebook_size=16, embed_dim=4, z_channels=4, widths=(32, 64), num_res_blocks=1,
                  attn_levels=frozenset({1}))
    plain = taming.VQDecoder(taming.DecoderSpec(spatial_norm=False, **common)).double().eval()
    movq = taming.VQDecoder(taming.DecoderSpec(spatial_norm=True, **common)).double().eval()
    state = {}
    for key, value in movq.state_dict().items():
        if ".conv_y." in key or ".conv_b." in key:  # scale 1, shift 0, whatever the latent
            value = torch.ones_like(value) if key.endswith("conv_y.bias") else torch.zeros_like(value)
        else:
            value = plain.state_dict()[key.replace(".norm_layer.", ".")]
        state[key] = value
    movq.load_state_dict(state, strict=True)
    codes = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(movq.decode(codes, 3, 4), plain.decode(codes, 3, 4), atol=1e-12)
        movq.decoder.norm_out.conv_b.weight.fill_(0.1)  # a shift predicted from the latent reaches the pixels
        assert not torch.allclose(movq.decode(codes, 3, 4), plain.decode(codes, 3, 4))


def authors_greedy_tokens(model: lumina.LuminaModel, prompt: lumina.LuminaPrompt, scale: float,
                          decay: bool = True) -> tuple[list[int], list[float]]:
    """Greedy decoding from the session's cond / uncond logits with the 2.0 authors' guidance, restated: before
    each token their CFG processor sets g = max(4, g * (1 - n / (h_latent * w_latent))), n = the tokens after
    begin-of-image so far (height and width tokens included, so n = position + 2; row-ends count too),
    h_latent = 2 * height / 32 (and so for w), g kept from one token to the next; a scale of 1 is left alone
    and switches CFG off.  Forced positions take their token (the guidance still moves there).
    Returns the tokens and the scale used at each position."""
    width, height = prompt.image_size
    latent = (2 * height // 32) * (2 * width // 32)
    session = model.start(prompt, batch_size=1)
    cond, uncond = session.prefill()
    g, tokens, scales = scale, [], []
    for position in range(model.num_tokens):
        if scale != 1.0 and decay:
            g = max(4.0, g * (1 - (position + 2) / latent))
        c, u = cond[0, -1].double(), uncond[0, -1].double()
        logits = c if scale == 1.0 else g * (c - u) + u
        token = model.forced_tokens.get(position, int(model.code_ids[int(logits.argmax())]))
        tokens.append(token)
        scales.append(g)
        cond, uncond = session.forward(torch.tensor([[token]]))
    return tokens, scales


def test_lumina2_guidance_follows_the_authors_schedule(model2: lumina.LuminaModel) -> None:
    """Greedy tokens (top-k 1) for scales 1, 3, 4 and 7.5 at 128 x 64 px (7.5 decays to 4 over 4 positions)."""
    try:
        model2.set_image_size(128, 64)
        prompt = model2.encode(PROMPT)
        got = {}
        for scale in (1.0, 3.0, 4.0, 7.5):
            config = SamplerConfig(coupler="maximal", window=8, seed=0, cfg_scale=scale, top_k=1)
            got[scale] = generate(model2, prompt, config).tokens[0].tolist()
            tokens, scales = authors_greedy_tokens(model2, prompt, scale)
            assert got[scale] == tokens, scale
            schedule = model2.cfg_schedule(scale)
            assert (schedule is None) == (scale == 1.0)
            if schedule is not None:  # the same scale at every position, not only where it changes a token
                assert torch.equal(schedule, torch.tensor(scales, dtype=torch.float32)), scale
        assert got[3.0] == got[4.0] != got[1.0]  # below 4 acts as 4
        assert got[7.5] != got[4.0] and got[7.5] != authors_greedy_tokens(model2, prompt, 7.5, decay=False)[0]
    finally:
        model2.set_image_size(RESOLUTION_2, RESOLUTION_2)
