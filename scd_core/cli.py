"""`python -m scd_core`: generate images from the command line and see what the decoding saved.

    python -m scd_core generate --model demo --prompt 7 --coupler maximal --window 16 --seed 0 -o out.png

Each subcommand is one entry of COMMANDS (arguments + runner), so `bench` can be
added next to `generate` without touching the rest.  Bad input (a model folder
that cannot be loaded, invalid settings) ends with one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TextIO

import torch
from PIL import Image, ImageDraw, ImageFont

from .auto_window import widths_used
from .models.checkpoints import ModelLoadError
from .config import AUTO_WINDOW, COUPLERS, DRAFT_INITS, VERIFICATIONS, SamplerConfig
from .engine import GenerationResult, IterationStats, ModelOutputError, generate
from .models.loading import load_model, pick_device
from .model import set_image_size

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # the shell's code for Ctrl-C
DEFAULTS = SamplerConfig()
# --compare: (coupler, window or None for the --window value); AR is window 1 by definition
COMPARE_MODES = (("independent", 1), ("independent", None), ("maximal", None), ("gumbel", None))
MODE_LABELS = {"independent": "SJD", "maximal": "SCD-maximal", "gumbel": "SCD-gumbel"}
BAR_WIDTH = 30
HISTOGRAM_WIDTH = 40
LABEL_HEIGHT = 14
LABEL_PADDING = 4


class UsageError(ValueError):
    """A command line argparse rejects; reported like any other bad input."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of usage + message, see main()
        raise UsageError(f"{message} (see '{self.prog} --help')")


# ---------------------------------------------------------------- arguments

def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def _pixels(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a pixel count >= 0 (0: the model's size), got {text}")
    return value


def _window(text: str) -> int | str:
    if text == AUTO_WINDOW:
        return text
    try:
        return int(text)  # the range is SamplerConfig's to check
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {AUTO_WINDOW!r} or an integer, got {text!r}") from None


def add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model")
    model.add_argument("--model", required=True, help='"demo" (the embedded digit model) or a model folder')
    model.add_argument("--prompt", required=True, help='text prompt; for the demo model a digit, e.g. "7"')
    model.add_argument("--negative-prompt", help="negative prompt for the unconditional CFG branch")
    model.add_argument("--device", help="cpu, cuda, cuda:1, mps (default: the best available)")
    model.add_argument("--dtype", help="float32, bfloat16 or float16 (default: bfloat16 on CUDA, else float32)")
    model.add_argument("--compile", action="store_true",
                       help="static-shape window calls through torch.compile (CUDA graphs on CUDA); the first "
                            "call of each window width compiles (demo/LlamaGen; candidates 1)")
    model.add_argument("--width", type=_pixels, default=0,
                       help="image width in pixels (Emu3, Lumina-mGPT); default 0: the model's size")
    model.add_argument("--height", type=_pixels, default=0,
                       help="image height in pixels (Emu3, Lumina-mGPT); default 0: the model's size")
    sampler = parser.add_argument_group("sampler (defaults: the model's recommended values)")
    sampler.add_argument("--coupler", choices=COUPLERS, default=DEFAULTS.coupler,
                         help="how drafts are re-made: maximal/gumbel (SCD), independent (SJD), faithful")
    sampler.add_argument("--window", type=_window, default=DEFAULTS.window,
                         help="positions decoded per model call; 1 is plain autoregressive sampling; "
                              "auto: chosen per call from the measured cost of a call and the acceptance")
    sampler.add_argument("--cfg", type=float, help="classifier-free guidance scale")
    sampler.add_argument("--temperature", type=float, default=DEFAULTS.temperature)
    sampler.add_argument("--top-k", type=int)
    sampler.add_argument("--top-p", type=float, default=DEFAULTS.top_p)
    sampler.add_argument("--seed", type=int, default=DEFAULTS.seed)
    sampler.add_argument("--draft-init", choices=DRAFT_INITS, default=DEFAULTS.draft_init,
                         help="initial draft of a position entering the window (default: the model's, "
                              "previous_frame for video, else above)")
    sampler.add_argument("--verification", choices=VERIFICATIONS, default=DEFAULTS.verification,
                         help="token: draft by draft; block: a joint rule over the window (independent coupler)")
    sampler.add_argument("--candidates", type=int, default=DEFAULTS.candidates,
                         help="candidates for the first draft of each call, each with a chain of the later drafts "
                              "(1..8; 1 = just the draft)")
    sampler.add_argument("--batch-size", type=_positive_int, default=1, help="images per run")
    out = parser.add_argument_group("output")
    out.add_argument("-o", "--output", required=True, type=Path,
                     help="PNG file; a batch is written side by side")
    out.add_argument("--compare", action="store_true",
                     help="run AR, SJD, SCD-maximal and SCD-gumbel on the same seed and write them side by side")


def sampler_config(args: argparse.Namespace) -> SamplerConfig:
    return SamplerConfig(coupler=args.coupler, window=args.window, cfg_scale=args.cfg,
                         temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                         draft_init=args.draft_init, verification=args.verification,
                         candidates=args.candidates)


def check_device(name: Optional[str]) -> None:
    """Reject a device this machine lacks before the weights are read."""
    try:
        pick_device(name)
    except ValueError as err:
        raise ValueError(f"--{err}") from err


def check_output(path: Path) -> None:
    if path.suffix.lower() != ".png":
        raise ValueError(f"--output must be a .png file, got {str(path)!r}")
    if not path.parent.resolve().is_dir():
        raise ValueError(f"--output: folder {str(path.parent)!r} does not exist")


# ---------------------------------------------------------------- running

class ProgressBar:
    """The engine callback: a one-line bar on `stream`, and the per-slot acceptance totals."""

    def __init__(self, label: str, stream: TextIO) -> None:
        self.label, self.stream = label, stream
        self.drafts, self.accepted = 0, 0.0

    def __call__(self, stats: IterationStats) -> None:
        self.drafts += len(stats.acceptance)
        self.accepted += sum(stats.acceptance)
        filled = BAR_WIDTH * stats.total // stats.num_tokens
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] "
                          f"{stats.total}/{stats.num_tokens} tokens, {stats.nfe} calls")
        self.stream.flush()

    def finish(self) -> None:
        self.stream.write("\n")
        self.stream.flush()

    @property
    def acceptance(self) -> Optional[float]:
        """Share of drafts accepted over the run; None when no draft was verified (AR)."""
        return self.accepted / self.drafts if self.drafts else None


