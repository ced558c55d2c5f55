"""Per-image seeds and continuous batching: a row's tokens depend on its own seed and conditioning only.

Row i of a batch with seed s samples what a batch of one samples with seed s + i (mod 2**64), for every
coupler, window and candidates setting, on toy models and on every family's tiny checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cosmos_fixture import context_frames, write_cosmos
from emu3_fixture import tiny_emu3_dir  # noqa: F401  (fixture, one checkpoint per session)
from llamagen_fixture import write_original_c2i
from lumina_fixture import tiny_lumina_dir  # noqa: F401
from toy_models import TablePrefixModel

from scd_core import SamplerConfig, generate, load_model
from scd_core.bench.synthetic import GridModel
from scd_core.config import MAX_SEED

# every coupler at two windows, and the options that draw on streams of their own
SETTINGS = [dict(coupler=coupler, window=window) for coupler in ("maximal", "gumbel", "independent", "faithful")
            for window in (1, 6)]
SETTINGS += [dict(coupler="maximal", window=6, candidates=2), dict(coupler="gumbel", window=4, candidates=3),
             dict(coupler="maximal", window=6, alpha=0.5), dict(coupler="gumbel", window=6, alpha=0.3),
             dict(coupler="independent", window=6, verification="block"),
             dict(coupler="independent", window=5, fixed_shapes=True),
             dict(coupler="maximal", window=6, draft_init="random")]
FAMILY_SETTINGS = [SETTINGS[i] for i in (1, 3, 5, 7, 8, 10, 12)]
WRAPPING = MAX_SEED - 1  # a batch of 4 from here uses seeds 2**64 - 2, 2**64 - 1, 0, 1


def assert_rows_are_their_own_seeds(model, cond, options: dict, seed: int, batch: int = 4) -> None:
    config = SamplerConfig(seed=seed, **options)
    batched = generate(model, cond, config, batch_size=batch)
    for row in range(batch):
        alone = generate(model, cond, SamplerConfig(seed=(seed + row) % 2**64, **options))
        assert torch.equal(batched.tokens[row:row + 1], alone.tokens), f"row {row}, {options}"
    assert len({tuple(row) for row in batched.tokens.tolist()}) > 1  # the rows are not one image repeated


@pytest.mark.parametrize("options", SETTINGS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_each_row_of_a_toy_batch_is_the_image_of_its_own_seed(options):
    table = TablePrefixModel(vocab_size=8, num_tokens=20, grid=(4, 5), table_rows=4096, scale=2.0, rows_per_cache=1)
    assert_rows_are_their_own_seeds(table, None, options, seed=WRAPPING)
    assert_rows_are_their_own_seeds(GridModel(rows=4, cols=6, vocab_size=32, sharpness=1.0), None, options, seed=9)


def test_a_batch_of_one_keeps_its_image_when_more_rows_follow():
    """Seed s alone, row 0 of a batch with seed s, and row 2 of a batch with seed s - 2 are one image."""
    model = GridModel(rows=4, cols=6, vocab_size=32)
    config = SamplerConfig(window=6, seed=1)
    alone = generate(model, None, config).tokens
    assert torch.equal(generate(model, None, config, batch_size=3).tokens[:1], alone)
    assert torch.equal(generate(model, None, SamplerConfig(window=6, seed=MAX_SEED), batch_size=3).tokens[2:], alone)


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory, tiny_janus_dir: Path, tiny_emu3_dir: Path,
             tiny_lumina_dir: Path) -> dict:
    """name -> (model, conditioning) for every family's tiny checkpoint, float64 where the family allows."""
    root = tmp_path_factory.mktemp("families")
    janus = load_model(tiny_janus_dir, device="cpu", dtype=torch.float64)
    emu3 = load_model(tiny_emu3_dir, device="cpu", dtype=torch.float64)
    emu3.set_resolution("4:3", 768)
    lumina = load_model(tiny_lumina_dir, device="cpu", dtype=torch.float64)
    llamagen = load_model(write_original_c2i(root / "llamagen"), "cpu", torch.float64)
    cosmos = load_model(write_cosmos(root, "4B"), "cpu", torch.float64)
    return {"janus": (janus, janus.encode("a red cube", negative_prompt="blurry")),
            "emu3": (emu3, emu3.encode("a red cube")),
            "lumina": (lumina, lumina.encode("a red cube")),
            "llamagen": (llamagen, llamagen.encode("3")),
            "cosmos": (cosmos, cosmos.encode_video(context_frames(1)))}


@pytest.mark.parametrize("family", ["janus", "emu3", "lumina", "llamagen", "cosmos"])
def test_each_row_of_a_family_batch_is_the_image_of_its_own_seed(families, family):
    model, cond = families[family]
    for options in FAMILY_SETTINGS:
        assert_rows_are_their_own_seeds(model, cond, options, seed=WRAPPING, batch=3)
