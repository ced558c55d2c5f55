"""Images in the prompt: what kept cells cost.

    python -m scd_core.bench given --seeds 3

A continuation keeps the top half of an image and samples the rest; a region regeneration keeps every cell
outside a mask.  Kept cells are forced, never sampled, and a call is widened over them (`engine`), so their
cost should be nothing: calls in proportion to the sampled cells, not the image's.  For each model the table
gives mean calls per image, over the seeds, for the full image and for three jobs (the top half kept; a
centred square of a quarter of the cells sampled; the bottom-right quarter sampled), by AR, SJD, SCD with
maximal coupling and faithful (window 32), and each job's calls over the full
image's next to its share of sampled cells.  The demo's source images are its own samples, decoded to pixels
and encoded again (`encode_image`, the path a user's image takes); the grids' are their own samples.
"""

from __future__ import annotations

import statistics
from typing import Any, Optional, Sequence

import torch

from ..decoding.config import SamplerConfig
from ..decoding.engine import generate
from ..decoding.given import GivenCells, continuation, from_cell_mask
from .nfe import SHARPNESS
from .synthetic import GridModel
from .tables import markdown

WINDOW = 32
METHODS = (("AR", dict(coupler="independent", window=1)), ("SJD", dict(coupler="independent", window=WINDOW)),
           ("SCD-maximal", dict(coupler="maximal", window=WINDOW)),
           ("faithful", dict(coupler="faithful", window=WINDOW)))
JOBS = ("full image", "top half kept", "centre quarter sampled", "bottom-right quarter sampled")


def regenerated(job: str, rows: int, cols: int) -> Optional[torch.Tensor]:
    """The cells a job samples anew (1, rows, cols), or None for a continuation or the full image."""
    if job == "centre quarter sampled":
        region = torch.zeros(1, rows, cols, dtype=torch.bool)
        region[:, rows // 4:rows // 4 + rows // 2, cols // 4:cols // 4 + cols // 2] = True
        return region
    if job == "bottom-right quarter sampled":
        region = torch.zeros(1, rows, cols, dtype=torch.bool)
        region[:, rows // 2:, cols // 2:] = True
        return region
    return None


def job_cond(job: str, cond: Any, image: torch.Tensor, grid: tuple[int, int]) -> Any:
    if job == "full image":
        return cond
    if job == "top half kept":
        return GivenCells(cond, image, continuation(image, grid[0] // 2, grid))
    return GivenCells(cond, image, from_cell_mask(image, regenerated(job, *grid), grid))


def model_rows(name: str, model: Any, cond: Any, sources: Sequence[torch.Tensor], seeds: Sequence[int]
               ) -> list[dict]:
    rows, full = [], {}
    grid = tuple(model.grid)
    for job in JOBS:
        calls = {}
        for label, options in METHODS:
            calls[label] = statistics.fmean(
                generate(model, job_cond(job, cond, source, grid), SamplerConfig(seed=seed, **options)).nfe
                for source, seed in zip(sources, seeds))
        full = full or calls
        given = job_cond(job, cond, sources[0], grid)
        sampled = 1.0 if job == "full image" else float((~given.keep).float().mean())
        rows.append({"model": name, "job": job, "sampled cells": f"{sampled:.0%}", **calls,
                     "SCD-maximal / full": calls["SCD-maximal"] / full["SCD-maximal"],
                     "faithful / full": calls["faithful"] / full["faithful"]})
    return rows


def given_tables(seeds: Sequence[int]) -> str:
    from ..models.loading import load_model

    demo = load_model("demo", "cpu", "float32")
    cond = demo.encode("7")
    samples = [generate(demo, cond, SamplerConfig(seed=1000 + seed)).tokens for seed in seeds]
    demo_sources = [demo.encode_image(demo.decode(tokens)) for tokens in samples]
    rows = model_rows("demo (digit 7, images encoded from pixels)", demo, cond, demo_sources, seeds)
    grid = GridModel(sharpness=dict(SHARPNESS)["medium"])
    grid_sources = [generate(grid, None, SamplerConfig(seed=1000 + seed)).tokens for seed in seeds]
    rows += model_rows("synthetic grid (16 x 16, 1024 codes, medium entropy)", grid, None, grid_sources, seeds)
    columns = ["model", "job", "sampled cells"] + [label for label, _ in METHODS] + ["SCD-maximal / full",
                                                                                     "faithful / full"]
    return (f"Mean calls per image over {len(seeds)} seeds (window {WINDOW}; the prefill counts as a call). "
            "A job's calls over the full image's, next to its share of sampled cells:\n\n" + markdown(rows, columns))
