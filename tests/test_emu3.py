"""The Emu3-Gen adapter on a tiny random checkpoint written in the BAAI/Emu3-Gen-hf format."""

from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path

import pytest
import torch
from emu3_fixture import EOF, EOI, EOL, EOS, IMAGE_CODES, SPATIAL_FACTOR, VISUAL_TOKENS
from emu3_fixture import tiny_emu3_dir  # noqa: F401  (fixture, one checkpoint per session)
from pace import (assert_each_row_matches, assert_own_pace_gives_ar_tokens, staggered_logits, tree_logits,
                  window_and_stepwise_logits)

from scd_core import COUPLERS, ModelLoadError, SamplerConfig, TokenModel, generate, load_model
from scd_core.models.families import emu3
from scd_core.models.weights.hf_folders import dtype_keyword
from scd_core.models.weights.tokenizer_files import TextTokenizer

CPU = torch.device("cpu")
PROMPT = "a red cube on a wooden table"
RATIO, AREA = "4:3", 768  # a 3 x 4 code grid: 3 * (4 + 1) + 3 = 18 tokens, 24 x 32 px
ROWS, COLS, N = 3, 4, 18


def at_test_size(model: emu3.Emu3Model) -> emu3.Emu3Model:
    model.set_resolution(RATIO, AREA)
    return model


@pytest.fixture(scope="module")
def model32(tiny_emu3_dir: Path) -> emu3.Emu3Model:
    return at_test_size(load_model(tiny_emu3_dir, device="cpu", dtype="float32"))


@pytest.fixture(scope="module")
def model64(tiny_emu3_dir: Path) -> emu3.Emu3Model:
    return at_test_size(load_model(tiny_emu3_dir, device="cpu", dtype=torch.float64))


@pytest.fixture(scope="module")
def full64(tiny_emu3_dir: Path) -> torch.nn.Module:
    """transformers' own Emu3 with every lm_head row, loaded apart from load_model."""
    from transformers import Emu3ForConditionalGeneration

    return Emu3ForConditionalGeneration.from_pretrained(str(tiny_emu3_dir), **{dtype_keyword(): torch.float64}).eval()


def special_ids(folder: Path) -> dict[str, int]:
    tokenizer = TextTokenizer(folder)
    return {name: tokenizer.token_id(name) for name in (EOL, EOF, EOI, EOS)}


def test_loaded_model_describes_itself(tiny_emu3_dir: Path) -> None:
    model = load_model(tiny_emu3_dir, device="cpu")
    assert isinstance(model, TokenModel) and model.family == "emu3"
    assert (model.default_cfg_scale, model.default_top_k) == (3.0, 2048)
    # the authors' default: 720 x 720 px = 90 rows of (90 codes + row end) + 3 closing tokens
    assert (model.size, model.grid, model.num_tokens, model.image_shape) == ((90, 90), (90, 91), 8193, (720, 720))
    tokenizer = TextTokenizer(tiny_emu3_dir)
    assert model.code_ids.tolist() == [tokenizer.token_id(t) for t in VISUAL_TOKENS]
    assert model.vocab_size == IMAGE_CODES
    ids = special_ids(tiny_emu3_dir)
    model.set_resolution(RATIO, AREA)
    assert (model.size, model.grid, model.num_tokens) == ((ROWS, COLS), (ROWS, COLS + 1), N)
    assert model.forced_tokens == {4: ids[EOL], 9: ids[EOL], 14: ids[EOL], 15: ids[EOF], 16: ids[EOI], 17: ids[EOS]}


@pytest.mark.parametrize("saved", [{}, {"temperature": 0.7, "top_p": 0.9, "top_k": 5}],
                         ids=["as-written", "folder-sets-sampling"])