@dataclass
class Run:
    label: str
    config: SamplerConfig
    result: GenerationResult
    images: torch.Tensor  # (batch, H, W, 3) float in 0..1
    decode_s: float
    acceptance: Optional[float]

    @property
    def speedup(self) -> float:
        return self.result.tokens.shape[1] / self.result.nfe  # AR needs one call per token

    @property
    def wall_s(self) -> float:
        return self.result.total_s + self.decode_s


def mode_label(config: SamplerConfig) -> str:
    return "AR" if config.window == 1 else MODE_LABELS.get(config.coupler, config.coupler)


def run_once(model: Any, cond: Any, config: SamplerConfig, batch_size: int) -> Run:
    label = mode_label(config)
    progress = ProgressBar(label, sys.stderr)
    try:
        result = generate(model, cond, config, batch_size=batch_size, callback=progress)
    finally:
        progress.finish()
    started = time.perf_counter()
    images = model.decode(result.tokens)
    return Run(label, config, result, images, time.perf_counter() - started, progress.acceptance)


# ---------------------------------------------------------------- reporting

def commit_histogram(committed: Sequence[int]) -> str:
    """Iterations by tokens committed, in power-of-two buckets (1, 2-3, 4-7, ...), as bars of '#'."""
    buckets: list[int] = []
    for count in committed:
        bucket = count.bit_length() - 1
        buckets.extend([0] * (bucket + 1 - len(buckets)))
        buckets[bucket] += 1
    peak = max(buckets, default=1)
    lines = []
    for bucket, iterations in enumerate(buckets):
        low, high = 2 ** bucket, 2 ** (bucket + 1) - 1
        span = str(low) if low == high else f"{low}-{high}"
        bar = "#" * (-(-HISTOGRAM_WIDTH * iterations // peak))  # ceil: a non-empty bucket shows
        lines.append(f"  {span:>9} tokens | {bar} {iterations}")
    return "\n".join(lines)


def _percent(share: Optional[float]) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def run_summary(run: Run) -> str:
    result, config = run.result, run.config
    tokens = result.tokens.shape[1]
    return "\n".join([
        f"{run.label}: coupler {config.coupler}, window {config.window}"
        + (f" ({widths_used(result.windows)})" if config.window == AUTO_WINDOW else "")
        + f", seed {config.seed}, "
        f"batch {result.tokens.shape[0]}",
        f"NFE {result.nfe} for {tokens} tokens (AR: {tokens}): speedup {run.speedup:.2f}x in calls, "
        f"{result.tokens_per_call:.2f} tokens/call, mean acceptance {_percent(run.acceptance)}",
        "iterations by tokens committed:",
        commit_histogram(result.committed),
        f"wall {run.wall_s:.2f} s: prefill {result.prefill_s:.2f} s, forward {result.forward_s:.2f} s, "
        f"sampling {result.sample_s:.2f} s, decode {run.decode_s:.2f} s",
    ])


def compare_table(runs: Sequence[Run]) -> str:
    header = ("mode", "window", "NFE", "speedup", "tokens/call", "acceptance", "wall s")
    rows = [header] + [(run.label, str(run.config.window), str(run.result.nfe), f"{run.speedup:.2f}x",
                        f"{run.result.tokens_per_call:.2f}", _percent(run.acceptance), f"{run.wall_s:.2f}")
                       for run in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))) for row in rows)


