"""Candidates against SCD with maximal coupling, seed for seed: `python -m scd_core.bench candidates --seeds 30`.

The call counts of one image vary by +-10% between seeds, more than the effect measured, so every mode runs on
the same seeds and the table gives the mean of the per-seed reduction with its 95% interval (normal
approximation over seeds), next to the tokens each call feeds.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from .nfe import SHARPNESS
from .tables import markdown
from ..decoding.config import SamplerConfig
from ..decoding.engine import generate
from .synthetic import GridModel

MODES = (("SCD-maximal", {}), ("cand2", dict(candidates=2)), ("cand3", dict(candidates=3)),
         ("cand4", dict(candidates=4)))


def paired_rows(name: str, model: Any, cond: Any, window: int, seeds: Sequence[int], **sampling: Any) -> list[dict]:
    """One row per mode: mean calls, and the per-seed reduction against the first mode (SCD-maximal)."""
    runs = {label: [generate(model, cond, SamplerConfig(coupler="maximal", window=window, seed=seed,
                                                        **options, **sampling)) for seed in seeds]
            for label, options in MODES}
    base = [r.nfe for r in runs[MODES[0][0]]]
    rows = []
    for label, results in runs.items():
        saved = [1 - r.nfe / b for r, b in zip(results, base)]
        spread = 1.96 * statistics.stdev(saved) / len(saved) ** 0.5 if len(saved) > 1 else 0.0
        rows.append(dict(model=name, mode=label, calls=statistics.mean(r.nfe for r in results),
                         fewer_calls=f"{100 * statistics.mean(saved):.1f}% +- {100 * spread:.1f}",
                         fed_per_call=statistics.mean(sum(r.fed[1:]) / max(r.nfe - 1, 1) for r in results)))
    return rows


def candidate_table(seeds: Sequence[int], window: int = 32) -> str:
    from ..models.loading import load_model

    demo = load_model("demo")
    rows = paired_rows("demo", demo, demo.encode("7"), window, seeds)
    for name, sharpness in SHARPNESS:
        rows += paired_rows(f"grid, {name} entropy", GridModel(sharpness=sharpness), None, window, seeds,
                            draft_init="above")
    return (f"window {window}, maximal coupling, {len(seeds)} seeds; `fewer_calls`: mean per-seed reduction "
            "against SCD-maximal with its 95% interval\n\n"
            + markdown(rows, ("model", "mode", "calls", "fewer_calls", "fed_per_call")))