def test_default_sampling_law_is_the_authors_generate(tiny_emu3_dir: Path, tmp_path: Path, saved: dict) -> None:
    """Left at the model's values, the engine samples the law of BAAI's image_generation.py: generate with
    GenerationConfig(do_sample=True, top_k=2048) and CFG 3 as an UnbatchedClassifierFreeGuidanceLogitsProcessor
    (plus the allowed-token prefix), the rest from the folder's generation_config.json, then transformers' global
    defaults: transformers' own processors, built by generate, on the tiny model's own logits."""
    from sampling_law import assert_same_law, default_probs, processed_probs
    from transformers import (Emu3ForConditionalGeneration, GenerationConfig, LogitsProcessorList,
                              PrefixConstrainedLogitsProcessor, UnbatchedClassifierFreeGuidanceLogitsProcessor)

    folder = tiny_emu3_dir
    if saved:  # a folder whose generation_config.json sets sampling keys of its own
        folder = tmp_path / tiny_emu3_dir.name
        shutil.copytree(tiny_emu3_dir, folder)
        path = folder / "generation_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **saved}))
    model = at_test_size(load_model(folder, device="cpu", dtype="float32"))
    full = Emu3ForConditionalGeneration.from_pretrained(str(folder)).eval()
    prompt = model.encode(PROMPT)
    cond_ids, uncond_ids = torch.tensor([prompt.cond]), torch.tensor([prompt.uncond])
    with torch.no_grad():
        cond, uncond = (full(input_ids=ids).logits[:, -1] for ids in (cond_ids, uncond_ids))
    codes = model.code_ids.tolist()
    generation, _ = full._prepare_generation_config(GenerationConfig(do_sample=True, top_k=2048))
    if not hasattr(generation, "_eos_token_tensor"):  # transformers 4.x's processors read it; generate sets it
        full._prepare_special_tokens(generation)
    guidance = UnbatchedClassifierFreeGuidanceLogitsProcessor(3.0, full, unconditional_ids=uncond_ids)
    allowed = PrefixConstrainedLogitsProcessor(lambda batch_id, ids: codes, num_beams=1)
    authors = LogitsProcessorList([guidance, allowed])
    processors = full._get_logits_processor(generation_config=generation, input_ids_seq_length=cond_ids.shape[1],
                                            encoder_input_ids=cond_ids, prefix_allowed_tokens_fn=None,
                                            logits_processor=authors)
    with torch.no_grad():
        reference = processed_probs(processors, cond, cond_ids)[:, codes]
    assert_same_law(default_probs(model, cond[:, codes], uncond[:, codes]), reference)
    expected = (saved.get("temperature", 1.0), 2048, saved.get("top_p", 1.0))
    assert (model.default_temperature, model.default_top_k, model.default_top_p) == expected


@pytest.mark.parametrize("ratio, area", [("1:1", 518400), ("16:9", 518400), ("3:4", 262144), ("4:3", 768),
                                         ("21:9", 1000000)])
def test_grid_size_follows_emu3_processor(ratio: str, area: int) -> None:
    from transformers import Emu3Processor

    expected = Emu3Processor.calculate_generate_size(None, ratio, area, emu3.DOWNSAMPLE)
    assert emu3.grid_size(ratio, area) == expected


def test_bad_resolutions_are_refused(model32: emu3.Emu3Model) -> None:
    for ratio, area in (("square", 100), ("4:0", 100), ("1:1", 10), ("1:1", 0)):
        with pytest.raises(ValueError, match="ratio|image_area"):
            emu3.grid_size(ratio, area)
    try:
        model32.set_resolution("1:1", 512 * 512)  # 64 x 65 + 3 tokens exceed the tiny model's 512 positions
        with pytest.raises(ValueError, match="512 positions"):
            model32.start(model32.encode(PROMPT), 1)
    finally:
        model32.set_resolution(RATIO, AREA)


def test_a_prompt_keeps_the_size_it_was_encoded_for(model32: emu3.Emu3Model) -> None:
    """set_image_size picks width x height for the next encode; generate switches to the prompt's size."""
    try:
        model32.set_image_size(32, 24)  # 4 x 3 codes of 8 px
        wide = model32.encode(PROMPT)
        model32.set_image_size(16, 16)
        square = model32.encode(PROMPT)
        assert (wide.size, square.size) == ((3, 4), (2, 2))
        for prompt, (rows, cols) in ((wide, (3, 4)), (square, (2, 2))):
            result = generate(model32, prompt, SamplerConfig(window=4, seed=0))
            assert result.tokens.shape == (1, rows * (cols + 1) + 3)
            assert model32.decode(result.tokens).shape == (1, rows * 8, cols * 8, 3)
    finally:
        model32.set_resolution(RATIO, AREA)