# ---------------------------------------------------------------- images

def to_pil(images: torch.Tensor, vertical: bool = False) -> Image.Image:
    """(batch, H, W, 3) floats in 0..1 as one RGB image, the batch side by side (or stacked)."""
    joined = torch.cat(list(images), dim=0 if vertical else 1)
    pixels = (joined.float().clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()
    return Image.fromarray(pixels, "RGB")


def labelled_columns(panels: Sequence[tuple[str, Image.Image]]) -> Image.Image:
    """Panels side by side, each under its label, in columns as wide as panel or label plus a margin."""
    font = ImageFont.load_default()
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    widths = [max(panel.width, int(measure.textlength(label, font=font))) + 2 * LABEL_PADDING
              for label, panel in panels]
    height = LABEL_HEIGHT + max(panel.height for _, panel in panels)
    sheet = Image.new("RGB", (sum(widths), height), "white")
    draw = ImageDraw.Draw(sheet)
    left = 0
    for (label, panel), width in zip(panels, widths):
        draw.text((left + width // 2, LABEL_HEIGHT // 2), label, fill="black", font=font, anchor="mm")
        sheet.paste(panel, (left + (width - panel.width) // 2, LABEL_HEIGHT))
        left += width
    return sheet


# ---------------------------------------------------------------- generate

def run_generate(args: argparse.Namespace) -> int:
    config = sampler_config(args)  # every setting is checked before the weights are read
    check_device(args.device)
    check_output(args.output)
    if (args.width == 0) != (args.height == 0):
        raise ValueError(f"give both --width and --height, or neither (got {args.width} x {args.height})")
    model = load_model(args.model, device=args.device, dtype=args.dtype, compile=args.compile)
    set_image_size(model, args.width, args.height)
    cond = model.encode(args.prompt, args.negative_prompt)
    if args.compare:
        runs = [run_once(model, cond, replace(config, coupler=coupler, window=window or config.window),
                         args.batch_size)
                for coupler, window in COMPARE_MODES]
        sheet = labelled_columns([(f"{run.label} NFE {run.result.nfe}", to_pil(run.images, vertical=True))
                                  for run in runs])
        sheet.save(args.output, format="PNG")
        print(compare_table(runs))
    else:
        run = run_once(model, cond, config, args.batch_size)
        to_pil(run.images).save(args.output, format="PNG")
        print(run_summary(run))
    print(f"wrote {args.output}")
    return 0


# Subcommands: name -> (help, add its arguments, run it and return the exit code).
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "generate": ("generate images with AR, SJD or SCD decoding", add_generate_arguments, run_generate),
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m scd_core",
                     description="Lossless speculative Jacobi / coupled decoding for autoregressive image models.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (summary, add_arguments, _) in COMMANDS.items():
        add_arguments(commands.add_parser(name, help=summary, description=summary))
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit code (0 done, 2 bad input)."""
    parser = build_parser()
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as done:  # --help; an in-process caller gets the code instead of an exit
            return int(done.code or 0)
        if args.command is None:
            parser.print_help(sys.stderr)
            return EXIT_BAD_INPUT
        return COMMANDS[args.command][2](args)
    except (ModelLoadError, ModelOutputError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
