"""`bench mammothmoda2`: its stand-in has MammothModa2's layout and law (forced EOL column, CFG 6 on raw logits
against an uncond row, top-k keeping at least 3), and its seconds follow from the published timings (Amdahl)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mammothmoda2_fixture import tiny_dev_dir, tiny_preview_dir  # noqa: F401  (fixtures, one per session)

from scd_core import SamplerConfig, generate, load_model
from scd_core.bench import cli as bench
from scd_core.bench import mammothmoda2 as mm_bench
from scd_core.bench.nfe import mean_entropy
from scd_core.decoding.sampler_options import resolved
from scd_core.decoding.sampling import to_probs

ROWS, COLS, CODES = 3, 4, 64


@pytest.fixture(scope="module")
def stand_in() -> mm_bench.MammothShapedModel:
    return mm_bench.MammothShapedModel(ROWS, COLS, codes=CODES)


def test_the_stand_in_forces_the_cells_the_family_forces(tiny_preview_dir: Path) -> None:
    model = load_model(tiny_preview_dir, device="cpu")
    for rows, cols in ((ROWS, COLS), (32, 32), (64, 64)):
        model.set_grid(rows, cols)
        shaped = mm_bench.MammothShapedModel(rows, cols, codes=CODES)
        assert (shaped.grid, shaped.num_tokens) == (model.grid, model.num_tokens)
        assert sorted(shaped.forced_tokens) == sorted(model.forced_tokens)
        assert set(shaped.forced_tokens.values()) == {CODES}  # the grid's "no neighbour" id: one EOL id
    assert model.default_cfg_scale == mm_bench.CFG_SCALE and model.min_tokens_kept == mm_bench.MIN_TOKENS_KEPT


def test_the_stand_in_samples_at_the_authors_law(stand_in: mm_bench.MammothShapedModel) -> None:
    """CFG 6 mixes a cond row with an uncond row of its own (not the cond row alone), then top-k keeping 3."""
    law = resolved(stand_in, SamplerConfig())
    assert (law.cfg_scale, law.top_k, law.temperature, law.top_p, law.keep_at_least) == (
        mm_bench.CFG_SCALE, mm_bench.TOP_K, mm_bench.TEMPERATURE, mm_bench.TOP_P, mm_bench.MIN_TOKENS_KEPT)
    tokens = generate(stand_in, None, SamplerConfig(window=1, seed=0)).tokens
    cond, uncond = stand_in.scores(tokens, torch.arange(stand_in.num_tokens)[None])
    assert uncond is not None and not torch.allclose(cond, uncond)
    guided = to_probs(cond, uncond, law)
    assert not torch.allclose(guided, to_probs(cond, None, law))
    expected = torch.softmax(uncond.float() + (cond.float() - uncond.float()) * mm_bench.CFG_SCALE, dim=-1)
    torch.testing.assert_close(guided, expected)  # top-k 2048 keeps all 64 codes here
    sampled = [p for p in range(stand_in.num_tokens) if p not in stand_in.forced_tokens]
    entropy = -(guided * guided.log()).sum(-1)[0, sampled].mean()  # the table's nats/token: the guided law's
    assert mean_entropy(stand_in, tokens, law) == pytest.approx(float(entropy), rel=1e-4)


def test_faithful_windows_give_the_ar_tokens_with_the_eols_in_place(stand_in: mm_bench.MammothShapedModel) -> None:
    ar = generate(stand_in, None, SamplerConfig(window=1, seed=3))
    wide = generate(stand_in, None, SamplerConfig(window=8, seed=3))
    assert torch.equal(ar.tokens, wide.tokens) and wide.nfe < ar.nfe == stand_in.num_tokens
    eol_columns = ar.tokens.view(ROWS, COLS + 1)[:, COLS]
    assert torch.equal(eol_columns, torch.full((ROWS,), CODES))


def test_seconds_and_end_to_end_speedups_follow_the_published_timings(
        stand_in: mm_bench.MammothShapedModel) -> None:
    step = 78.9 / 4161  # vLLM-Omni, A800: 78.9 s for 64 x 65 steps and the image end
    assert mm_bench.seconds(4160, 1, 1.0) == pytest.approx(4160 * step)
    assert mm_bench.seconds(100, 8, 1.5) == pytest.approx(150 * step)
    share_32 = mm_bench.seconds(32 * 33, 1, 1.0) / (mm_bench.seconds(32 * 33, 1, 1.0) + 17.2)
    assert share_32 == pytest.approx(0.538, abs=1e-3)  # about half at the authors' 32 x 32 grid
    rows = mm_bench.mammoth_rows(stand_in, [4], [0])
    ar_total = rows[0]["nfe"] * step + 17.2
    for row in rows:
        call = step * (1.0 if row["window"] == 1 else 1.5)
        assert row["ar_s"] == pytest.approx(row["nfe"] * step)
        assert row["ar_share"] == pytest.approx(row["ar_s"] / (row["ar_s"] + 17.2))
        assert row["e2e_speedup_1.5x"] == pytest.approx(ar_total / (row["nfe"] * call + 17.2))
    assert rows[0]["e2e_speedup_1x"] == 1 and all(row["e2e_speedup_1x"] > 1 for row in rows[1:])


def test_the_bench_command_writes_a_table_per_grid(capsys: pytest.CaptureFixture) -> None:
    bench.main(["mammothmoda2", "--grids", "2", "3", "--grids", "3", "2", "--windows", "4"])
    out = capsys.readouterr().out
    assert "**2 x 3 grid**: 2 rows of 3 codes, 2 EOLs forced (8 positions)" in out
    assert "**3 x 2 grid**: 3 rows of 2 codes, 3 EOLs forced (9 positions)" in out
    assert out.count("| faithful | 4 |") == 2
