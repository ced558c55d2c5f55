"""Benchmarks: model calls (NFE), tokens per call and acceptance for AR / SJD / SCD side by side.

    python -m scd_core.bench                 # synthetic grid model, three entropy levels
    python -m scd_core.bench --model demo    # any folder load_model accepts (NFE + latency split)
    python -m scd_core.bench --shape 1B      # cost of one window forward vs window size, Janus-Pro-1B shape
    python -m scd_core.bench --shape lumina-7b --layers 2   # the same at Lumina-mGPT-7B's 768 px sequence length
    python -m scd_core.bench --video         # synthetic video model: previous-frame drafts vs random / above
    python -m scd_core.bench --long          # time per call at positions ~100 / 2000 / 8000 of an 8k-token image
    python -m scd_core.bench --model demo --batches 1 4 16 --windows 32 --shape 1B   # shared vs per-row pace
    python -m scd_core.bench --stream --model demo --shape 1B   # 64 jobs: batch 1, batches of 16, 16 slots
    python -m scd_core.bench --candidates --seeds 30   # candidates against SCD-MC, seed for seed
    python -m scd_core.bench --memory        # weights and KV cache per precision at the published shapes
    python -m scd_core.bench --shape 1B --layers 2 --quantize none int8 nf4   # window cost per precision
    python -m scd_core.bench --device-check --out DIR   # the prepared GPU check (--device cpu --tiny to try it)
    python -m scd_core.bench --compile       # eager vs compile=True: demo and Janus-Pro-1B shape, compile time apart
    python -m scd_core.bench --auto          # automatic window against pinned ones in fresh processes (wall time)
    python -m scd_core.bench --auto-replay --processes 4 --images 5   # whole processes under fixed costs, by REFINEMENT
    python -m scd_core.bench --faithful --seeds 16   # faithful: images differing by window in bfloat16; calls vs maximal/gumbel
    ... --readme scd_core/bench/README.md                   # also write the tables between the README's bench markers

Wall times are only comparable within one run on one machine; on a CPU quote the ratios.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Optional, Sequence

import torch

from .nfe import model_tables, sampling_cost_table, shape_table, synthetic_tables
from .tables import write_readme


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m scd_core.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a model folder (or 'demo') instead of the synthetic grid model")
    parser.add_argument("--prompt", default="7", help="prompt or class label for --model")
    parser.add_argument("--shape", choices=("1B", "7B", "lumina-7b"),
                        help="window cost of a Janus-Pro- or Lumina-mGPT-shaped model")
    parser.add_argument("--layers", type=int, help="--shape: layers to build (default: all that fit in memory); "
                                                   "--auto: of the Janus-Pro-1B stand-in (default 2); "
                                                   "--compile: of the Janus-Pro-1B shape (default 4)")
    parser.add_argument("--quantize", nargs="+", choices=("none", "int8", "nf4"),
                        help="--shape: window cost with the backbone at each of these precisions (windows 1/16/64)")
    parser.add_argument("--video", action="store_true", help="synthetic video model (AR / SJD / SCD x draft init)")
    parser.add_argument("--long", action="store_true",
                        help="time and sampling time per call along an 8193-token Emu3-shaped image (AR, SCD)")
    parser.add_argument("--device-check", action="store_true",
                        help="window cost, sampling share, memory, AR vs transformers and predicted time per image "
                             "for random-weight models at the published shapes (scd_core.bench.device_check); needs --out")
    parser.add_argument("--out", type=Path, help="--device-check: folder for device_check.md and .json")
    parser.add_argument("--tiny", action="store_true", help="--device-check: tiny shapes (tests the same code path)")
    parser.add_argument("--auto", action="store_true",
                        help="time per image, automatic window against fixed ones: demo and Janus-Pro-1B-shaped")
    parser.add_argument("--auto-replay", action="store_true",
                        help="whole processes of automatic images under fixed cost profiles, for REFINEMENT "
                             "0.25 / 0.3 / 0.35 (no timing; the demo and the stand-in's grid)")
    parser.add_argument("--processes", type=int, nargs="+", default=[10],
                        help="--auto: fresh processes (one number, or the demo's and the stand-in's)")
    parser.add_argument("--images", type=int, nargs="+", default=[4],
                        help="--auto: automatic images per process (one number, or the demo's and the stand-in's)")
    parser.add_argument("--side", type=int, default=24, help="--auto: grid side of the Janus-Pro-1B stand-in")
    parser.add_argument("--faithful", action="store_true",
                        help="faithful in bfloat16 (images differing from window 1's) and its calls against "
                             "maximal and gumbel (scd_core.bench.faithful)")
    parser.add_argument("--memory", action="store_true",
                        help="weights (bf16 / int8 / nf4) and KV cache at each family's published shape; no weights")
    parser.add_argument("--candidates", action="store_true",
                        help="candidates=2..4 against SCD-MC at window 32, seed for seed (demo and the grids)")
    parser.add_argument("--compile", action="store_true",
                        help="eager vs compiled (load_model(..., compile=True)) per call and per image, compile "
                             "time apart, and where a demo call's time goes (scd_core.bench.compiled)")
    parser.add_argument("--windows", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--device")
    parser.add_argument("--dtype")
    parser.add_argument("--batches", type=int, nargs="+",
                        help="--model (default demo): calls per batch and time per image at these batch sizes, "
                             "shared pace vs per-row pace, at the first window; with --shape 1B/7B also the "
                             "calls of a Janus-Pro-sized synthetic grid and the per-row cache's call cost at that "
                             "Janus-Pro shape")
    parser.add_argument("--stream", action="store_true",
                        help="a stream of --jobs jobs: one at a time, independent batches and continuous batching "
                             "at --slots slots (window: the first of --windows)")
    parser.add_argument("--jobs", type=int, default=64, help="--stream: jobs in the stream")
    parser.add_argument("--slots", type=int, default=16, help="--stream: rows decoding at once")
    parser.add_argument("--readme", type=Path, help="write the tables into this README between bench markers")
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    seeds = list(range(args.seeds))
    started = time.perf_counter()
    if args.stream:
        from .stream import stream_tables

        section = "stream"
        text = stream_tables(args.model or "demo", args.jobs, args.slots, args.windows[0], args.shape, args.device,
                             args.dtype)
    elif args.batches:
        from .pace import pace_tables

        section = "batches"
        text = pace_tables(args.model or "demo", args.prompt, args.batches, args.windows[0], seeds, args.shape,
                           args.device, args.dtype)
    elif args.memory:
        from .shapes import memory_table

        section, text = "memory", memory_table()
    elif args.candidates:
        from .candidates import candidate_table

        section, text = "candidates", candidate_table(seeds)
    elif args.auto:
        from .auto import auto_tables

        section, text = "auto", auto_tables(seeds, args.processes, args.images, args.layers or 2,
                                                args.side)
    elif args.faithful:
        from .faithful import faithful_tables

        section, text = "faithful", faithful_tables(seeds)
    elif args.auto_replay:
        from .auto import process_replay_table

        section, text = "auto-replay", process_replay_table(processes=args.processes[0], images=args.images[0])
    elif args.compile:
        from .compiled import compile_tables

        section, text = "compile", compile_tables(seeds, args.device, args.dtype, args.layers or 4)
    elif args.device_check:
        from .device_check import run

        if args.out is None:
            parser.error("--device-check needs --out DIR")
        section, text = "device-check", run(args.out, args.device, args.dtype, args.tiny)
    elif args.shape and args.quantize:
        from .shapes import quantized_cost_table

        section = f"shape-{args.shape}-quantize"
        text = quantized_cost_table(args.shape, args.quantize, device=args.device, dtype=args.dtype, layers=args.layers)
    elif args.shape:
        section, text = f"shape-{args.shape}", shape_table(args.shape, args.device, args.dtype, args.layers)
    elif args.long:
        from .long import long_table

        section, text = "long", long_table(args.device, args.dtype)
    elif args.video:
        from .video import video_tables

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
