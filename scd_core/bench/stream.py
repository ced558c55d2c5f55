"""A stream of jobs: one at a time, independent batches, and continuous batching side by side.

    python -m scd_core.bench stream --model demo --jobs 64 --slots 16 --window 32 [--shape 1B]

The jobs are `classes` prompts x (jobs / classes) consecutive seeds, so a batch of
`slots` rows with one prompt and seed s makes exactly the images of jobs s .. s +
slots - 1 (per-image seeds) and every mode makes the same images as far as the
batched forward gives each row the logits it gets alone: `same_images` counts the
jobs whose tokens equal batch 1's (matrix kernels can round a batch differently,
which moves a draw that falls on a rounding edge).
`calls` counts every model call, prefill calls included (`prefill_calls`: calls that
only prefill; `folded`: decoding calls that also prefilled joining jobs); `calls_ratio` is calls
over (jobs / slots) x the calls of one job alone, the fewest a batch of `slots`
could need if every row took as many calls as the mean job; `rows_per_call` is the
mean number of rows a decoding call feeds.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Optional, Sequence

import numpy
import torch

from ..jobs.batching import generate_many
from ..decoding.config import SamplerConfig
from ..decoding.engine import generate


class CallCounter:
    """`model`, counting its sessions' calls: prefills (admit included) and forwards, with the rows each fed."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.prefills: list[int] = []
        self.forwards: list[int] = []
        self.folded = 0  # calls that were both

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def start(self, cond: Any, batch_size: int) -> "_CountedSession":
        return _CountedSession(self._model.start(cond, batch_size), self, batch_size)


class _CountedSession:
    def __init__(self, session: Any, counter: CallCounter, batch: int) -> None:
        self.session, self._counter, self._batch = session, counter, batch

    def __getattr__(self, name: str) -> Any:
        if name == "admit" and not callable(getattr(self.session, "admit", None)):
            raise AttributeError(name)
        return getattr(self.session, name)

    def prefill(self) -> Any:
        self._counter.prefills.append(self._batch)
        return self.session.prefill()

    def admit(self, fresh: Sequence["_CountedSession"], tokens: Optional[torch.Tensor] = None) -> Any:
        """One call: a prefill, and with `tokens` also a decoding call of this session's rows."""
        self._counter.prefills.append(sum(other._batch for other in fresh))
        if tokens is not None:
            self._counter.folded += 1
            self._counter.forwards.append(tokens.shape[0])
        self._batch += sum(other._batch for other in fresh)
        return self.session.admit([other.session for other in fresh], tokens)

    def forward(self, tokens: torch.Tensor, *branches: int) -> Any:
        self._counter.forwards.append(tokens.shape[0])
        return self.session.forward(tokens, *branches)


def stream_rows(model: Any, prompts: Sequence[Any], jobs: int, slots: int, config: SamplerConfig,
                refills: Sequence[int]) -> list[dict]:
    """Calls and seconds per image for `jobs` jobs made one at a time, in independent batches of `slots`, and
    as one stream at `slots` slots for each `refill_at` in `refills`."""
    per_prompt = jobs // len(prompts)
    queue = [(cond, seed) for cond in prompts for seed in range(per_prompt)]
    counter = CallCounter(model)
    rows, images = [], {}

    def measure(mode: str, run: Any, refill: Optional[int] = None) -> None:
        counter.prefills, counter.forwards, counter.folded = [], [], 0
        started = time.perf_counter()
        tokens = run()
        seconds = time.perf_counter() - started
        images[mode, refill] = tokens
        calls = len(counter.prefills) + len(counter.forwards) - counter.folded
        rows.append(dict(mode=mode, slots=1 if mode == "batch 1" else slots, refill_at=refill or "", calls=calls,
                         calls_per_image=calls / len(queue),
                         prefill_calls=len(counter.prefills) - counter.folded, folded=counter.folded,
                         rows_per_call=statistics.mean(counter.forwards), s_per_image=seconds / len(queue)))

    def one_at_a_time() -> torch.Tensor:
        return torch.cat([generate(counter, cond, dataclasses.replace(config, seed=seed)).tokens
                          for cond, seed in queue])

    def batches() -> torch.Tensor:
        return torch.cat([generate(counter, cond, dataclasses.replace(config, seed=first),
                                   batch_size=min(slots, per_prompt - first)).tokens
                          for cond in prompts for first in range(0, per_prompt, slots)])

    def stream(refill: int) -> torch.Tensor:
        results = dict(generate_many(counter, queue, config, slots=slots, refill_at=refill))
        return torch.cat([results[index].tokens for index in range(len(queue))])

    measure("batch 1", one_at_a_time)
    one_job = rows[0]["calls_per_image"]
    measure(f"batches of {slots}", batches)
    for refill in refills:
        measure(f"{slots} slots", lambda: stream(refill), refill)
    reference = images["batch 1", None]
    for row, tokens in zip(rows, images.values()):
        row["calls_ratio"] = row["calls"] / (len(queue) / slots * one_job)
        row["same_images"] = int((tokens == reference).all(1).sum())
    return rows


COLUMNS = ("mode", "slots", "refill_at", "calls", "calls_per_image", "calls_ratio", "prefill_calls", "folded",
           "rows_per_call", "s_per_image", "same_images")


def stream_tables(path: str, jobs: int, slots: int, window: int, shape: Optional[str], device: Optional[str],
                  dtype: Optional[str]) -> str:
    """The README table: the model's stream; with `shape`, the calls of a synthetic grid of Janus-Pro's
    24 x 24 tokens and 16384 codes and the time of its calls at that shape (`pace.row_cache_call_cost`)."""
    from .auto import MEDIUM_SHARPNESS
    from .pace import row_cache_call_cost
    from .synthetic import GridModel
    from .tables import markdown
    from ..models.loading import load_model

    config = SamplerConfig(coupler="maximal", window=window)
    refills = sorted({1, max(1, slots // 4), max(1, slots // 2)})  # 1: generate_many's default
    model = load_model(path, device=device, dtype=dtype)
    classes = [str(label) for label in range(4)] if path == "demo" else ["a red cube on a wooden table"]
    rows = stream_rows(model, [model.encode(prompt) for prompt in classes], jobs, slots, config, refills)
    parts = [f"**{path}**, {jobs} jobs ({len(classes)} prompts x {jobs // len(classes)} seeds), SCD (maximal "
             f"coupling), window {window}, {model.num_tokens}-token images\n\n" + markdown(rows, COLUMNS)]
    if shape:
        grid = GridModel(24, 24, 16384, MEDIUM_SHARPNESS)
        rows = stream_rows(grid, [None], jobs, slots, config, refills)
        cost = row_cache_call_cost(shape, [1, 4, slots], window, device, dtype)
        per_row = sorted((row["batch"], row["call_s"]) for row in cost if row["pace"] == "per-row")
        for row in rows:
            # a prefill call reads the weights once like a window call: costed as a call of as many rows
            row["s_per_image"] = float(numpy.interp(row["rows_per_call"], *zip(*per_row))) * row["calls_per_image"]
        first = cost[0]
        parts.append(f"**grid 24x24, 16384 codes, medium entropy** (Janus-Pro's image tokens; synthetic), the same "
                     f"settings; s_per_image: the calls at the **Janus-Pro-{shape}** shape's per-row call cost "
                     f"(`--batches` table: {first['device']} {first['dtype']}, {first['layers']} of "
                     f"{first['full_layers']} layers scaled), interpolated at the mean rows per call, a prefill "
                     f"costed as a window call\n\n" + markdown(rows, COLUMNS))
    return "\n\n".join(parts)
