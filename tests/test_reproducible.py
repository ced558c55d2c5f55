"""With the faithful coupler a seed decides the image: the demo model (float32, CPU) gives the plain-AR tokens of
seed s, bit for bit, at windows 16 and 32 and at the automatic window (real timing, and a cost profile that makes
it pick other widths), in row i of a batch with seed s - i, in any slot of `generate_many`, on a Ray worker and
in a resumed `batch` run.  Each check compares every token, so one token moved fails it; the maximal coupler
failing the same check shows it has the power to.  (That faithful's tokens follow the AR law is the chi-square
suite's job: tests/test_lossless.py runs it for every coupler.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from ray_sandbox import run_sandboxed

from scd_core import SamplerConfig, generate, generate_many, load_model
from scd_core.windows.auto_window import remember_costs
from scd_core.frontends.batch_job import png_bytes
from scd_core.frontends.cli import main
from scd_core.frontends.cli_shared import to_pil

REPO = Path(__file__).resolve().parents[1]
PROMPT = "7"
SEEDS = range(3)
WAIT_S = 300


@pytest.fixture(scope="module")
def demo():
    return load_model("demo", "cpu", "float32")


@pytest.fixture(scope="module")
def ar(demo) -> dict[int, torch.Tensor]:
    """The plain autoregressive tokens (window 1) of each seed."""
    cond = demo.encode(PROMPT)
    return {seed: generate(demo, cond, SamplerConfig(window=1, seed=seed)).tokens for seed in SEEDS}


def faithful(window: int | str, seed: int) -> SamplerConfig:
    return SamplerConfig(coupler="faithful", window=window, seed=seed)


def test_the_default_coupler_is_faithful():
    assert SamplerConfig().coupler == "faithful"


def test_every_window_gives_the_ar_tokens_of_the_seed(demo, ar):
    cond = demo.encode(PROMPT)
    for seed in (0, 2):
        for window in (16, 32, "auto"):  # auto: costs timed and learned in this process
            result = generate(demo, cond, faithful(window, seed))
            assert torch.equal(result.tokens, ar[seed]), (window, seed)
            assert result.nfe < ar[seed].shape[1] / 2
    maximal = generate(demo, cond, SamplerConfig(coupler="maximal", window=16, seed=0)).tokens
    assert not torch.equal(maximal, ar[0])  # the check can fail: maximal's tokens follow the widths


def test_the_automatic_window_at_other_widths_keeps_the_tokens(demo, ar):
    """Costs that grow steeply with the width drive auto to narrow calls; the image stays the seed's."""
    model = load_model("demo", "cpu", "float32")  # a model of its own: remember_costs is per model
    remember_costs(model, 1, {width: float(width) ** 2 for width in (1, 2, 4, 8, 16, 32, 64)})
    result = generate(model, model.encode(PROMPT), faithful("auto", 1))
    assert max(result.windows) <= 4 and result.nfe > 70
    assert torch.equal(result.tokens, ar[1])


def test_row_i_of_a_batch_is_the_image_of_seed_s_plus_i(demo, ar):
    cond = demo.encode(PROMPT)
    for window, first, size in ((16, 0, 3), ("auto", 1, 2)):
        tokens = generate(demo, cond, faithful(window, first), batch_size=size).tokens
        for row in range(size):
            assert torch.equal(tokens[row:row + 1], ar[first + row]), (window, row)


def test_every_slot_of_generate_many_gives_the_image_of_its_seed(demo, ar):
    seven, three = demo.encode(PROMPT), demo.encode("3")
    order = [2, 0, 1]  # with a job of another prompt between them: other neighbours in every slot
    for window, slots in ((32, 2), ("auto", 3)):
        jobs = [(seven, order[0]), (three, 5), *[(seven, seed) for seed in order[1:]]]
        results = dict(generate_many(demo, jobs, faithful(window, 0), slots=slots))
        assert sorted(results) == list(range(len(jobs)))
        for index, (cond, seed) in enumerate(jobs):
            if cond is seven:
                assert torch.equal(results[index].tokens, ar[seed]), (window, slots, seed)


def test_the_cli_states_the_promise_and_keeps_it(demo, ar, tmp_path, capsys):
    output = tmp_path / "seven.png"
    code = main(["generate", "--model", "demo", "--prompt", PROMPT, "--device", "cpu", "--dtype", "float32",
                 "--window", "auto", "--seed", "2", "-o", str(output)])
    first = capsys.readouterr().out.splitlines()[0]
    assert code == 0 and first.startswith("SCD-faithful: coupler faithful, window auto (")
    assert first.endswith("- the plain-AR image of seed 2 at any window, batch, worker or resume")
    assert np.array_equal(np.asarray(Image.open(output)), np.asarray(to_pil(demo.decode(ar[2]))))


def write_jobs(folder: Path) -> Path:
    path = folder / "jobs.jsonl"
    path.write_text(json.dumps({"id": "seven", "prompt": PROMPT}) + "\n")
    return path


def assert_ar_images(demo, ar, out: Path, seeds) -> None:
    for seed in seeds:
        assert (out / f"seven-s{seed}.png").read_bytes() == png_bytes(demo, ar[seed]), seed


def test_a_resumed_batch_run_makes_the_images_of_the_seeds(demo, ar, tmp_path, capsys):
    jobs, out = write_jobs(tmp_path), tmp_path / "out"
    settings = ["batch", str(jobs), "--model", "demo", "--device", "cpu", "--dtype", "float32", "--window", "auto",
                "--slots", "2", "--out", str(out)]
    assert main([*settings, "--seeds", "0,2"]) == 0
    (out / "seven-s2.png").unlink()  # lost: made again, next to other neighbours and costs
    assert main([*settings, "--seeds", "0,1,2"]) == 0
    assert "2 images made, 1 already in place, 0 failed" in capsys.readouterr().out
    assert_ar_images(demo, ar, out, SEEDS)


def test_a_ray_worker_makes_the_images_of_the_seeds(demo, ar, tmp_path):
    """`batch --ray` on a real local cluster (inside a network namespace with only loopback, as in test_batch)."""
    jobs, out = write_jobs(tmp_path), tmp_path / "out"
    run = run_sandboxed([sys.executable, "-m", "scd_core", "batch", str(jobs), "--model", "demo", "--device", "cpu",
                         "--dtype", "float32", "--window", "auto", "--seeds", "0,2", "--ray", "local", "--workers",
                         "1", "--out", str(out)], REPO, WAIT_S)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    assert "2 images made" in run.stdout
    assert_ar_images(demo, ar, out, (0, 2))
