"""`python -m scd_core.bench COMMAND`: the benchmarks, one subcommand each; `--help` lists them.

    python -m scd_core.bench nfe                      # synthetic grid model, three entropy levels
    python -m scd_core.bench nfe --model demo         # any model folder (model calls + latency split)
    python -m scd_core.bench shape 1B                 # cost of one window call vs its width, Janus-Pro-1B shape
    python -m scd_core.bench shape lumina-7b --layers 2   # the same at Lumina-mGPT-7B's 768 px sequence length
    python -m scd_core.bench shape 1B --layers 2 --quantize none int8 nf4   # window cost per precision
    python -m scd_core.bench video                    # synthetic video model: previous-frame drafts vs random / above
    python -m scd_core.bench long                     # time per call at positions ~100 / 2000 / 8000 of 8k tokens
    python -m scd_core.bench batches --sizes 1 4 16 --window 32 --shape 1B   # shared vs per-row pace
    python -m scd_core.bench stream --shape 1B        # 64 jobs: batch 1, batches of 16, 16 slots
    python -m scd_core.bench candidates --seeds 30    # candidates against SCD with maximal coupling, seed for seed
    python -m scd_core.bench memory                   # weights and KV cache per precision at the published shapes
    python -m scd_core.bench device-check --out DIR   # the prepared GPU check (--device cpu --tiny to try it)
    python -m scd_core.bench device-run --out DIR     # a GPU machine as it comes, 9 minutes (--device cpu --tiny)
    python -m scd_core.bench compile                  # eager vs compiled: demo and Janus-Pro-1B shape, compile apart
    python -m scd_core.bench auto                     # automatic window against pinned ones in fresh processes
    python -m scd_core.bench auto-replay --processes 4 --images 5   # whole processes under fixed call costs
    python -m scd_core.bench auto-persist             # six fresh demo processes sharing the saved window costs
    python -m scd_core.bench faithful --seeds 4       # faithful: images differing by width in bfloat16; its calls
    python -m scd_core.bench bf16 --seeds 8           # bfloat16: images differing by width, batch, compile
    python -m scd_core.bench bf16-stand-in            # bfloat16 on the Janus-Pro-1B stand-in, teacher-forced
    python -m scd_core.bench invariant --seeds 2      # bfloat16: what the window-invariant calls cost
    python -m scd_core.bench given --seeds 3          # images in the prompt: calls of continuations and regions
    python -m scd_core.bench glm-image                # GLM-Image's AR stage: calls at its grids and sampling
    python -m scd_core.bench emu3p5                   # Emu3.5-Image at 1024 px: calls at its layout and top-k
    python -m scd_core.bench mammothmoda2             # MammothModa2's token stage: calls at 32 x 32 / 64 x 64, Amdahl
    python -m scd_core.bench emu3p5-story             # an Emu3.5 story: text and three 720 px images, its calls
    ... --readme scd_core/bench/README.md             # also write the tables between the README's bench markers

A benchmark is one COMMANDS entry: its summary, its options (the shared ones below, or its own) and what runs
it, a function of the parsed options returning the README section it fills and its tables (the `_name`
functions here, each importing its module when it runs).
Wall times are only comparable within one run on one machine; on a CPU quote the ratios.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from .tables import write_readme

Option = tuple[tuple[str, ...], dict[str, Any]]  # argparse's add_argument(*flags, **settings)
Result = tuple[str, str]  # (the README section it fills, the tables)


def option(*flags: str, **settings: Any) -> Option:
    return flags, settings


# options several benchmarks share
SEEDS = option("--seeds", type=int, default=5, metavar="N", help="seeds 0 .. N-1 for every setting (default: 5)")
WINDOWS = option("--windows", type=int, nargs="+", default=[16, 32, 64],
                 help="window widths to compare (default: 16 32 64)")
WINDOW = option("--window", type=int, default=32, help="window width of every decoding (default: 32)")
DEVICE = option("--device", help="cpu, cuda, cuda:1, mps (default: the best available)")
DTYPE = option("--dtype", help="float32, bfloat16 or float16 (default: bfloat16 on CUDA, else float32)")
MODEL = option("--model", default="demo",
               help='"demo" (the embedded digit model, the default) or a model folder')
PROMPT = option("--prompt", default="7", help="prompt, or class label for the demo (default: 7)")
JANUS_SHAPE = option("--shape", choices=("1B", "7B"),
                     help="also a synthetic grid of Janus-Pro's 24 x 24 tokens and 16384 codes, and the cost of its "
                          "calls at the Janus-Pro-1B or -7B shape")


@dataclass(frozen=True)
class Bench:
    summary: str  # one line of `--help`
    options: tuple[Option, ...]
    run: Callable[[argparse.Namespace], Result]


def _nfe(args: argparse.Namespace) -> Result:
    from .nfe import model_tables, sampling_cost_table, synthetic_tables

    seeds = list(range(args.seeds))
    if args.model is None:
        return "synthetic", synthetic_tables(seeds, args.windows) + "\n\n" + sampling_cost_table()
    section = "demo" if args.model == "demo" else "model"
    return section, model_tables(args.model, args.prompt, args.windows, seeds, args.device, args.dtype)


def _shape(args: argparse.Namespace) -> Result:
    from .nfe import shape_table
    from .shapes import quantized_cost_table

    if args.quantize:
        section = f"shape-{args.shape}-quantize" + (f"-{args.dtype}" if args.dtype else "")
        return section, quantized_cost_table(args.shape, args.quantize, device=args.device,
                                                                    dtype=args.dtype, layers=args.layers)
    return f"shape-{args.shape}", shape_table(args.shape, args.device, args.dtype, args.layers)


def _video(args: argparse.Namespace) -> Result:
    from .video import video_tables

    return "video", video_tables(list(range(args.seeds)), args.windows)


def _long(args: argparse.Namespace) -> Result:
    from .long import long_table

    return "long", long_table(args.device, args.dtype)


def _batches(args: argparse.Namespace) -> Result:
    from .pace import pace_tables

    return "batches", pace_tables(args.model, args.prompt, args.sizes, args.window, list(range(args.seeds)),
                                  args.shape, args.device, args.dtype)


def _stream(args: argparse.Namespace) -> Result:
    from .stream import stream_tables

    return "stream", stream_tables(args.model, args.jobs, args.slots, args.window, args.shape, args.device,
                                   args.dtype)


def _candidates(args: argparse.Namespace) -> Result:
    from .candidates import candidate_table

    return "candidates", candidate_table(list(range(args.seeds)))


def _memory(args: argparse.Namespace) -> Result:
    from .shapes import memory_table

    return "memory", memory_table()


def _device_check(args: argparse.Namespace) -> Result:
    from .device_check import run

    return "device-check", run(args.out, args.device, args.dtype, args.tiny, args.compile_widths, args.compile_budget)


def _device_run(args: argparse.Namespace) -> Result:
    from .device_run import run

    return "device-run", run(args.out, args.device, args.tiny, args.limit)


def _compile(args: argparse.Namespace) -> Result:
    from .compiled import compile_tables

    return "compile", compile_tables(list(range(args.seeds)), args.device, args.dtype, args.layers)


def _auto(args: argparse.Namespace) -> Result:
    from .auto import auto_tables

    return "auto", auto_tables(list(range(args.seeds)), args.processes, args.images, args.layers, args.side)


def _auto_persist(args: argparse.Namespace) -> Result:
    from .auto_persist import persist_table

    section = "auto-persist" if args.costs == "measured" else "auto-persist-profile"
    return section, persist_table(args.processes, args.images, args.burst_process, args.costs == "profile",
                                  args.repeats)


def _auto_replay(args: argparse.Namespace) -> Result:
    from .auto import process_replay_table

    return "auto-replay", process_replay_table(processes=args.processes, images=args.images)


def _bf16(args: argparse.Namespace) -> Result:
    from .bf16 import bf16_table

    return "bf16", bf16_table(list(range(args.seeds)))


def _bf16_stand_in(args: argparse.Namespace) -> Result:
    from .bf16 import stand_in_table

    return "bf16-stand-in", stand_in_table(args.seeds, args.windows)


def _invariant(args: argparse.Namespace) -> Result:
    from .bf16 import invariant_cost_table

    return "invariant", invariant_cost_table(args.windows, args.repeats, list(range(args.seeds)), args.stand_in)


def _faithful(args: argparse.Namespace) -> Result:
    from .faithful import faithful_tables

    return "faithful", faithful_tables(list(range(args.seeds)))


def _given(args: argparse.Namespace) -> Result:
    from .given import given_tables

    return "given", given_tables(list(range(args.seeds)))


def _glm_image(args: argparse.Namespace) -> Result:
    from .glm_image import glm_image_tables

    return "glm-image", glm_image_tables(list(range(args.seeds)), args.windows)


def _emu3p5(args: argparse.Namespace) -> Result:
    from .emu3p5 import emu3p5_tables

    return "emu3p5", emu3p5_tables(list(range(args.seeds)), args.windows, args.codes)


def _mammothmoda2(args: argparse.Namespace) -> Result:
    from .mammothmoda2 import GRIDS, mammoth_tables

    grids = [tuple(grid) for grid in args.grids] if args.grids else GRIDS
    return "mammothmoda2", mammoth_tables(list(range(args.seeds)), args.windows, grids)
def _emu3p5_story(args: argparse.Namespace) -> Result:
    from .emu3p5_story import story_tables

    return "emu3p5-story", story_tables(args.windows, args.codes, args.text_tokens)


COMMANDS: dict[str, Bench] = {
    "nfe": Bench("model calls, tokens per call and acceptance of AR, SJD and SCD side by side (a synthetic grid "
                 "model at three entropies, or --model)",
                 (option("--model", help='"demo" or a model folder instead of the synthetic grid model (then also '
                                         "the time split of a call)"),
                  PROMPT, WINDOWS, SEEDS, DEVICE, DTYPE), _nfe),
    "shape": Bench("time of one window call against its width on a random-weight model at a published shape",
                   (option("shape", choices=("1B", "7B", "lumina-7b"),
                           help="Janus-Pro-1B, Janus-Pro-7B or Lumina-mGPT-7B (768 px)"),
                    option("--layers", type=int,
                           help="decoder layers to build; the table also gives the time per layer and at full "
                                "depth (default: all that fit in memory)"),
                    option("--quantize", nargs="+", choices=("none", "int8", "nf4"),
                           help="the window cost with the backbone at each of these precisions (widths 1, 16, 64)"),
                    DEVICE, DTYPE), _shape),
    "video": Bench("a synthetic video model: AR, SJD and SCD with each way of drafting a new position",
                   (WINDOWS, SEEDS), _video),
    "long": Bench("time and sampling time per call along an 8193-token image of Emu3's shape (AR and SCD)",
                  (DEVICE, DTYPE), _long),
    "batches": Bench("calls per batch and time per image at several batch sizes, the batch at one pace against "
                     "each row at its own",
                     (MODEL, PROMPT, option("--sizes", type=int, nargs="+", default=[1, 4, 16],
                                            help="batch sizes to measure (default: 1 4 16)"),
                      WINDOW, SEEDS, JANUS_SHAPE, DEVICE, DTYPE), _batches),
    "stream": Bench("a stream of jobs: one at a time, batches, and continuous batching (finished rows refilled)",
                    (MODEL, option("--jobs", type=int, default=64, help="jobs in the stream (default: 64)"),
                     option("--slots", type=int, default=16, help="rows decoding at once (default: 16)"),
                     WINDOW, JANUS_SHAPE, DEVICE, DTYPE), _stream),
    "candidates": Bench("several candidates for the first draft of each call against SCD with maximal coupling, "
                        "window 32, seed for seed (the demo and the synthetic grids)", (SEEDS,), _candidates),
    "memory": Bench("weights (bfloat16, int8, nf4) and KV cache of each family at its published shape; no weights "
                    "downloaded", (), _memory),
    "device-check": Bench("the prepared GPU check: window cost, sampling share, memory, AR against transformers and "
                          "the predicted time per image at the published shapes (random weights)",
                          (option("--out", type=Path, required=True, metavar="DIR",
                                  help="folder for device_check.md and device_check.json"),
                           option("--tiny", action="store_true",
                                  help="tiny shapes: the same code in minutes on a CPU"),
                           option("--compile-widths", type=int, nargs="+", metavar="W",
                                  help="widths the compiled phase compiles, one compilation per width and shape "
                                       "(default: 1 32; tiny: 1 4)"),
                           option("--compile-budget", type=float, metavar="S",
                                  help="seconds after which the compiled phase compiles nothing more "
                                       "(default: 150; tiny: none)"),
                           DEVICE, DTYPE), _device_check),
    "device-run": Bench("the device check for a GPU machine as it comes (its own python, at most 9 minutes): "
                        "per-call time against the floor, compiled against eager and kept graphs against new "
                        "ones, kept graphs under cudaMallocAsync, logits' bits across call widths, int8 kernels; "
                        "each table written once measured",
                        (option("--out", type=Path, required=True, metavar="DIR", help="folder for the tables"),
                         option("--tiny", action="store_true", help="tiny shapes: the dry run, on a CPU"),
                         option("--limit", type=float, default=540.0, metavar="S",
                                help="seconds for the whole run (default: 540)"),
                         option("--device", help="cuda, cuda:1, cpu (default: cuda where there is one)")),
                        _device_run),
    "compile": Bench("eager against compiled models, per call and per image, compile time apart, and where a demo "
                     "call's time goes",
                     (SEEDS, option("--layers", type=int, default=4,
                                    help="decoder layers of the Janus-Pro-1B shape to build (default: 4)"),
                      DEVICE, DTYPE), _compile),
    "auto": Bench("time per image, automatic window against pinned ones, each image in a fresh process (the demo "
                  "and a Janus-Pro-1B-shaped stand-in)",
                  (SEEDS,
                   option("--processes", type=int, nargs="+", default=[10],
                          help="fresh processes: one number, or the demo's and the stand-in's (default: 10)"),
                   option("--images", type=int, nargs="+", default=[4],
                          help="automatic images per process: one number, or the demo's and the stand-in's "
                               "(default: 4)"),
                   option("--layers", type=int, default=2, help="decoder layers of the stand-in (default: 2)"),
                   option("--side", type=int, default=24,
                          help="tokens per side of the stand-in's image (default: 24)")), _auto),
    "auto-replay": Bench("whole processes of automatic-window images replayed under fixed call costs, for three "
                         "values of the exponent by which the automatic window expects the tokens a call commits "
                         "to grow with its width (no timing)",
                         (option("--processes", type=int, default=4, help="processes per cost profile (default: 4)"),
                          option("--images", type=int, default=5, help="images per process (default: 5)")),
                         _auto_replay),
    "auto-persist": Bench("the automatic window across fresh processes on the demo that share one saved-costs "
                          "file: each process's calls and time per image against the best pinned window's",
                          (option("--processes", type=int, default=6, help="fresh processes (default: 6)"),
                           option("--images", type=int, default=5,
                                  help="seeds per process, each an automatic image and one per pinned window "
                                       "(default: 5)"),
                           option("--repeats", type=int, default=3,
                                  help="rounds of each seed's images; a window's seconds for a seed are the median "
                                       "of its rounds (default: 3)"),
                           option("--burst-process", type=int, default=2,
                                  help="the process whose first round of seed-0 images (its first automatic image "
                                       "first) runs under a burst of load (default: 2; 0: none)"),
                           option("--costs", choices=("measured", "profile"), default="measured",
                                  help="measured: this machine's wall time; profile: every call costs what the "
                                       "demo's calls cost on this CPU, by width, on a clock that only the calls "
                                       "move (no noise from other work on the machine)")), _auto_persist),
    "bf16": Bench("what holds in bfloat16: the demo's images that differ in any token across windows, between a "
                  "batch row and its seed alone, and between compiled and eager calls (faithful)", (SEEDS,), _bf16),
    "bf16-stand-in": Bench("bfloat16 on the Janus-Pro-1B-shaped stand-in (random weights, ~25 min on a 2-core CPU): "
                           "images that differ from window 1's, teacher-forced, one image per noise draw",
                           (option("--seeds", type=int, default=64, metavar="N",
                                   help="noise draws (images) per width (default: 64)"), WINDOWS), _bf16_stand_in),
    "invariant": Bench("what the window-invariant calls of bfloat16 / float16 cost against today's calls: one call "
                       "per width on the demo (and the Janus-Pro-1B stand-in) and the demo's images",
                       (SEEDS, WINDOWS, option("--repeats", type=int, default=5, help="calls timed per width"),
                        option("--stand-in", action="store_true", help="also the Janus-Pro-1B stand-in (slow)")),
                       _invariant),
    "faithful": Bench("the faithful coupler (the default): the demo's images in bfloat16 that differ from window "
                      "1's at other widths, and its calls against maximal and gumbel coupling", (SEEDS,), _faithful),
    "given": Bench("images in the prompt: calls of a continuation (top half kept) and of regenerated regions "
                   "against the full image, AR / SJD / SCD / faithful (the demo and the medium-entropy grid)",
                   (SEEDS,), _given),
    "glm-image": Bench("GLM-Image's token stage: calls of AR, SJD, SCD and faithful on a synthetic model of its grids "
                       "(16 x 16 preview, 32 x 32 at 1024 px), codes and sampling",
                       (option("--seeds", type=int, default=1, metavar="N", help="seeds 0 .. N-1 (default: 1)"),
                        option("--windows", type=int, nargs="+", default=[32],
                               help="window widths to compare (default: 32)")), _glm_image),
    "emu3p5": Bench("Emu3.5-Image at 1024 px: calls of AR, SJD, SCD and faithful on a synthetic model of its layout "
                    "(64 rows of 64 codes, row ends and image end forced) and top-k",
                    (option("--seeds", type=int, default=1, metavar="N", help="seeds 0 .. N-1 (default: 1)"),
                     option("--windows", type=int, nargs="+", default=[32],
                            help="window widths to compare (default: 32)"),
                     option("--codes", type=int, default=8192,
                            help="codebook size of the stand-in, its top-k scaled alike (default: 8192, 16 times "
                                 "fewer than the published 131072, and 16 times less sampling work)")), _emu3p5),
    "mammothmoda2": Bench("MammothModa2's token stage: calls of AR, SJD, SCD and faithful on a synthetic model of its "
                          "layout (rows of codes, each closed by a forced EOL) at CFG 6 and top-k, and what the DiT "
                          "leaves of the speedup end to end (published timings)",
                          (option("--seeds", type=int, default=1, metavar="N", help="seeds 0 .. N-1 (default: 1)"),
                           option("--windows", type=int, nargs="+", default=[32],
                                  help="window widths to compare (default: 32)"),
                           option("--grids", type=int, nargs=2, action="append", metavar=("ROWS", "COLS"),
                                  default=None, help="grids to run (default: 32 32 and 64 64)")), _mammothmoda2),
    "emu3p5-story": Bench("An Emu3.5 story: calls of AR, SCD and faithful for three 720^2 px images on the synthetic "
                          "model of Emu3.5's layout, with the plain AR text segments between them",
                          (option("--windows", type=int, nargs="+", default=[32],
                                  help="window widths to compare (default: 32)"),
                           option("--codes", type=int, default=8192,
                                  help="codebook size of the stand-in, its top-k scaled alike (default: 8192)"),
                           option("--text-tokens", type=int, default=128,
                                  help="tokens in each of the four text segments (default: 128)")), _emu3p5_story),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m scd_core.bench",
                                     description="Benchmarks of the library, one command each (its options: "
                                                 "python -m scd_core.bench COMMAND --help).",
                                     epilog="Wall times are only comparable within one run on one machine.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, bench in COMMANDS.items():
        sub = commands.add_parser(name, help=bench.summary, description=bench.summary)
        for flags, settings in bench.options:
            sub.add_argument(*flags, **settings)
        sub.add_argument("--readme", type=Path, metavar="README",
                         help="also write the tables into this file between its bench markers")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    torch.set_grad_enabled(False)
    started = time.perf_counter()
    section, text = COMMANDS[args.command].run(args)
    print(text)
    print(f"\n({time.perf_counter() - started:.0f} s)")
    if args.readme:
        write_readme(args.readme, section, text)
