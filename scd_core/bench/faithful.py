"""The faithful coupler by default: does a seed reproduce where rounding differs, and what do its calls cost?

    python -m scd_core.bench faithful --seeds 16   # both tables (the demo in bfloat16; calls on every model)

Reproducibility: in float32 faithful gives the window-1 (plain AR) tokens of a seed at every window, batch and
slot (tests/test_reproducible.py).  In bfloat16 the logits of one position can round differently in a call of
another width, and a draw that falls on such an edge picks another token (and the image goes its own way from
there).  The first table counts, over seeds, the images whose tokens differ in any position from window 1's at
windows 16, 32 and auto (real timing).

Calls: faithful against maximal and gumbel at windows 16 / 32 / 64 / auto, mean calls per image over the seeds,
on the demo (float32; auto from real timing), the three synthetic grids, the grid of the Janus-Pro-1B
stand-in (24 x 24 over 16384 codes, medium entropy: its calls are the stand-in's, whose backbone only adds
time) and the synthetic video (`bench video`'s, previous-frame drafts); the synthetic models' auto runs under
the stand-in's cost profile on this CPU (`auto.HERE`), as their own calls are nearly free.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

import torch

from ..windows import auto_window
from ..decoding.config import SamplerConfig
from ..windows.window_policies import AUTO_WINDOW
from ..decoding.engine import generate
from .auto import HERE, MEDIUM_SHARPNESS
from .nfe import SHARPNESS
from .synthetic import GridModel
from .synthetic_video import VideoGridModel
from .tables import markdown

REPRODUCED_WINDOWS: tuple = (16, 32, AUTO_WINDOW)
COUPLERS = ("faithful", "maximal", "gumbel")
STAND_IN_PROFILE = HERE["stand-in here (64 costs 4x)"]


def differing_rows(name: str, model: Any, cond: Any, seeds: Sequence[int], dtype: str) -> dict[str, Any]:
    """Share of seeds whose faithful tokens at each window differ in any position from window 1's."""
    differs = {window: 0 for window in REPRODUCED_WINDOWS}
    for seed in seeds:
        reference = generate(model, cond, SamplerConfig(window=1, seed=seed)).tokens
        for window in REPRODUCED_WINDOWS:
            tokens = generate(model, cond, SamplerConfig(window=window, seed=seed)).tokens
            differs[window] += not torch.equal(tokens, reference)
    row = {"model": name, "dtype": dtype, "images": len(seeds)}
    row.update({f"differ at {window}": f"{differs[window]}/{len(seeds)}" for window in REPRODUCED_WINDOWS})
    return row


def calls_rows(name: str, model: Any, cond: Any, seeds: Sequence[int], windows: Sequence[Any]) -> list[dict]:
    """Mean calls per image for each coupler at each window, and faithful's over maximal's."""
    rows = []
    for window in windows:
        calls = {coupler: statistics.fmean(generate(model, cond, SamplerConfig(coupler=coupler, window=window,
                                                                               seed=seed)).nfe for seed in seeds)
                 for coupler in COUPLERS}
        rows.append({"model": name, "window": window, **calls, "faithful / maximal": calls["faithful"] /
                     calls["maximal"]})
    return rows


def calls_models() -> list[tuple[str, Any, Any]]:
    """(name, model, cond) of the calls table: the demo, the three grids, the stand-in's grid, the synthetic
    video."""
    from ..models.loading import load_model

    demo = load_model("demo", "cpu", "float32")
    models = [("demo", demo, demo.encode("7"))]
    for entropy, sharpness in SHARPNESS:
        models.append((f"grid, {entropy} entropy", GridModel(sharpness=sharpness), None))
    models.append(("Janus-Pro-1B stand-in grid", GridModel(rows=24, cols=24, vocab_size=16384,
                                                            sharpness=MEDIUM_SHARPNESS), None))
    video = VideoGridModel()  # drafts from the previous frame, its default
    frames, rows, cols = video.grid
    models.append((f"synthetic video ({frames} x {rows} x {cols}, change {video.change})", video, None))
    for _, model, _ in models[1:]:
        auto_window.remember_costs(model, 1, STAND_IN_PROFILE)
    return models


def faithful_tables(seeds: Sequence[int], windows: Sequence[Any] = (16, 32, 64, AUTO_WINDOW)) -> str:
    from ..models.loading import load_model

    demo = load_model("demo", "cpu", "bfloat16")
    reproduced = [differing_rows("demo", demo, demo.encode("7"), seeds, "bfloat16")]
    columns = ("model", "dtype", "images", *(f"differ at {w}" for w in REPRODUCED_WINDOWS))
    calls = [row for name, model, cond in calls_models() for row in calls_rows(name, model, cond, seeds, windows)]
    return (f"**faithful in bfloat16**: images (seeds 0-{seeds[-1]}) whose tokens differ from window 1's in any "
            f"position\n\n{markdown(reproduced, columns)}\n\n"
            f"**calls per image** (mean over seeds 0-{seeds[-1]}; synthetic models' auto under the stand-in's "
            "cost profile)"
            f"\n\n{markdown(calls, ('model', 'window', *COUPLERS, 'faithful / maximal'))}")