def test_prompts_match_emu3_processor(model32: emu3.Emu3Model, tiny_emu3_dir: Path) -> None:
    """The cond prefix is what Emu3Processor builds for image generation; the uncond one carries the same prefix."""
    from transformers import AutoTokenizer, Emu3ImageProcessor, Emu3Processor

    processor = Emu3Processor(image_processor=Emu3ImageProcessor(), tokenizer=AutoTokenizer.from_pretrained(
        str(tiny_emu3_dir)))

    def reference(text: str) -> list[int]:
        inputs = processor(text=[text], return_for_image_generation=True, ratio=RATIO, image_area=AREA)
        return list(inputs["input_ids"][0])

    prompt = model32.encode(PROMPT)
    assert prompt.size == (ROWS, COLS)
    assert list(prompt.cond) == reference(PROMPT + emu3.QUALITY_SUFFIX)
    assert list(prompt.uncond) == reference(emu3.NEGATIVE_PROMPT)
    custom = model32.encode(PROMPT, negative_prompt="blurry", quality_suffix=False)
    assert (list(custom.cond), list(custom.uncond)) == (reference(PROMPT), reference("blurry"))


@pytest.mark.parametrize("coupler", COUPLERS)
def test_generate_and_decode_with_every_coupler(model32: emu3.Emu3Model, coupler: str) -> None:
    result = generate(model32, model32.encode(PROMPT), SamplerConfig(coupler=coupler, window=4, seed=3),
                      batch_size=2)
    assert result.tokens.shape == (2, N) and result.nfe <= N
    forced = torch.tensor(sorted(model32.forced_tokens))
    assert torch.equal(result.tokens[:, forced], torch.tensor([model32.forced_tokens[int(p)] for p in forced])
                       .expand(2, -1))
    free = torch.tensor([p for p in range(N) if p not in model32.forced_tokens])
    assert torch.isin(result.tokens[:, free], model32.code_ids).all()
    images = model32.decode(result.tokens)
    assert images.shape == (2, ROWS * SPATIAL_FACTOR, COLS * SPATIAL_FACTOR, 3) and images.dtype == torch.float32
    assert 0 <= float(images.min()) and float(images.max()) <= 1 and float(images.std()) > 0


