"""Benchmarks: model calls (NFE), tokens per call and acceptance for AR / SJD / SCD side by side.

    python -m scd_core.bench                 # synthetic grid model, three entropy levels
    python -m scd_core.bench --model demo    # any folder load_model accepts (NFE + latency split)
    python -m scd_core.bench --shape 1B      # cost of one window forward vs window size, Janus-Pro-1B shape
    python -m scd_core.bench --shape lumina-7b --layers 2   # the same at Lumina-mGPT-7B's 768 px sequence length
    python -m scd_core.bench --video         # synthetic video model: previous-frame drafts vs random / above
    python -m scd_core.bench --long          # time per call at positions ~100 / 2000 / 8000 of an 8k-token image
    python -m scd_core.bench --model demo --batches 1 4 16 --windows 32 --shape 1B   # shared vs per-row pace
    python -m scd_core.bench --candidates --seeds 30   # candidates against SCD-MC, seed for seed
    python -m scd_core.bench --device-check --out DIR   # the prepared GPU check (--device cpu --tiny to try it)
    ... --readme README.md                   # also write the tables between the README's bench markers

Wall times are only comparable within one run on one machine; on a CPU quote the ratios.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import torch

from .config import SamplerConfig
from .engine import generate
from .sampling import to_probs
from .synthetic import GridModel

METHODS = (("AR", "independent"), ("SJD", "independent"), ("SCD-MC", "maximal"), ("SCD-GS", "gumbel"),
           ("faithful", "faithful"))
# The NFE tables also show SJD with block verification (exact with independent drafts only), SCD whose
# new drafts are drawn half the time from the final p of the position they would copy, and SCD with a second
# candidate for the first draft of every call (a tree of two chains).
NFE_METHODS = (METHODS[:2] + (("SJD-block", "independent"),) + METHODS[2:3]
               + (("SCD-MC-mix", "maximal"), ("SCD-MC-cand2", "maximal")) + METHODS[3:])
OPTIONS = {"SJD-block": dict(verification="block"), "SCD-MC-mix": dict(draft_mix=0.5),
           "SCD-MC-cand2": dict(candidates=2)}
SHARPNESS = (("high", 0.5), ("medium", 1.5), ("low", 2.5))  # per-token entropy about 6.5 / 4 / 2.2 nats


def mean_entropy(model: GridModel, tokens: torch.Tensor) -> float:
    """Mean entropy (nats) of the sampling distribution along sampled sequences."""
    session = model.start(None, tokens.shape[0])
    session.prefill()
    logits, _ = session.forward(tokens[:, :-1])
    p = to_probs(logits, None, 1.0, 1.0, None, 1.0)
    return float(-(p * torch.log(p.clamp_min(1e-30))).sum(-1).mean())


def measure(model: Any, cond: Any, config: SamplerConfig, seeds: Iterable[int], batch_size: int = 1) -> dict:
    """Mean NFE, tokens per call, acceptance, draft changes and seconds over seeds."""
    runs = [generate(model, cond, SamplerConfig(**{**config.__dict__, "seed": seed}), batch_size=batch_size,
                     sync_timing=True) for seed in seeds]
    nfe = statistics.mean(r.nfe for r in runs)
    iterations = sum(r.nfe for r in runs)
    return dict(nfe=nfe, tokens_per_call=model.num_tokens / nfe,
                fed_per_call=statistics.mean(sum(r.fed[1:]) / max(r.nfe - 1, 1) for r in runs),
                acceptance=statistics.mean(statistics.mean(r.acceptance[1:] or [1.0]) for r in runs),
                draft_changes=statistics.mean(statistics.mean(r.draft_changes[1:] or [0.0]) for r in runs),
                forward_ms=1000 * sum(r.forward_s for r in runs) / iterations,
                sample_ms=1000 * sum(r.sample_s for r in runs) / iterations,
                wall_s=statistics.mean(r.total_s for r in runs))


def method_rows(model: Any, cond: Any, windows: Sequence[int], seeds: Sequence[int], draft_init: str,
                **sampling: Any) -> list[dict]:
    rows = []
    for label, coupler in NFE_METHODS:
        for window in ([1] if label == "AR" else windows):
            config = SamplerConfig(coupler=coupler, window=window, draft_init=draft_init,
                                   **OPTIONS.get(label, {}), **sampling)
            rows.append(dict(method=label, window=window, **measure(model, cond, config, seeds)))
    ar_nfe = rows[0]["nfe"]
    for row in rows:
        row["speedup"] = ar_nfe / row["nfe"]
    return rows


def markdown(rows: list[dict], columns: Sequence[str]) -> str:
    def cell(value: Any) -> str:
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


NFE_COLUMNS = ("method", "window", "nfe", "speedup", "tokens_per_call", "fed_per_call", "acceptance",
               "draft_changes")


def synthetic_tables(seeds: Sequence[int], windows: Sequence[int]) -> str:
    parts = []
    for name, sharpness in SHARPNESS:
        model = GridModel(sharpness=sharpness)
        entropy = mean_entropy(model, generate(model, None, SamplerConfig(window=1), batch_size=4).tokens)
        rows = method_rows(model, None, windows, seeds, draft_init="above")
        parts.append(f"**{name} entropy** ({entropy:.1f} nats/token; 16x16 grid, vocabulary 1024, "
                     f"{len(seeds)} seeds)\n\n" + markdown(rows, NFE_COLUMNS))
    model = GridModel(sharpness=SHARPNESS[0][1])
    init_rows = []
    for init in ("random", "left", "above"):
        for label, coupler in METHODS[1:4]:
            row = measure(model, None, SamplerConfig(coupler=coupler, window=32, draft_init=init), seeds)
            init_rows.append(dict(draft_init=init, method=label, **row))
    parts.append("**draft initialisation** (high entropy, window 32)\n\n"
                 + markdown(init_rows, ("draft_init", "method", "nfe", "tokens_per_call", "acceptance")))
    return "\n\n".join(parts)


def sampling_cost_table(vocab: int = 16384, window: int = 64, batch: int = 2, seeds: Sequence[int] = (0,)) -> str:
    """Sampling + verification time per iteration, apart from the model call."""
    model = GridModel(rows=16, cols=16, vocab_size=vocab, sharpness=0.5)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        model = GridModel(rows=16, cols=16, vocab_size=vocab, sharpness=0.5, device=device)
    rows = []
    for label, coupler in METHODS[1:]:
        config = SamplerConfig(coupler=coupler, window=window, draft_init="above")
        row = measure(model, None, config, seeds, batch_size=batch)
        rows.append(dict(method=label, device=device, forward_ms=row["forward_ms"], sample_ms=row["sample_ms"],
                         share=row["sample_ms"] / (row["sample_ms"] + row["forward_ms"])))
    return (f"vocabulary {vocab}, window {window}, batch {batch}; forward = the synthetic model's call\n\n"
            + markdown(rows, ("method", "device", "sample_ms", "forward_ms", "share")))


def model_tables(path: str, prompt: str, windows: Sequence[int], seeds: Sequence[int], device: Optional[str],
                 dtype: Optional[str]) -> str:
    from .bench_models import model_benchmark
    from .loading import load_model

    model = load_model(path, device=device, dtype=dtype)
    cond = model.encode(prompt)
    parts = []
    for init in ("above", "left", "random"):
        rows = method_rows(model, cond, windows, seeds, draft_init=init)
        parts.append(f"**{path}**, prompt {prompt!r}, draft_init {init}, {len(seeds)} seeds\n\n"
                     + markdown(rows, NFE_COLUMNS))
    latency = model_benchmark(path, windows=windows[:2], seeds=seeds[:1], prompt=prompt, device=device, dtype=dtype)
    parts.append("**latency split** (seconds, one image)\n\n" + markdown(
        latency, ("method", "window", "nfe", "prefill_s", "forward_s", "sample_s", "decode_s", "total_s",
                  "peak_mem_mb")))
    return "\n\n".join(parts)


def shape_table(size: str, device: Optional[str], dtype: Optional[str], layers: Optional[int] = None) -> str:
    from .bench_models import SHAPE_NAMES, shape_benchmark

    rows = shape_benchmark(size, device=device, dtype=dtype, layers=layers)
    return (f"{SHAPE_NAMES[size]}-shaped backbone with random weights, one window after a {rows[0]['prefix']}-token "
            f"prefix, CFG double batch, {rows[0]['device']} {rows[0]['dtype']}, {rows[0]['layers']} of "
            f"{rows[0]['full_layers']} layers\n\n"
            + markdown(rows, ("window", "seconds", "ratio", "per_layer_ms", "full_depth_s")))


def write_readme(readme: Path, section: str, text: str) -> None:
    """Replace the text between <!-- bench:SECTION --> and <!-- /bench:SECTION -->."""
    source = readme.read_text()
    pattern = re.compile(rf"(<!-- bench:{section} -->\n).*?(<!-- /bench:{section} -->)", re.S)
    if not pattern.search(source):
        raise SystemExit(f"{readme} has no <!-- bench:{section} --> ... <!-- /bench:{section} --> markers")
    readme.write_text(pattern.sub(lambda m: m.group(1) + text + "\n" + m.group(2), source))


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m scd_core.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a model folder (or 'demo') instead of the synthetic grid model")
    parser.add_argument("--prompt", default="7", help="prompt or class label for --model")
    parser.add_argument("--shape", choices=("1B", "7B", "lumina-7b"),
                        help="window cost of a Janus-Pro- or Lumina-mGPT-shaped model")
    parser.add_argument("--layers", type=int, help="--shape: layers to build (default: all that fit in memory)")
    parser.add_argument("--video", action="store_true", help="synthetic video model (AR / SJD / SCD x draft init)")
    parser.add_argument("--long", action="store_true",
                        help="time and sampling time per call along an 8193-token Emu3-shaped image (AR, SCD)")
    parser.add_argument("--device-check", action="store_true",
                        help="window cost, sampling share, memory, AR vs transformers and predicted time per image "
                             "for random-weight models at the published shapes (scd_core.device_check); needs --out")
    parser.add_argument("--out", type=Path, help="--device-check: folder for device_check.md and .json")
    parser.add_argument("--tiny", action="store_true", help="--device-check: tiny shapes (tests the same code path)")
    parser.add_argument("--auto", action="store_true",
                        help="time per image, automatic window against fixed ones: demo and Janus-Pro-1B-shaped")
    parser.add_argument("--candidates", action="store_true",
                        help="candidates=2..4 against SCD-MC at window 32, seed for seed (demo and the grids)")
    parser.add_argument("--windows", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--device")
    parser.add_argument("--dtype")
    parser.add_argument("--batches", type=int, nargs="+",
                        help="--model (default demo): calls per batch and time per image at these batch sizes, "
                             "shared pace vs per-row pace, at the first window; with --shape 1B/7B also the "
                             "calls of a Janus-Pro-sized synthetic grid and the per-row cache's call cost at that "
                             "Janus-Pro shape")
    parser.add_argument("--readme", type=Path, help="write the tables into this README between bench markers")
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    seeds = list(range(args.seeds))
    started = time.perf_counter()
    if args.batches:
        from .bench_pace import pace_tables

        section = "batches"
        text = pace_tables(args.model or "demo", args.prompt, args.batches, args.windows[0], seeds, args.shape,
                           args.device, args.dtype)
    elif args.candidates:
        from .bench_candidates import candidate_table

        section, text = "candidates", candidate_table(seeds)
    elif args.auto:
        from .bench_auto import auto_tables

        section, text = "auto", auto_tables(seeds)
    elif args.device_check:
        from .device_check import run

        if args.out is None:
            parser.error("--device-check needs --out DIR")
        section, text = "device-check", run(args.out, args.device, args.dtype, args.tiny)
    elif args.shape:
        section, text = f"shape-{args.shape}", shape_table(args.shape, args.device, args.dtype, args.layers)
    elif args.long:
        from .bench_long import long_table

        section, text = "long", long_table(args.device, args.dtype)
    elif args.video:
        from .bench_video import video_tables

        section, text = "video", video_tables(seeds, args.windows)
    elif args.model:
        section = "demo" if args.model == "demo" else "model"
        text = model_tables(args.model, args.prompt, args.windows, seeds, args.device, args.dtype)
    else:
        section = "synthetic"
        text = synthetic_tables(seeds, args.windows) + "\n\n" + sampling_cost_table()
    print(text)
    print(f"\n({time.perf_counter() - started:.0f} s)")
    if args.readme:
        write_readme(args.readme, section, text)


if __name__ == "__main__":
    main()
