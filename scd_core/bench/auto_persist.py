"""The automatic window across processes: fresh processes on the demo sharing one saved-costs file.

`python -m scd_core.bench auto-persist` starts `processes` fresh interpreters one after the other on the demo,
all keeping the automatic window's costs in one new file (`scd_core.window_memory`, $SCD_WINDOW_COSTS): the first
starts from a cold cache (a timed pass), each later one from what the ones before it saved.  Each process makes,
for seeds 0 .. images - 1, an automatic image and then one at each pinned window, seed for seed (so load from
elsewhere falls on all windows alike); its first image is the automatic image of seed 0.  One process (the second
by default, the first that starts from saved costs) runs its first automatic image under a burst of load (a
busy loop started with it): the costs it learns there are what the next processes start from.

Per process: the calls of its first image and of all its automatic images over those of the best pinned window
(the pinned window with the least time per image in that process) on the same seeds, and the same for time.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from .. import auto_window, window_memory
from ..config import SamplerConfig
from ..engine import generate
from .auto import BURST_S, PINNED, bench_model, busy_loop, fastest_pinned
from .tables import markdown

TARGET = 1.15  # every process within this of the best pinned window from its first image on (a cold first excepted)
COLUMNS = ("process", "burst", "timed_passes", "first_widths", "best_pinned", "first_calls_vs_best",
           "calls_vs_best", "first_s_vs_best", "auto_s_vs_best", "widths")


def one_process(images: int, burst: bool) -> dict[str, Any]:
    """One fresh process: per seed, an automatic image, then one at each pinned window; the first automatic image
    under a burst of load when `burst`."""
    torch.set_grad_enabled(False)
    model, cond = bench_model("demo", 0, 0)
    timed = []
    measure = auto_window.measure_costs
    auto_window.measure_costs = lambda call, widths: timed.append(widths) or measure(call, widths)
    seconds: dict[str, list[float]] = {str(w): [] for w in ("auto",) + PINNED}
    calls: dict[str, list[int]] = {window: [] for window in seconds}
    used: list[list[int]] = []
    for seed in range(images):
        for window in ("auto",) + PINNED:
            loop = busy_loop(BURST_S) if burst and seed == 0 and window == "auto" else None
            result = generate(model, cond, SamplerConfig(window=window, seed=seed))
            if loop is not None:
                loop.wait()  # the pinned images of seed 0 come after the burst
            seconds[str(window)].append(result.total_s)
            calls[str(window)].append(result.nfe)
            if window == "auto":
                used.append(result.windows)
    return dict(seconds=seconds, calls=calls, used=used, timed=len(timed))


def commonest(windows: list[int], count: int = 3) -> str:
    return ", ".join(auto_window.widths_used(windows).split(", ")[:count])


def process_row(index: int, run: dict[str, Any], burst: bool) -> dict[str, Any]:
    """The table's row for one process's `one_process` output."""
    seconds, calls = run["seconds"], run["calls"]
    best = fastest_pinned(seconds)
    every_call = [width for windows in run["used"] for width in windows[1:]]
    return dict(process=index + 1, burst=f"{BURST_S:g} s" if burst else "-",
                timed_passes=run["timed"], first_widths=commonest(run["used"][0]), best_pinned=best,
                first_calls_vs_best=calls["auto"][0] / calls[best][0],
                calls_vs_best=sum(calls["auto"]) / sum(calls[best]),
                first_s_vs_best=seconds["auto"][0] / statistics.mean(seconds[best]),
                auto_s_vs_best=statistics.mean(seconds["auto"]) / statistics.mean(seconds[best]),
                widths=commonest([1] + every_call))


def persisted_processes(processes: int, images: int, burst_process: int) -> list[dict[str, Any]]:
    """`one_process` in `processes` fresh interpreters one after the other, sharing a new saved-costs file."""
    root = Path(__file__).resolve().parents[2]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, window_memory.ENV: str(Path(folder) / window_memory.FILE_NAME)}
        for index in range(processes):
            burst = index + 1 == burst_process
            code = ("import json, sys\nfrom scd_core.bench.auto_persist import one_process\n"
                    "print(json.dumps(one_process(*json.loads(sys.argv[1]))))")
            done = subprocess.run([sys.executable, "-c", code, json.dumps([images, burst])], cwd=root, env=env,
                                  capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"benchmark process {index + 1} failed:\n{done.stderr[-3000:]}")
            run = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(process_row(index, run, burst))
            # what a cut-short run leaves, with each seed's numbers for another look at them
            print(f"  {json.dumps({**rows[-1], 'seconds': run['seconds'], 'calls': run['calls']})}", file=sys.stderr,
                  flush=True)
    return rows


def persist_table(processes: int, images: int, burst_process: int) -> str:
    """The README's auto-persist section: a row per process, and whether the target holds."""
    rows = persisted_processes(processes, images, burst_process)
    later = rows[1:] if rows[0]["timed_passes"] else rows
    worst = {column: max(row[column] for row in later) for column in ("first_calls_vs_best", "calls_vs_best",
                                                                     "first_s_vs_best", "auto_s_vs_best")}
    verdict = ", ".join(f"{column} {value:.3g} ({'within' if value <= TARGET else 'over'} {TARGET}x)"
                        for column, value in worst.items())
    return (f"**demo** (prompt '7', the default coupler): {processes} fresh processes one after the other sharing "
            f"one saved-costs file, new at the start; each makes, for seeds 0..{images - 1}, an automatic image "
            f"and one at each pinned window {', '.join(map(str, PINNED))}; process {burst_process}'s first "
            f"automatic image runs under a {BURST_S:g} s busy loop; `timed_passes` 1: started from a cold cache\n\n"
            + markdown(rows, COLUMNS)
            + f"\n\nWorst over the processes that started from saved costs: {verdict}.")
