"""MammothModa2's memory: the loader's estimate counts the DiT stage beside the LLM (or after it, when the LLM is
offloaded after the re-encode), and the rows at the published shapes give the 24 GB plan."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from mammothmoda2_fixture import tiny_dev_dir, tiny_preview_dir  # noqa: F401  (fixtures, one per session)

from scd_core.bench.shapes import MAMMOTH_DECODER_WEIGHTS, _mammoth_rows
from scd_core.models.families import mammothmoda2
from scd_core.models.loading import estimate_memory
from scd_core.models.weights.memory import (MemoryEstimate, checkpoint_shapes, estimate_from_shapes,
                                            fitting_precision, weight_files)

BF16, GIB = torch.bfloat16, 2**30
DECODER_PREFIXES = ("gen_transformer.", "gen_vae.", "gen_image_condition_refiner.")  # the published names
EDITING_ONLY = ("gen_transformer.ref_image_", "gen_transformer.image_index_embedding")  # never read for t2i


def test_peak_holds_the_decoder_beside_sampling_or_alone_once_offloaded() -> None:
    estimate = MemoryEstimate(block_weights=1000, other_weights=200, kv_channels=4, tokens=10, decoder_weights=500)
    sampling = (1000 + 200) * 2 + 4 * 10 * 2 * 2  # bf16 weights, then keys + values of 10 tokens, 2 rows
    assert estimate.peak_bytes("none", BF16, rows=2) == sampling + 500 * 2
    assert replace(estimate, offload=True).peak_bytes("none", BF16, rows=2) == sampling
    big_decoder = replace(estimate, decoder_weights=5000, offload=True)
    assert big_decoder.peak_bytes("none", BF16, rows=2) == 5000 * 2
    # int8 shrinks the LLM's layers only: the decoder stays at the compute dtype
    assert estimate.peak_bytes("int8", BF16, rows=2) == 1000 + 200 * 2 + 4 * 10 * 2 * 2 + 500 * 2


def test_the_fitting_precision_counts_the_decoder() -> None:
    estimate = MemoryEstimate(block_weights=1000, other_weights=0, kv_channels=0, tokens=0, decoder_weights=1000)
    free = int(3000 * 1.2)  # bf16 LLM (2000 bytes) + bf16 decoder (2000) do not fit; int8 (1000) + 2000 does
    assert fitting_precision(replace(estimate, decoder_weights=0), BF16, free, 2, ("none", "int8")) == "none"
    assert fitting_precision(estimate, BF16, free, 2, ("none", "int8")) == "int8"
    assert fitting_precision(replace(estimate, offload=True), BF16, free, 2, ("none", "int8")) == "none"


@pytest.mark.parametrize("variant", ("preview", "dev"))
def test_the_loaders_estimate_holds_the_llm_and_the_dit(variant: str, request: pytest.FixtureRequest) -> None:
    folder: Path = request.getfixturevalue(f"tiny_{variant}_dir")
    estimate = estimate_memory(folder)  # the loader node's path: the family's memory_estimate hook
    shapes = checkpoint_shapes(weight_files(folder))
    llm = estimate_from_shapes(shapes, mammothmoda2.UNUSED_WEIGHTS, mammothmoda2.CACHE_TOKENS)
    written = sum(math.prod(shape) for name, shape in shapes.items()
                  if name.startswith(DECODER_PREFIXES) and not name.startswith(EDITING_ONLY))
    assert estimate.decoder_weights == written > 0 and not estimate.offload
    assert replace(estimate, decoder_weights=0) == llm  # the LLM counted as every family's, the DiT apart
    assert estimate.peak_bytes("none", BF16, 2) == (llm.weight_bytes("none", BF16) + written * 2
                                                    + llm.cache_bytes(llm.tokens, 2, BF16))


@pytest.fixture(scope="module")
def published() -> dict[str, dict]:
    return {row["model"]: row for row in _mammoth_rows()}


def test_published_rows_match_the_published_sizes(published: dict[str, dict]) -> None:
    """Derived from the text models' shapes: Preview's LLM as published (vision tower aside) just under the 21.4 GiB
    vLLM-Omni loads with its vision tower; the DiT stage its 5.49 GiB; the KV caches 56 / 144 KiB a token a row."""
    preview, dev = published["MammothModa2-Preview + DiT"], published["MammothModa2-Dev + DiT"]
    assert MAMMOTH_DECODER_WEIGHTS * 2 / GIB == pytest.approx(5.49, abs=1e-6)
    assert preview["decoder_gib"] == dev["decoder_gib"] == pytest.approx(5.49, abs=1e-6)
    assert 19.5 < preview["published_bf16_gib"] - preview["decoder_gib"] < 21.4
    for row, per_token in ((preview, 28 * 2 * 4 * 128 * 2), (dev, 36 * 2 * 8 * 128 * 2)):
        assert row["tokens"] == 256 + 64 * 65
        assert row["kv_cache_gib"] == pytest.approx(per_token * row["tokens"] * 2 / GIB)


def test_the_24_gib_plan(published: dict[str, dict]) -> None:
    """On 24 GiB: int8 with both stages resident; bf16 for Preview once its LLM leaves after the re-encode, int8 for
    Dev; 20% over the peak for activations throughout."""
    choice = {name: row["24_gib"] for name, row in published.items()}
    assert choice == {"MammothModa2-Preview + DiT": "int8",
                      "MammothModa2-Preview + DiT, LLM offloaded after the re-encode": "bf16",
                      "MammothModa2-Dev + DiT": "int8",
                      "MammothModa2-Dev + DiT, LLM offloaded after the re-encode": "int8"}
    preview = published["MammothModa2-Preview + DiT"]
    resident_bf16 = preview["bf16_gib"] + preview["kv_cache_gib"] + preview["decoder_gib"]
    assert resident_bf16 * 1.2 > 24 and (preview["int8_gib"] + preview["kv_cache_gib"] + preview["decoder_gib"]) \
        * 1.2 <= 24
