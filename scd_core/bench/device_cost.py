"""The device run's cost parts: what the window-invariant calls cost, and what the automatic window gains.

- `call_cost_rows`: one window call (the static row attention over the whole pre-sized cache, the Janus-Pro
  shape) at widths 1 / 8 / 32, today's calls against the tiles, run eagerly and replayed as CUDA graphs;
- `attention_cost_rows`: one attention call of a width-32 window at Emu3's attention shape against the key length
  (the cache's slots: what key-length buckets would save), tiled and as it comes;
- `prefill_rows`: a 4096-token prompt's prefill, today's calls against the tiles;
- `auto_rows` (issue 62): images at `window="auto"` against pinned widths 8 / 16 / 32 / 64 on the demo model and on
  a Janus-Pro-1B-shaped stand-in (`auto.ShapedGridModel`), seconds per image and calls.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Iterator

import torch

from ..compiled import cuda_graphs, invariant
from ..decoding.config import SamplerConfig
from ..decoding.engine import generate
from .device_compiled import _median_seconds, _ShapeCalls, static_capacity
from .device_kernels import TINY_ATTENTION, ATTENTION, TILE, attention_case
from .device_model import MODEL_WIDTHS, POLICIES, policy_calls

ATTENTION_KEYS, TINY_ATTENTION_KEYS = (640, 1024, 2400, 4096, 8254), (48, 80, 160)
PREFILL, TINY_PREFILL = 4096, 256
AUTO_PINNED, TINY_AUTO_PINNED = (8, 16, 32, 64), (16,)  # tiny: a demo image takes seconds on a CPU
AUTO_ROUNDS, TINY_AUTO_ROUNDS = 2, 1  # rounds of one image per window after the first automatic image


def call_cost_rows(shape: Any, model: Any, head: torch.nn.Module, device: torch.device, dtype: torch.dtype
                   ) -> list[dict[str, Any]]:
    """Milliseconds of one call per width, today's calls and the tiles, eager and as CUDA graphs."""
    context = shape.prefix + shape.grid[0] * shape.grid[1] // 2
    calls = _ShapeCalls(model, head, context, static_capacity(shape), device, dtype)
    run = calls.cache(static=True, layer=None)
    rows = []
    for width in MODEL_WIDTHS:
        row: dict[str, Any] = dict(width=width)
        for policy, tiled in POLICIES:
            step = calls.step(run)

            def call(width: int, step: Any = step, tiled: bool = tiled) -> tuple[torch.Tensor, ...]:
                with invariant.fixed_shape_calls(tiled, device):
                    return step(width)

            row[f"{policy}_eager_ms"] = 1000 * calls.timed(run, width, call)[0]
            if cuda_graphs.graphs_available(device):
                graphed = cuda_graphs.GraphedSteps(call, next(model.parameters()))
                row[f"{policy}_graphs_ms"] = 1000 * calls.timed(run, width, graphed)[0]
            else:
                row[f"{policy}_graphs_ms"] = f"not available on {device.type}"
        row["tiles_vs_today_eager"] = row["tiles_eager_ms"] / row["today's_eager_ms"]
        rows.append(row)
    return rows


def attention_cost_rows(device: torch.device, tiny: bool) -> list[dict[str, Any]]:
    """Milliseconds of one masked attention call (CFG rows, a width-32 window) against its key length."""
    size, rows = TINY_ATTENTION if tiny else ATTENTION, []
    for keys in TINY_ATTENTION_KEYS if tiny else ATTENTION_KEYS:
        query, key, value, mask = attention_case(device, tiny, keys)
        tiled = _median_seconds(lambda: invariant.tiled_attention(query, key, value, mask, rows=TILE), device)
        plain = _median_seconds(lambda: torch.nn.functional.scaled_dot_product_attention(query, key, value, mask),
                                device)
        rows.append(dict(keys=keys, shape=f"2 x {size['heads']} heads x {size['queries']} query rows x "
                         f"{size['head_dim']}", tiled_ms=1000 * tiled, as_it_comes_ms=1000 * plain))
    return rows


def prefill_rows(shape: Any, model: Any, head: torch.nn.Module, device: torch.device, tiny: bool
                 ) -> list[dict[str, Any]]:
    """Seconds of a PREFILL-token prompt's prefill (CFG rows), today's calls and the tiles."""
    from .device_check import ShapeModel

    long = dataclasses.replace(shape, prefix=TINY_PREFILL if tiny else PREFILL)
    network = ShapeModel(long, model, head)
    rows = []
    for policy, tiled in POLICIES:
        with policy_calls(tiled, device):
            seconds = _median_seconds(lambda: network.start(None, 1).prefill(), device, repeats=3)
        rows.append(dict(prompt_tokens=long.prefix, calls=policy, ms=1000 * seconds))
    rows[1]["vs_today"] = rows[1]["ms"] / rows[0]["ms"]
    return rows


def auto_rows(device: torch.device, tiny: bool) -> Iterator[list[dict[str, Any]]]:
    """Per model: the first automatic image (it times the widths), then rounds of one image per window seed for
    seed; seconds per image and calls by window.  The rows so far after each model."""
    from ..models.loading import load_model
    from .auto import ShapedGridModel

    demo = load_model("demo", device=device)
    models = (("demo", demo, demo.encode("7")),
              ("Janus-Pro-1B stand-in", ShapedGridModel(size="tiny" if tiny else "1B", layers=1 if tiny else 4,
                                                        device=str(device), side=8 if tiny else 24,
                                                        dtype=None if tiny else torch.bfloat16), None))
    rows: list[dict[str, Any]] = []
    pinned = TINY_AUTO_PINNED if tiny else AUTO_PINNED
    for name, model, cond in models:
        first = generate(model, cond, SamplerConfig(window="auto", seed=0), sync_timing=True)
        seconds: dict[str, list[float]] = {}
        calls: dict[str, list[int]] = {}
        for seed in range(1, 1 + (TINY_AUTO_ROUNDS if tiny else AUTO_ROUNDS)):
            for window in ("auto", *pinned):
                result = generate(model, cond, SamplerConfig(window=window, seed=seed), sync_timing=True)
                seconds.setdefault(str(window), []).append(result.total_s)
                calls.setdefault(str(window), []).append(result.nfe)
        best = min(pinned, key=lambda w: statistics.mean(seconds[str(w)]))
        for window, times in seconds.items():
            rows.append(dict(model=name, window=window, s_per_image=statistics.mean(times),
                             calls=statistics.mean(calls[window]),
                             vs_best_pinned=statistics.mean(times) / statistics.mean(seconds[str(best)]),
                             first_auto_s=first.total_s if window == "auto" else "-"))
        yield rows
