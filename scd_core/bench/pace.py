"""Batches at a shared pace against batches whose rows each advance at their own pace.

    python -m scd_core.bench batches --model demo --sizes 1 4 16 --window 32 [--shape 1B]

At a shared pace every row of a batch moves by the smallest commit count among
them (what a cache with one length for the batch allows), so the calls a batch
needs grow with its size; at a per-row pace (the adapters' `RowCache`) each row
moves by its own, yet the batch still runs until its slowest row is done.  `regrouped`
is what the engine does with a session that can drop rows: once half the rows are
done the rest go on as a smaller batch, so finished rows stop costing work.
`pace_rows` measures calls per batch, the call at which each row completes, and
time per image on a real model; `row_cache_call_cost` measures one window call of the Janus adapter's
cache at a Janus-Pro shape with random weights, rows level or spread over a window.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Optional, Sequence, Union

import numpy
import torch

from ..decoding.config import SamplerConfig
from ..decoding.engine import generate

PACES = ("shared", "per-row", "regrouped")


class SharedPace:
    """`model` with every session's rows advancing together, by the slowest row's count."""

    def __init__(self, model: Any) -> None:
        self._model = model

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def start(self, cond: Any, batch_size: int) -> Any:
        session = self._model.start(cond, batch_size)
        session.rows_per_cache = batch_size
        return session


class _RecordingSession:
    def __init__(self, session: Any, recorder: "PaceRecorder", batch: int) -> None:
        self._session, self._recorder = session, recorder
        self._fed = torch.zeros(batch, dtype=torch.long)  # per row of the caller's batch
        self._rows = torch.arange(batch)  # the rows still in the session

    def __getattr__(self, name: str) -> Any:
        if name == "keep_rows":  # without it the engine keeps every row in the batch to the end
            if self._recorder.regroup:
                return self._keep_rows
            raise AttributeError(name)
        return getattr(self._session, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:  # e.g. SharedPace's rows_per_cache: it belongs to the session
            setattr(self._session, name, value)

    def forward(self, tokens: torch.Tensor) -> Any:
        self._fed[self._rows] += tokens.shape[1]
        self._recorder.rows_fed.append(tokens.shape[0])
        return self._session.forward(tokens)

    def rewind(self, n: Any) -> None:
        self._session.rewind(n)
        self._fed[self._rows] -= n.cpu() if isinstance(n, torch.Tensor) else n
        self._recorder.held.append(self._fed.tolist())

    def _keep_rows(self, index: torch.Tensor) -> None:
        self._session.keep_rows(index)
        self._rows = self._rows[index.cpu()]


class PaceRecorder:
    """`model`, recording how many image tokens each row of its last session holds after every call and
    how many rows each call fed; without `regroup` its sessions cannot drop finished rows."""

    def __init__(self, model: Any, regroup: bool = True) -> None:
        self._model, self.regroup = model, regroup
        self.held: list[list[int]] = []
        self.rows_fed: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def start(self, cond: Any, batch_size: int) -> _RecordingSession:
        self.held, self.rows_fed = [], []
        return _RecordingSession(self._model.start(cond, batch_size), self, batch_size)

    def finish_calls(self) -> list[int]:
        """The call (prefill = 1) after which each row was complete: it holds all but its last token."""
        last = self._model.num_tokens - 1
        return [2 + next(i for i, held in enumerate(self.held) if held[row] >= last)
                for row in range(len(self.held[0]))]


def pace_rows(model: Any, cond: Any, batches: Sequence[int], window: int, seeds: Sequence[int]) -> list[dict]:
    """Calls per batch and seconds per image, SCD with maximal coupling, for each batch size and pace.

    `calls_ratio` is calls per batch over the per-row calls of the first batch size;
    `row_calls` is the mean call at which a row completed (what an image would cost if
    a finished row's slot were refilled); `rows_per_call` the mean number of rows a call fed.
    """
    rows = []
    for batch in batches:
        for pace in PACES:
            recorder = PaceRecorder(model, regroup=pace == "regrouped")
            runner = SharedPace(recorder) if pace == "shared" else recorder
            runs, finished, fed = [], [], []
            for seed in seeds:
                runs.append(generate(runner, cond, SamplerConfig(coupler="maximal", window=window, seed=seed),
                                     batch_size=batch, sync_timing=True))
                finished += recorder.finish_calls()
                fed += recorder.rows_fed
            calls = statistics.mean(run.nfe for run in runs)
            rows.append(dict(batch=batch, pace=pace, calls=calls, speedup=model.num_tokens / calls,
                             row_calls=statistics.mean(finished), rows_per_call=statistics.mean(fed),
                             s_per_image=statistics.mean(run.total_s for run in runs) / batch))
    base = next(row["calls"] for row in rows if row["pace"] == "per-row")
    for row in rows:
        row["calls_ratio"] = row["calls"] / base
    return rows


def row_cache_call_cost(size: str, batches: Sequence[int], window: int,
                        device: Union[str, torch.device, None] = None, dtype: Union[str, torch.dtype, None] = None,
                        *, layers: int = 1, prefix: int = 64, repeats: int = 1) -> list[dict]:
    """Seconds of one window call (CFG double batch) through the Janus adapter's RowCache at a Janus-Pro shape.

    `shared`: every row holds `prefix` tokens; `per-row`: rows spread over one
    window below it.  `layers` of the backbone are built; `call_s` scales them
    to full depth and adds the image head once.
    """
    from .shapes import JANUS_SHAPES, _build_backbone, _sync
    from ..models.loading import pick_device, pick_dtype
    from ..models.families.janus import RowBackbone
    from ..models.sessions.row_cache import RowCache

    shape = JANUS_SHAPES[size]
    device = pick_device(device)
    dtype = pick_dtype(dtype, device)
    full_depth = shape["num_hidden_layers"]
    backbone, head = _build_backbone(shape, layers, device, dtype)
    generator = torch.Generator().manual_seed(0)
    rows = []
    with torch.no_grad():
        for batch in batches:
            count = 2 * batch
            embeds = (torch.randn(count, prefix + window, shape["hidden_size"], generator=generator) * 0.02)
            embeds = embeds.to(device, dtype)
            cache = RowCache(count, prefix + window, 0, device)
            run = RowBackbone(backbone, cache)
            run(embeds[:, :prefix])
            for pace in PACES[:2]:  # regrouped: per-row calls of fewer rows once rows are done
                if pace == "per-row":
                    cache.rewind(torch.arange(count, device=device) % window)
                body, tail = [], []
                for attempt in range(repeats + 1):  # the first call warms up kernels and allocator
                    _sync(device)
                    started = time.perf_counter()
                    hidden = run(embeds[:, prefix:])
                    _sync(device)
                    middle = time.perf_counter()
                    head(hidden)
                    _sync(device)
                    if attempt:
                        body.append(middle - started)
                        tail.append(time.perf_counter() - middle)
                    cache.rewind(window)
                seconds = statistics.median(body) * full_depth / layers + statistics.median(tail)
                rows.append(dict(batch=batch, pace=pace, call_s=seconds, layers=layers, full_layers=full_depth,
                                 prefix=prefix, device=str(device), dtype=str(dtype).replace("torch.", "")))
    return rows


def pace_tables(path: str, prompt: str, batches: Sequence[int], window: int, seeds: Sequence[int],
                shape: Optional[str], device: Optional[str], dtype: Optional[str]) -> str:
    """The README tables: the model's calls and time per image; with `shape`, the calls of a synthetic grid of
    Janus-Pro's 24 x 24 tokens and 16384 codes at medium entropy, and the time of its calls at that shape."""
    from .tables import markdown
    from .auto import MEDIUM_SHARPNESS
    from .shapes import JANUS_SHAPES
    from ..models.loading import load_model
    from .synthetic import GridModel

    if shape is not None and shape not in JANUS_SHAPES:
        raise ValueError(f"--batches measures the Janus adapter's cache: --shape must be one of "
                         f"{', '.join(JANUS_SHAPES)}, got {shape!r}")
    model = load_model(path, device=device, dtype=dtype)
    rows = pace_rows(model, model.encode(prompt), batches, window, seeds)
    columns = ("batch", "pace", "calls", "speedup", "calls_ratio", "row_calls", "rows_per_call")
    parts = [f"**{path}**, prompt {prompt!r}, SCD (maximal coupling), window {window}, {len(seeds)} seeds; "
             f"calls per batch of {model.num_tokens}-token images, calls_ratio against batch {batches[0]}\n\n"
             + markdown(rows, columns + ("s_per_image",))]
    if shape:
        rows = pace_rows(GridModel(24, 24, 16384, MEDIUM_SHARPNESS), None, batches, window, seeds)
        parts.append("**grid 24x24, 16384 codes, medium entropy** (Janus-Pro's image tokens; synthetic), the same "
                     "settings\n\n" + markdown(rows, columns))
        cost = row_cache_call_cost(shape, batches, window, device, dtype)
        per_row = sorted((row["batch"], row["call_s"]) for row in cost if row["pace"] == "per-row")
        by_pace = {(row["batch"], row["pace"]): row for row in cost}
        cost = []
        for row in rows:
            call = dict(by_pace[row["batch"], "per-row" if row["pace"] == "regrouped" else row["pace"]],
                        pace=row["pace"], calls=row["calls"], rows_per_call=row["rows_per_call"])
            if row["pace"] == "regrouped":  # fewer rows per call: the per-row cost at that many rows
                call["call_s"] = float(numpy.interp(row["rows_per_call"], *zip(*per_row)))
            call["s_per_image"] = call["call_s"] * call["calls"] / call["batch"]
            cost.append(call)
        first = cost[0]
        parts.append(f"**Janus-Pro-{shape}-shaped** backbone + image head, random weights: one {window}-token "
                     f"call of the adapter's per-row cache after a {first['prefix']}-token prefix, CFG double "
                     f"batch, {first['device']} {first['dtype']}, {first['layers']} of {first['full_layers']} "
                     f"layers timed and scaled to full depth (regrouped: interpolated between the batch sizes "
                     f"measured, at the mean rows per call); s_per_image uses the grid's calls\n\n"
                     + markdown(cost, ("batch", "pace", "rows_per_call", "call_s", "calls", "s_per_image")))
    return "\n\n".join(parts)
