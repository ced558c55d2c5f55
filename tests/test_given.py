"""Given cells (continuation and region regeneration): exactly the AR law given the kept cells, at no call cost.

A `GivenCells` forces some positions of every row to given ids and samples the others.  The output law must be
AR sampling where each free position is drawn from p given everything before it (kept cells included) and each
kept position holds its id: exact enumeration below, for every coupler, with kept cells before the first free
one (a continuation), inside the window, after the last free one, on a sub-vocabulary with the model's own
row-ends, per row, with candidates and with the automatic window.  Kept cells cost no calls of their own.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_lossless import P_MIN, SAMPLES, chi_square_pvalue
from toy_models import TablePrefixModel

from scd_core import SamplerConfig, generate, generate_many
from scd_core.windows import auto_window
from scd_core.decoding import couplers
from scd_core.bench.synthetic import GridModel
from scd_core.decoding.given import GivenCells, continuation, from_cell_mask
from scd_core.decoding.run_settings import sampling_settings

BATCH = SAMPLES - SAMPLES % 6


def given_law(model: TablePrefixModel, kept: dict[int, int], config: SamplerConfig) -> dict:
    """The AR law with `kept` positions holding their ids: the model's law with them as forced tokens."""
    own = model.forced_tokens
    model.forced_tokens = {**(own or {}), **kept}
    try:
        return model.exact_law(**vars(sampling_settings(model, config)))  # as the engine resolves them
    finally:
        model.forced_tokens = own