def test_decode_is_transformers_decode_image_tokens(model32: emu3.Emu3Model) -> None:
    tokens = generate(model32, model32.encode(PROMPT), SamplerConfig(window=4, seed=1), batch_size=2).tokens
    reference = model32.module.model.decode_image_tokens(image_tokens=tokens, height=ROWS, width=COLS)
    expected = ((reference.float() + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1)
    torch.testing.assert_close(model32.decode(tokens), expected)
    partial = tokens.clone()
    partial[:, 7:] = 0  # a preview's not-yet-sampled tail: non-code ids decode as code 0
    assert model32.decode(partial).shape == expected.shape


def window_and_stepwise(model: emu3.Emu3Model, negative: str | None = None) -> tuple:
    """Logits of an 8-token window, then of the same tokens fed one at a time after a rewind."""
    pick = torch.randint(0, IMAGE_CODES, (2, 8), generator=torch.Generator().manual_seed(0))
    tokens = model.code_ids[pick]
    tokens[:, 4] = model.forced_tokens[4]  # a row end inside the window, as the engine feeds it
    return window_and_stepwise_logits(model, model.encode(PROMPT, negative), tokens)


def test_window_forward_equals_token_by_token(model32: emu3.Emu3Model, model64: emu3.Emu3Model) -> None:
    window, stepwise = window_and_stepwise(model32)
    for branch in (0, 1):
        assert window[branch].shape == (2, 8, IMAGE_CODES) and window[branch].dtype == torch.float32
        torch.testing.assert_close(window[branch], stepwise[branch], atol=1e-4, rtol=1e-4)
    window, stepwise = window_and_stepwise(model64, negative="blurry")
    for branch in (0, 1):
        assert float((window[branch] - stepwise[branch]).abs().max()) <= 1e-12


def test_logits_equal_transformers_forward_on_each_unpadded_prefix(model64: emu3.Emu3Model,
                                                                   full64: torch.nn.Module) -> None:
    """Cond and uncond rows (left-padded to one length) give transformers' own logits over the code ids (of a
    model loaded apart, with its whole lm_head: the loaded one keeps only the code rows)."""
    full = full64
    assert model64.module.lm_head.weight.shape[0] == IMAGE_CODES < full.lm_head.weight.shape[0]
    prompt = model64.encode(PROMPT, negative_prompt="blurry")
    assert len(prompt.cond) != len(prompt.uncond)
    tokens = model64.code_ids[torch.randint(0, IMAGE_CODES, (1, 5), generator=torch.Generator().manual_seed(2))]
    session = model64.start(prompt, batch_size=1)
    ours = [torch.cat(pair, dim=1) for pair in zip(session.prefill(), session.forward(tokens))]
    for branch, prefix in enumerate((prompt.cond, prompt.uncond)):
        ids = torch.cat([torch.tensor([prefix]), tokens], dim=1)
        with torch.no_grad():
            reference = full(input_ids=ids).logits[:, len(prefix) - 1:, model64.code_ids]
        assert float((ours[branch] - reference).abs().max()) <= 1e-10


def test_faithful_window_gives_the_autoregressive_tokens(model64: emu3.Emu3Model) -> None:
    prompt = model64.encode(PROMPT)
    for seed in (0, 1):
        ar = generate(model64, prompt, SamplerConfig(coupler="faithful", window=1, seed=seed), batch_size=2)
        jacobi = generate(model64, prompt, SamplerConfig(coupler="faithful", window=8, seed=seed), batch_size=2)
        assert ar.nfe == N and jacobi.nfe < N  # forced tokens are accepted as drafts
        assert torch.equal(ar.tokens, jacobi.tokens)


def test_cfg_changes_the_distribution(model32: emu3.Emu3Model) -> None:
    cond, uncond = model32.start(model32.encode(PROMPT), batch_size=1).prefill()
    assert float((cond - uncond).abs().max()) > 0.1
    prompt = model32.encode(PROMPT)
    tokens = {scale: generate(model32, prompt, SamplerConfig(coupler="faithful", window=1, cfg_scale=scale),
                              batch_size=4).tokens for scale in (1.0, 3.0)}
    assert not torch.equal(tokens[1.0], tokens[3.0])


@pytest.mark.parametrize("window", [1, 6])
def test_greedy_equals_transformers_generate(model64: emu3.Emu3Model, full64: torch.nn.Module, tiny_emu3_dir: Path,
                                            window: int) -> None:
    """top-k 1 gives the tokens of transformers' documented Emu3 image generation (CFG 3, allowed-token prefix)."""
    prompt = model64.encode(PROMPT)
    ids = special_ids(tiny_emu3_dir)
    codes = model64.code_ids.tolist()

    def allowed(batch_id: int, input_ids: torch.Tensor) -> list[int]:
        offset = input_ids.shape[0] - len(prompt.cond) + 1  # 1 for the first image token
        if offset % (COLS + 1) == 0 and offset <= ROWS * (COLS + 1):
            return [ids[EOL]]
        closing = {ROWS * (COLS + 1) + 1: EOF, ROWS * (COLS + 1) + 2: EOI, ROWS * (COLS + 1) + 3: EOS}
        return [ids[closing[offset]]] if offset in closing else codes

    out = full64.generate(torch.tensor([prompt.cond]), attention_mask=torch.ones(1, len(prompt.cond),
                                  dtype=torch.long), max_new_tokens=N, do_sample=False,
                                  prefix_allowed_tokens_fn=allowed, guidance_scale=3.0,
                                  negative_prompt_ids=torch.tensor([prompt.uncond]),
                                  negative_prompt_attention_mask=torch.ones(1, len(prompt.uncond), dtype=torch.long))
    expected = out[:, len(prompt.cond):]
    for coupler in ("faithful", "maximal"):
        ours = generate(model64, prompt, SamplerConfig(coupler=coupler, window=window, top_k=1, seed=5))
        assert torch.equal(ours.tokens, expected)


def test_kv_cache_is_allocated_once_and_rewound_in_place(model32: emu3.Emu3Model) -> None:
    session = model32.start(model32.encode(PROMPT), 2)
    session.prefill()
    rows = session.cache
    prefix = rows.prefix
    keys = rows.keys[0]
    assert keys.shape[0] == 4 and keys.shape[2] == prefix + N  # cond + uncond rows, sized once for the image
    session.forward(model32.code_ids[:10].view(2, 5))
    session.rewind(torch.tensor([4, 1]))
    session.forward(model32.code_ids[10:20].view(2, 5))
    assert rows.keys[0] is keys and rows.lengths.tolist() == [prefix + 6, prefix + 9] * 2
    with pytest.raises(ValueError, match="rewind"):
        session.rewind(torch.tensor([7, 0]))  # sample 0 holds 6 image tokens


@pytest.mark.parametrize("negative", [None, "blurry"])
def test_rows_at_different_positions_give_each_rows_sequential_logits(model64: emu3.Emu3Model,
                                                                       negative: str | None) -> None:
    """Samples at different lengths in one call, over slots they rejected; cond or uncond rows left-padded."""
    tokens = model64.code_ids[torch.randint(0, IMAGE_CODES, (3, 16), generator=torch.Generator().manual_seed(2))]
    calls = [(tokens[:, :6], [5, 2, 0]), (tokens[:, 6:10], [2, 5, 3]), (tokens[:, 10:13], [0, 0, 1], [2, 0]),
             (tokens[[2, 0], 13:16], [0, 0])]  # row 1 finished: the session drops it
    assert_each_row_matches(staggered_logits(model64, model64.encode(PROMPT, negative), calls), 1e-12)


def test_tree_of_chains_gives_each_chains_sequential_logits(model64: emu3.Emu3Model) -> None:
    """Candidates at the first draft: every chain of a tree call, and the call after keeping one chain per row."""
    ids = model64.code_ids[torch.randint(0, IMAGE_CODES, (2, model64.num_tokens + 5),
                                         generator=torch.Generator().manual_seed(4))]
    assert_each_row_matches(tree_logits(model64, model64.encode(PROMPT), ids), 1e-10)


def test_faithful_rows_at_their_own_pace_give_the_window_1_and_batch_1_tokens(model64: emu3.Emu3Model) -> None:
    # seed 2: the three rows finish at different calls with transformers 4.52 and 5.x alike
    assert_own_pace_gives_ar_tokens(model64, model64.encode(PROMPT), seed=2)


def test_bad_arguments_raise_value_errors(model32: emu3.Emu3Model) -> None:
    with pytest.raises(ValueError, match="prompt"):
        model32.encode(42)
    with pytest.raises(ValueError, match="batch_size"):
        model32.start(model32.encode(PROMPT), 0)
    with pytest.raises(ValueError, match=r"cond must come from Emu3Model\.encode\(\), got str"):
        model32.start(PROMPT, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exceed the model's 512 positions: use a shorter prompt or a smaller"):
        model32.start(model32.encode(" ".join(["word"] * 600)), 1)
    with pytest.raises(ValueError, match=rf"\(batch, {N}\)"):
        model32.decode(torch.zeros(1, N - 1, dtype=torch.long))
    session = model32.start(model32.encode(PROMPT), 1)
    session.prefill()
    session.forward(model32.code_ids[:3].unsqueeze(0))
    with pytest.raises(ValueError, match="rewind"):
        session.rewind(4)


# ---- folders that must be refused with a clear ModelLoadError ----

def copy_of(tiny_emu3_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_emu3_dir, tmp_path / "model"))


def edit_config(folder: Path, **changes: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def test_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no config.json"):
        emu3.load(tmp_path, CPU, torch.float32)
    with pytest.raises(ModelLoadError, match="Emu3-Gen"):
        load_model(tmp_path)


def test_wrong_model_type(tiny_emu3_dir: Path, tmp_path: Path) -> None:
    folder = copy_of(tiny_emu3_dir, tmp_path)
    edit_config(folder, model_type="llama")
    assert not emu3.detect(folder)
    with pytest.raises(ModelLoadError, match="model_type 'llama'"):
        emu3.load(folder, CPU, torch.float32)


def test_original_baai_layout_points_to_hf_format(tmp_path: Path) -> None:
    config = {"model_type": "Emu3", "architectures": ["Emu3ForCausalLM"],
              "auto_map": {"AutoModelForCausalLM": "modeling_emu3.Emu3ForCausalLM"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model-00001-of-00007.safetensors").write_bytes(b"not opened")
    assert emu3.detect(tmp_path)
    with pytest.raises(ModelLoadError, match="BAAI/Emu3-Gen-hf"):
        load_model(tmp_path, device="cpu")




def test_vocabulary_map_without_visual_tokens(tiny_emu3_dir: Path, tmp_path: Path) -> None:
    folder = copy_of(tiny_emu3_dir, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    edit_config(folder, vocabulary_map={k: v for k, v in config["vocabulary_map"].items() if k != VISUAL_TOKENS[7]})
    with pytest.raises(ModelLoadError, match=r"config.json: vocabulary_map lacks the visual token .*000007"):
        load_model(folder, device="cpu")


def test_null_codebook_size_means_the_default(tiny_emu3_dir: Path, tmp_path: Path) -> None:
    folder = copy_of(tiny_emu3_dir, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    edit_config(folder, vq_config={**config["vq_config"], "codebook_size": None})
    # the default 32768 codes, more than the tiny vocabulary_map lists
    with pytest.raises(ModelLoadError, match=r"lacks the visual token .*\|> of a 32768-code VQ"):
        load_model(folder, device="cpu")
    edit_config(folder, vq_config={**config["vq_config"], "codebook_size": "many"})
    with pytest.raises(ModelLoadError, match="vq_config.codebook_size must be a positive integer"):
        load_model(folder, device="cpu")


def test_missing_shard(tiny_emu3_dir: Path, tmp_path: Path) -> None:  # a truncated one: test_bad_folders.py
    folder = copy_of(tiny_emu3_dir, tmp_path)
    shard = folder / "model-00002-of-00002.safetensors"
    shard.unlink()
    with pytest.raises(ModelLoadError, match="lacks weight shards model-00002-of-00002.safetensors"):
        load_model(folder, device="cpu")




def test_mismatched_weights_leave_nothing_loaded(tiny_emu3_dir: Path, tmp_path: Path) -> None:
    from transformers import Emu3ForConditionalGeneration

    def live() -> int:
        gc.collect()
        return sum(type(obj) is Emu3ForConditionalGeneration for obj in gc.get_objects())

    folder = copy_of(tiny_emu3_dir, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    edit_config(folder, text_config=dict(config["text_config"], num_hidden_layers=3))  # weights hold 2 layers
    before = live()
    with pytest.raises(ModelLoadError, match="do not match"):
        load_model(folder, device="cpu")
    assert live() == before


# ---- the long-sequence benchmark ----

def test_long_benchmark_rows_and_memory() -> None:
    from scd_core.bench.long import kv_cache_bytes, long_benchmark

    rows, memory = long_benchmark(device="cpu", window=8, positions=(1, 40), hidden=32, layers=1,
                                  image_area=64 * 64)  # 8 x 8 codes: 8 * 9 + 3 = 75 tokens
    assert memory["tokens"] == 75 and memory["positions"] == 75 + 40  # the 40-token prompt plus the image
    assert [(row["method"], row["position"]) for row in rows] == [("AR", 1), ("AR", 40), ("SCD-maximal", 1),
                                                                 ("SCD-maximal", 40)]
    assert rows[0]["nfe"] == 75 and rows[2]["nfe"] < 75
    assert all(row["calls"] >= 1 and row["forward_ms"] > 0 and row["sample_ms"] > 0 for row in rows)
    # Emu3-Gen 8B, bfloat16, CFG: 2 x 32 layers x 2 rows x 8 KV heads x 128 x positions x 2 bytes
    assert kv_cache_bytes(32, 8, 128, 8233, rows=2, dtype_bytes=2) == 2 * 32 * 2 * 8 * 128 * 8233 * 2
