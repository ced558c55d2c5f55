"""An image's bytes depend on its tokens alone: `generate` (the batch decoded together, on every CPU thread) and
`batch` (each image by itself) write the same PNG for a seed, and `decode` gives the same floats at one thread
or two and for a row alone or in a batch.  The demo's VQ decoder moved one pixel of seed 0 by one level between
the two paths before every decode ran each image alone on one thread (issue 61)."""

from __future__ import annotations

import json
from typing import Iterator

import numpy as np
import pytest
import torch
from PIL import Image

from scd_core import SamplerConfig, generate, load_model
from scd_core.frontends.cli import main

SEEDS = range(4)
SETTINGS = ["--model", "demo", "--device", "cpu", "--dtype", "float32"]


@pytest.fixture
def two_threads() -> Iterator[None]:
    """Two CPU threads, as `generate` runs on this project's 2-core machine (and more elsewhere)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_generate_and_batch_write_the_same_png_for_each_seed(two_threads, tmp_path, capsys):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"id": "seven", "prompt": "7"}) + "\n")
    assert main(["batch", str(jobs), *SETTINGS, "--seeds", ",".join(map(str, SEEDS)), "--out",
                 str(tmp_path / "out")]) == 0
    for seed in SEEDS:
        alone = tmp_path / f"generate-s{seed}.png"
        assert main(["generate", *SETTINGS, "--prompt", "7", "--seed", str(seed), "-o", str(alone)]) == 0
        assert alone.read_bytes() == (tmp_path / "out" / f"seven-s{seed}.png").read_bytes(), seed
    together = tmp_path / "together.png"  # a batch of four from seed 0, side by side: row i is seed i's image
    assert main(["generate", *SETTINGS, "--prompt", "7", "--batch-size", "4", "-o", str(together)]) == 0
    panels = np.split(np.asarray(Image.open(together)), len(SEEDS), axis=1)
    for seed, panel in zip(SEEDS, panels):
        assert np.array_equal(panel, np.asarray(Image.open(tmp_path / "out" / f"seven-s{seed}.png"))), seed
    capsys.readouterr()


def test_decode_gives_the_same_floats_at_any_thread_count_and_batch(two_threads):
    demo = load_model("demo", "cpu", "float32")
    tokens = generate(demo, demo.encode("7"), SamplerConfig(seed=0), batch_size=len(SEEDS)).tokens
    together = demo.decode(tokens)
    torch.set_num_threads(1)
    assert torch.equal(demo.decode(tokens), together)
    assert torch.equal(torch.cat([demo.decode(row) for row in tokens.split(1)]), together)
    assert torch.get_num_threads() == 1  # decoding left the caller's thread count as it found it