def cells(num_tokens: int, kept: dict[int, int], rows: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.zeros(rows, num_tokens, dtype=torch.long)
    keep = torch.zeros(rows, num_tokens, dtype=torch.bool)
    for position, token in kept.items():
        tokens[:, position], keep[:, position] = token, True
    return tokens, keep


# (id, model kwargs, kept cells {position: id}, sampler kwargs, rows per shared cache)
CASES = [
    ("prefix-cfg-w3-above", dict(vocab_size=3, num_tokens=6, cfg=True, grid=(2, 3)), {0: 2, 1: 0, 2: 1},
     dict(window=3, cfg_scale=2.0, draft_init="above"), 2),
    ("inside-topk-topp-w4-random", dict(vocab_size=4, num_tokens=7), {1: 3, 4: 0, 5: 2},
     dict(window=4, top_k=3, top_p=0.85, draft_init="random"), 1),
    ("tail-temp-w2-left", dict(vocab_size=3, num_tokens=6, scale=1.5), {0: 1, 4: 2, 5: 0},
     dict(window=2, temperature=0.8, draft_init="left"), 3),
    # image codes are ids 7, 3, 5 and each grid row ends with the model's forced row-end 9 (kept there too)
    ("codes-rowend-cfg-topk-w4-above", dict(vocab_size=3, num_tokens=6, cfg=True, grid=(2, 3), code_ids=[7, 3, 5],
                                            forced_tokens={2: 9, 5: 9}), {0: 5, 2: 9, 4: 7},
     dict(window=4, cfg_scale=2.0, top_k=2, draft_init="above"), 2),
]


@pytest.mark.parametrize("coupler", couplers.NAMES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_given_cells_keep_the_ar_law(coupler, case):
    _, model_kwargs, kept, sampler_kwargs, rows_per_cache = case
    model = TablePrefixModel(seed=7, rows_per_cache=rows_per_cache, **model_kwargs)
    config = SamplerConfig(coupler=coupler, seed=7, **sampler_kwargs)
    given = GivenCells(None, *cells(model.num_tokens, kept))
    result = generate(model, given, config, batch_size=BATCH)
    assert chi_square_pvalue(result.tokens, given_law(model, kept, config)) > P_MIN


@pytest.mark.parametrize("coupler", couplers.names_where("candidates"))
def test_given_cells_with_candidates_keep_the_ar_law(coupler):
    """After the kept prefix, calls not widened over kept cells feed trees (a widened one feeds none)."""
    _, model_kwargs, kept, sampler_kwargs, rows_per_cache = CASES[0]
    model = TablePrefixModel(seed=7, rows_per_cache=rows_per_cache, **model_kwargs)
    config = SamplerConfig(coupler=coupler, seed=7, candidates=2, **{**sampler_kwargs, "window": 2})
    result = generate(model, GivenCells(None, *cells(model.num_tokens, kept)), config, batch_size=BATCH)
    assert any(fed > width for fed, width in zip(result.fed[1:], result.windows[1:]))  # trees were fed
    assert chi_square_pvalue(result.tokens, given_law(model, kept, config)) > P_MIN


@pytest.mark.parametrize("coupler", couplers.NAMES)
def test_each_row_keeps_its_own_cells(coupler):
    """Rows with different kept cells in one batch (and one shared cache of 2): each half has its own law."""
    model = TablePrefixModel(vocab_size=3, num_tokens=6, cfg=True, seed=3, rows_per_cache=2)
    config = SamplerConfig(coupler=coupler, seed=3, window=3, cfg_scale=1.5)
    first, second = {1: 2, 2: 0}, {0: 1, 3: 1, 4: 2, 5: 0}
    tokens, keep = (torch.cat(pair).repeat(BATCH // 2, 1) for pair in zip(cells(6, first), cells(6, second)))
    result = generate(model, GivenCells(None, tokens, keep), config, batch_size=BATCH)
    assert chi_square_pvalue(result.tokens[0::2], given_law(model, first, config)) > P_MIN
    assert chi_square_pvalue(result.tokens[1::2], given_law(model, second, config)) > P_MIN
    assert result.forced[-1] >= 0 and sum(result.forced) <= 4


@pytest.mark.parametrize("coupler", ["maximal", "faithful"])
def test_the_automatic_window_over_given_cells_keeps_the_ar_law(coupler, monkeypatch):
    monkeypatch.setattr(auto_window, "measure_costs", lambda call, widths: {1: 1.0, 2: 1.4, 4: 2.6})
    model = TablePrefixModel(vocab_size=3, num_tokens=7, cfg=True, grid=(1, 7), seed=5, rows_per_cache=2)
    config = SamplerConfig(coupler=coupler, seed=5, window="auto", cfg_scale=2.0, draft_init="above")
    kept = {2: 1, 3: 0, 6: 2}
    result = generate(model, GivenCells(None, *cells(7, kept)), config, batch_size=BATCH)
    assert chi_square_pvalue(result.tokens, given_law(model, kept, config)) > P_MIN


def test_the_enumeration_sees_a_kept_cell_sampled_instead():
    """The test can fail: a kept cell the engine ignored (sampled like the others) is far from the law."""
    model = TablePrefixModel(vocab_size=3, num_tokens=5, seed=2)
    config = SamplerConfig(coupler="maximal", seed=2, window=3)
    result = generate(model, GivenCells(None, *cells(5, {2: 1})), config, batch_size=BATCH)
    assert chi_square_pvalue(result.tokens, given_law(model, {2: 1}, config)) > P_MIN
    plain = generate(model, None, config, batch_size=BATCH).tokens
    plain[:, 2] = 1  # the id written over a sampled cell: the later cells saw another prefix
    assert chi_square_pvalue(plain, given_law(model, {2: 1}, config)) < 1e-6


# ----------------------------------------------------------------------------- same tokens at every width

GRID = GridModel(rows=8, cols=8, vocab_size=32, sharpness=1.0)


def image_of(seed: int) -> torch.Tensor:
    return generate(GRID, None, SamplerConfig(coupler="faithful", window=1, seed=seed)).tokens


@pytest.mark.parametrize("kind", ["continuation", "region"])
def test_faithful_gives_window_1s_tokens_at_every_width_and_keeps_the_cells(kind):
    image = image_of(11)
    if kind == "continuation":
        keep = continuation(image, 3, (8, 8))
    else:
        region = torch.zeros(1, 8, 8, dtype=torch.bool)
        region[:, 2:6, 3:7] = True
        keep = from_cell_mask(image, region, (8, 8))
    given = GivenCells(None, image, keep)
    ar = generate(GRID, given, SamplerConfig(coupler="faithful", window=1, seed=4), batch_size=3)
    assert torch.equal(ar.tokens[:, keep[0]], image[:, keep[0]].expand(3, -1))
    assert not torch.equal(ar.tokens[0], image[0])  # the free cells were sampled anew
    for window in (2, 5, 16, "auto"):
        result = generate(GRID, given, SamplerConfig(coupler="faithful", window=window, seed=4), batch_size=3)
        assert torch.equal(result.tokens, ar.tokens), window


def test_kept_cells_cost_no_calls():
    """Window 1 takes one call per free cell (the prefill's included): a kept top half halves the calls, a kept
    region costs nothing, and the result counts the forced tokens apart."""
    image = image_of(2)
    full = generate(GRID, None, SamplerConfig(window=1, seed=1))
    assert full.nfe == 64
    half = generate(GRID, GivenCells(None, image, continuation(image, 4, (8, 8))), SamplerConfig(window=1, seed=1))
    # the kept half is fed with the prefill, which yields the first free cell
    assert half.nfe == 32 and half.forced[0] == 32 and sum(half.committed) == 64
    region = torch.zeros(1, 8, 8, dtype=torch.bool)
    region[:, 4:8, 4:8] = True  # a quarter of the cells
    quarter = generate(GRID, GivenCells(None, image, from_cell_mask(image, region, (8, 8))),
                       SamplerConfig(window=1, seed=1))
    assert quarter.nfe <= 1 + 16 and sum(quarter.forced) == 48


# ----------------------------------------------------------------------------- batches and streams

def test_with_faithful_each_row_of_a_batch_is_its_own_seed_with_given_cells():
    image = image_of(5)
    region = torch.zeros(1, 8, 8, dtype=torch.bool)
    region[:, 1:7, 2:5] = True
    for keep in (continuation(image, 2, (8, 8)), from_cell_mask(image, region, (8, 8))):
        given = GivenCells(None, image, keep)
        for window in (6, "auto"):
            batched = generate(GRID, given, SamplerConfig(coupler="faithful", seed=9, window=window), batch_size=3)
            for row in range(3):
                alone = generate(GRID, given, SamplerConfig(coupler="faithful", seed=9 + row, window=window))
                assert torch.equal(batched.tokens[row:row + 1], alone.tokens), (row, window)


@pytest.mark.parametrize("options", [dict(window=4), dict(window=6, fixed_shapes=True), dict(window="auto")],
                         ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_a_stream_of_given_and_plain_jobs_gives_every_job_its_own_tokens(options):
    model = TablePrefixModel(vocab_size=8, num_tokens=20, grid=(4, 5), table_rows=4096, scale=2.0, rows_per_cache=1)
    image = generate(model, None, SamplerConfig(seed=1)).tokens
    region = torch.zeros(1, 4, 5, dtype=torch.bool)
    region[:, 1:3, 1:4] = True
    conds = [None, GivenCells(None, image, continuation(image, 2, (4, 5))),
             GivenCells(None, image, from_cell_mask(image, region, (4, 5)))]
    jobs = [(conds[index % 3], seed) for index, seed in enumerate((3, 7, 7, 0, 11, 2, 5, 9, 1))]
    config = SamplerConfig(coupler="faithful", **options)
    finished = 0
    for index, result in generate_many(model, jobs, config, slots=3, refill_at=1):
        cond, seed = jobs[index]
        alone = generate(model, cond, dataclasses.replace(config, seed=seed))
        assert torch.equal(result.tokens, alone.tokens), index
        assert sum(result.forced) == sum(alone.forced) == (0, 10, 14)[index % 3], index
        finished += 1
    assert finished == len(jobs)


def test_a_stream_refuses_given_cells_with_a_coupler_that_follows_the_widths():
    model = TablePrefixModel(vocab_size=8, num_tokens=20, grid=(4, 5), rows_per_cache=1)
    image = generate(model, None, SamplerConfig(seed=1)).tokens
    jobs = [(None, 0), (GivenCells(None, image, continuation(image, 2, (4, 5))), 1)]
    with pytest.raises(ValueError, match="job 1 has given cells, which a stream of jobs takes with the faithful"):
        list(generate_many(model, jobs, SamplerConfig(coupler="maximal", window=4), slots=2))


# ----------------------------------------------------------------------------- building and refusing

def test_continuation_and_cell_mask_build_the_keep_they_say():
    tokens = torch.arange(12).view(1, 12)
    assert continuation(tokens, 2, (3, 4)).tolist() == [[True] * 8 + [False] * 4]
    region = torch.tensor([[[False, True, False], [False, False, False], [True, False, False]]])
    keep = from_cell_mask(tokens, region, (3, 4))  # a 3 x 3 mask on a grid with a row-end column
    assert keep.view(3, 4).tolist() == [[True, False, True, False], [True, True, True, False],
                                        [False, True, True, False]]


@pytest.mark.parametrize("build, message", [
    (lambda: GivenCells(None, torch.zeros(1, 6), torch.zeros(1, 6, dtype=torch.bool)), "integer tensor"),
    (lambda: GivenCells(None, torch.zeros(1, 6, dtype=torch.long), torch.zeros(1, 5, dtype=torch.bool)),
     r"shape \(1, 5\) where tokens have \(1, 6\)"),
    (lambda: continuation(torch.zeros(1, 6, dtype=torch.long), 3, (2, 3)), r"0\.\.2"),
    (lambda: from_cell_mask(torch.zeros(1, 6, dtype=torch.long), torch.zeros(1, 3, 3, dtype=torch.bool), (2, 3)),
     "3 x 3 cells where the grid has 2 x 3"),
])
def test_bad_cells_are_refused_naming_the_sizes(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_cells_the_model_cannot_take_are_refused():
    model = TablePrefixModel(vocab_size=3, num_tokens=6, grid=(2, 3), code_ids=[7, 3, 5], forced_tokens={2: 9})
    config = SamplerConfig(window=2)
    with pytest.raises(ValueError, match="hold 5 tokens per row where the model generates 6"):
        generate(model, GivenCells(None, *cells(5, {0: 7})), config)
    with pytest.raises(ValueError, match="3 rows for a batch of 2"):
        generate(model, GivenCells(None, *cells(6, {0: 7}, rows=3)), config, batch_size=2)
    with pytest.raises(ValueError, match="id 4 at position 0 .* not one of the model's 3 image codes"):
        generate(model, GivenCells(None, *cells(6, {0: 4})), config)
    with pytest.raises(ValueError, match="id 7 at position 2 .* forces its own token 9"):
        generate(model, GivenCells(None, *cells(6, {2: 7})), config)


# ----------------------------------------------------------------------------- a kept prefix in the prefill

class WithoutPrefillTokens:
    """A session whose prefill feeds the prompt only: a kept prefix then rides in the first window call."""

    def __init__(self, session) -> None:
        self.session = session

    def prefill(self):
        return self.session.prefill()

    def __getattr__(self, name: str):
        return getattr(self.session, name)


def real_families(tiny_janus_dir, tmp_path) -> list:
    """(name, model, cond) of the demo (LlamaGen's session), Janus-Pro (text rows), Lumina-mGPT (row-end
    tokens, a sub-vocabulary of codes), MammothModa2 (forced row ends, routed experts) and GLM-Image (3-D M-RoPE
    positions)."""
    from lumina_fixture import RESOLUTION_1, write_tiny_lumina
    from mammothmoda2_fixture import write_tiny_mammothmoda2

    from scd_core import load_model

    families = [load_model("demo", "cpu", torch.float64), load_model(tiny_janus_dir, "cpu", torch.float64),
                load_model(write_tiny_lumina(tmp_path / f"Lumina-mGPT-7B-{RESOLUTION_1}"), "cpu", torch.float64),
                load_model(write_tiny_mammothmoda2(tmp_path / "mammothmoda2"), "cpu", torch.float64)]
    families[-1].set_grid(4, 5)
    try:
        from glm_image_fixture import HEIGHT, WIDTH, write_tiny_glm_image

        families.append(load_model(write_tiny_glm_image(tmp_path / "glm"), "cpu", torch.float64))
        families[-1].set_image_size(WIDTH, HEIGHT)
    except ImportError:  # GLM-Image needs transformers 5 and diffusers: the newest tier
        pass
    return [(model.family, model, model.encode("7" if model.family == "demo" else "a red fox")) for model in families]


def test_a_kept_prefix_fed_with_the_prefill_changes_no_token_and_saves_a_call(tiny_janus_dir, tmp_path,
                                                                              monkeypatch):
    for name, model, cond in real_families(tiny_janus_dir, tmp_path):
        start = model.start
        model.start(cond, 1)  # the conditioning's size (Lumina)
        image = generate(model, cond, SamplerConfig(window=8, seed=3)).tokens
        rows = model.grid[0]
        given = GivenCells(cond, image, continuation(image, rows // 2, tuple(model.grid)))
        config = SamplerConfig(window=4, seed=5)
        folded = generate(model, given, config)
        monkeypatch.setattr(model, "start", lambda *args, **kwargs: WithoutPrefillTokens(start(*args, **kwargs)))
        fed_apart = generate(model, given, config)
        monkeypatch.undo()
        assert torch.equal(folded.tokens, fed_apart.tokens), name
        assert folded.forced[0] == rows // 2 * model.grid[1] and fed_apart.forced[0] == 1, name
        assert folded.nfe < fed_apart.nfe, name
