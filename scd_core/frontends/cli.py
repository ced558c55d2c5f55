"""`python -m scd_core`: generate images from the command line and see what the decoding saved.

    python -m scd_core generate --model demo --prompt 7 -o out.png
    python -m scd_core generate --model demo --prompt 7 --compare --seeds 0-7 -o compare.png
    python -m scd_core batch jobs.jsonl --model demo --out out/ --seeds 0,1,2   (see batch_job.py)
    python -m scd_core fetch deepseek-community/Janus-Pro-1B --to ComfyUI/models/scd   (see fetch_command.py)
    python -m scd_core story --model models/scd/Emu3.5 --prompt "a hedgehog" --out story/   (see story_job.py)

--seeds is a list of seeds in both ("0,1,2", "0-7"): the seeds a comparison averages over, or each job's seeds.
Each run prints a line when it ends where the progress bar cannot draw (stderr is not a terminal: a log).

Each subcommand is one entry of COMMANDS (arguments + runner), so `bench` can be
added next to `generate` without touching the rest.  Bad input (a model folder
that cannot be loaded, invalid settings) ends with one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TextIO

import torch
from PIL import Image, ImageDraw, ImageFont
from tqdm import tqdm

from ..decoding import couplers
from ..windows import window_policies
from .batch_job import add_batch_arguments, run_batch, seed_list
from .fetch_command import add_fetch_arguments, run_fetch
from .story_job import add_story_arguments, run_story
from .cli_shared import (DEFAULTS, add_model_arguments, add_sampler_arguments, check_device, check_image_size,
                         decoder_settings, open_model, positive_int, sampler_config, to_pil)
from ..models.weights.checkpoints import ModelLoadError
from ..decoding.config import SamplerConfig
from ..decoding.engine import GenerationResult, IterationStats, ModelOutputError, generate
from ..model import unusual_settings
from ..models.families.emu3p5_auto import auto_size, for_run

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # the shell's code for Ctrl-C
# --compare: (coupler, window or None for the --window value); AR is window 1 by definition, drawn with the
# noise of the coupler whose tokens do not depend on the widths, so that its column next to AR shows the very
# same image; then the baseline, then the other couplers that take a column
SAME_AS_AR = couplers.names_where("width_free")[0]
COMPARE_MODES = ((SAME_AS_AR, 1), *((name, None) for name in sorted(
    couplers.names_where("compared"), key=lambda name: (name != SAME_AS_AR, name != couplers.BASELINE))))
HISTOGRAM_WIDTH = 40
# --compare's picture: panels scaled up (by a whole factor, pixels stay exact) to at least MIN_PANEL pixels
# wide, under a title and a two-line caption per column (method; its calls)
MIN_PANEL = 128
SHOWN_SEEDS = 2  # seeds whose images a --seeds comparison shows; the calls are averaged over all of them
TITLE_SIZE, CAPTION_SIZE = 15, 14
LINE_HEIGHT = 20  # pixels per line of title or caption
CAPTION_LINES = 3  # title, method, calls
PADDING = 8


class UsageError(ValueError):
    """A command line argparse rejects; reported like any other bad input."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of usage + message, see main()
        # "argument --dtype: ..." as the other errors name an option: "--dtype: ..."
        raise UsageError(f"{message.removeprefix('argument ')} (see '{self.prog} --help')")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each option's default, except where there is none to show (None: the model's; a flag) or
    where the help names it already."""

    def _get_help_string(self, action: argparse.Action) -> Optional[str]:
        if action.default is None or action.default is False or "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


# ---------------------------------------------------------------- arguments

def add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model")
    add_model_arguments(model)
    model.add_argument("--prompt", required=True, help='text prompt; for the demo model a digit, e.g. "7"')
    model.add_argument("--negative-prompt", help="negative prompt for the unconditional CFG branch")
    sampler = add_sampler_arguments(parser)
    sampler.add_argument("--seed", type=int, help=f"random seed (default: {DEFAULTS.seed})")
    sampler.add_argument("--batch-size", type=positive_int, default=1, help="images per run")
    sampler.add_argument("--size-auto", action="store_true",
                         help="Emu3.5 T2I: the model writes the image size for each seed (the authors' aspect "
                              "auto); no --width / --height, batch 1")
    out = parser.add_argument_group("output")
    out.add_argument("-o", "--output", required=True, type=Path,
                     help="PNG file; a batch is written side by side")
    out.add_argument("--compare", action="store_true",
                     help="run AR, SCD-faithful (AR's image), SJD, SCD-maximal and SCD-gumbel on the same seeds "
                          "and write them side by side")
    out.add_argument("--seeds", type=seed_list, metavar="SEEDS",
                     help="with --compare, instead of --seed: run every method on each of these seeds (0,1,2 or "
                          "0-7) and report the mean calls and their spread (one image's calls vary by about 10%%)")


def check_output(path: Path) -> None:
    if path.suffix.lower() != ".png":
        raise ValueError(f"--output must be a .png file, got {str(path)!r}")
    if not path.parent.resolve().is_dir():
        raise ValueError(f"--output: folder {str(path.parent)!r} does not exist")


# ---------------------------------------------------------------- running

class Progress:
    """The engine callback: a tqdm bar of committed tokens on `stream` when it is a terminal (none in a log),
    the per-slot acceptance totals and each call's (forward, sampling) seconds."""

    def __init__(self, label: str, num_tokens: int, stream: TextIO) -> None:
        self.bar = tqdm(total=num_tokens, desc=label, unit="token", file=stream, disable=None, dynamic_ncols=True)
        self.drafts, self.accepted = 0, 0.0
        self.call_seconds: list[tuple[float, float]] = []

    def __call__(self, stats: IterationStats) -> None:
        self.drafts += len(stats.acceptance)
        self.accepted += sum(stats.acceptance)
        self.call_seconds.append((stats.forward_s, stats.sample_s))
        self.bar.set_postfix_str(f"{stats.nfe} calls", refresh=False)
        self.bar.update(stats.total - self.bar.n)

    def close(self) -> None:
        self.bar.close()

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
    compile_s: Optional[tuple[float, float]] = None  # of the forward and sampling seconds; None: not compiled

    @property
    def speedup(self) -> float:
        return self.result.tokens.shape[1] / self.result.nfe  # AR needs one call per token

    @property
    def wall_s(self) -> float:
        return self.result.total_s + self.decode_s


def mode_label(config: SamplerConfig) -> str:
    return "AR" if config.window == 1 else couplers.coupler(config.coupler).label


def compile_seconds(widths: Sequence[int], calls: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """What the first call at each width took beyond a typical call of that width (the median of the others,
    else of all), as (forward, sampling) seconds: a compiled model compiles (and on CUDA captures) then, which
    would otherwise count as forward and sampling time.  The prefill (call 0) is left out."""
    by_width: dict[int, list[tuple[float, float]]] = {}
    for width, seconds in zip(widths[1:], calls[1:]):
        by_width.setdefault(width, []).append(seconds)
    extra = [0.0, 0.0]
    for part in range(2):
        overall = statistics.median(call[part] for call in calls[1:]) if len(calls) > 1 else 0.0
        for first, *others in by_width.values():
            typical = statistics.median(call[part] for call in others) if others else overall
            extra[part] += max(0.0, first[part] - typical)
    return extra[0], extra[1]


def run_once(model: Any, cond: Any, config: SamplerConfig, batch_size: int, label: str) -> Run:
    cond = for_run(model, cond, config, batch_size)  # an AutoSize prompt: the size written for this seed
    progress = Progress(label, model.num_tokens, sys.stderr)
    try:
        result = generate(model, cond, config, batch_size=batch_size, callback=progress)
    finally:
        progress.close()
    started = time.perf_counter()
    images = model.decode(result.tokens)
    # a compiled call's width is its bucket's, what the engine fed (`fed`), not the positions it decided
    compiled = compile_seconds(result.fed, progress.call_seconds) if getattr(model, "compiled", False) else None
    return Run(mode_label(config), config, result, images, time.perf_counter() - started, progress.acceptance,
               compiled)


def finished_line(run: Run, label: str, number: int, runs: int) -> str:
    """The line a run prints when it ends where no progress bar draws (a log)."""
    return (f"{label}: {run.result.nfe} model calls for {run.result.tokens.shape[1]} tokens, {run.wall_s:.1f} s"
            + (f" (run {number} of {runs})" if runs > 1 else ""))


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
    rows = result.tokens.shape[0]
    seeds = f"image of seed {config.seed}" if rows == 1 else \
        f"images of seeds {config.seed}-{config.seed + rows - 1} (row i: seed + i)"
    promise = (f" - the plain-AR {seeds} at any window, batch, worker or resume"
               if couplers.coupler(config.coupler).width_free else "")
    saved = (f" (AR: {tokens}): {run.speedup:.2f}x fewer calls, mean acceptance {_percent(run.acceptance)}"
             if result.nfe < tokens else ": one call per token, as plain AR sampling")
    return "\n".join([
        f"{run.label}: coupler {config.coupler}, window {window_policies.report(config.window, result.windows)}, "
        f"seed {config.seed}, batch {rows}{promise}",
        f"{result.nfe} model calls for {tokens} tokens{saved}",
        "model calls by tokens committed:",
        commit_histogram(result.committed),
        timing_line(run),
    ])


def timing_line(run: Run) -> str:
    """Where the wall time went; a compiled model's compilation apart from the forward and sampling time, and
    what of it ran eagerly."""
    result, (compile_forward, compile_sampling) = run.result, run.compile_s or (0.0, 0.0)
    line = (f"wall {run.wall_s:.2f} s: prefill {result.prefill_s:.2f} s, "
            f"forward {result.forward_s - compile_forward:.2f} s, sampling {result.sample_s - compile_sampling:.2f} s, "
            f"decode {run.decode_s:.2f} s")
    if run.compile_s is not None:
        line += f", compile {compile_forward + compile_sampling:.2f} s (first call of each width, beyond a typical one)"
    # a failed compile or graph capture ran that part eagerly: the same image, not the speed
    return "\n".join([line] + [f"ran eagerly (--compile): {reason}" for reason in result.eager_fallbacks])


def calls_of(runs: Sequence[Run]) -> list[int]:
    return [run.result.nfe for run in runs]


def calls_caption(runs: Sequence[Run]) -> str:
    """"55.8 ± 3.0 calls" (mean and standard deviation over the seeds), or "58 calls" where they all agree."""
    calls = calls_of(runs)
    if len(set(calls)) == 1:
        return f"{calls[0]} calls"
    return f"{statistics.fmean(calls):.1f} \u00b1 {statistics.stdev(calls):.1f} calls"


def compare_table(methods: Sequence[Sequence[Run]]) -> str:
    """One row per method: its calls (the mean over its seeds, their standard deviation and range) and the
    speed-up, acceptance and wall time they give."""
    header = ("mode", "window", "calls", "sd", "range", "speedup", "acceptance", "wall s")
    rows = [header]
    for runs in methods:
        calls, first = calls_of(runs), runs[0]
        several = len(calls) > 1
        mean = statistics.fmean(calls)
        accepted = [run.acceptance for run in runs if run.acceptance is not None]
        rows.append((first.label, window_policies.column(first.config.window, first.result.windows),
                     f"{mean:.1f}" if several else str(calls[0]),
                     f"{statistics.stdev(calls):.1f}" if several else "-",
                     f"{min(calls)}-{max(calls)}" if several else "-",
                     f"{first.result.tokens.shape[1] / mean:.2f}x",
                     _percent(statistics.fmean(accepted) if accepted else None),
                     f"{statistics.fmean(run.wall_s for run in runs):.2f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))) for row in rows)


def same_image_line(methods: Sequence[Sequence[Run]]) -> str:
    """On how many seeds SCD-faithful gave AR's very tokens (the first two of COMPARE_MODES), and the calls each
    took: all of them, in bfloat16 / float16 through the window-invariant calls
    (scd_core.compiled.invariant; with SCD_INVARIANT_CALLS=off a draw on a rounding edge of a logit can fall the other way there)."""
    ar, faithful = methods[0], methods[1]
    same = sum(torch.equal(a.result.tokens, f.result.tokens) for a, f in zip(ar, faithful))
    return (f"Same image from AR and {faithful[0].label} on {same} of {len(ar)} seed{'s' * (len(ar) > 1)}: "
            f"{statistics.fmean(calls_of(ar)):.1f} against {statistics.fmean(calls_of(faithful)):.1f} calls per "
            f"image")


# ---------------------------------------------------------------- images

def _font(size: int) -> ImageFont.ImageFont:
    try:  # Pillow >= 10.1 ships a scalable default font
        return ImageFont.load_default(size=size)
    except TypeError:
        return ImageFont.load_default()


def enlarged(panel: Image.Image) -> Image.Image:
    """`panel` scaled by the whole factor that makes it at least MIN_PANEL wide (each pixel a square block)."""
    factor = -(-MIN_PANEL // panel.width)
    return panel if factor == 1 else panel.resize((panel.width * factor, panel.height * factor), Image.NEAREST)


def stacked(panels: Sequence[Image.Image]) -> Image.Image:
    """Panels one under the other, PADDING apart."""
    sheet = Image.new("RGB", (max(panel.width for panel in panels),
                              sum(panel.height for panel in panels) + PADDING * (len(panels) - 1)), "white")
    top = 0
    for panel in panels:
        sheet.paste(panel, (0, top))
        top += panel.height + PADDING
    return sheet


def labelled_columns(title: Sequence[str], columns: Sequence[tuple[Sequence[str], Image.Image]]) -> Image.Image:
    """Title lines over columns, each a caption (lines) over its panel; columns as wide as panel or caption."""
    title_font, caption_font = _font(TITLE_SIZE), _font(CAPTION_SIZE)
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    widths = [max([panel.width] + [int(measure.textlength(line, font=caption_font)) for line in caption])
              + 2 * PADDING for caption, panel in columns]
    width = max([sum(widths)] + [int(measure.textlength(line, font=title_font)) + 2 * PADDING for line in title])
    caption_lines = max(len(caption) for caption, _ in columns)
    top = PADDING + LINE_HEIGHT * (len(title) + caption_lines)
    sheet = Image.new("RGB", (width, top + max(panel.height for _, panel in columns) + PADDING), "white")
    draw = ImageDraw.Draw(sheet)
    for i, line in enumerate(title):
        draw.text((width // 2, PADDING + LINE_HEIGHT * i + LINE_HEIGHT // 2), line, fill="black", font=title_font,
                  anchor="mm")
    left = (width - sum(widths)) // 2
    for (caption, panel), column in zip(columns, widths):
        for i, line in enumerate(caption):
            y = PADDING + LINE_HEIGHT * (len(title) + i) + LINE_HEIGHT // 2
            draw.text((left + column // 2, y), line, fill="black" if i == 0 else "#444444", font=caption_font,
                      anchor="mm")
        sheet.paste(panel, (left + (column - panel.width) // 2, top))
        left += column
    return sheet


def compare_sheet(methods: Sequence[Sequence[Run]]) -> Image.Image:
    """Each method's images of its first SHOWN_SEEDS seeds in a column (a seed's batch together), captioned
    with its calls."""
    first = methods[-1][0]
    tokens, seeds = first.result.tokens.shape[1], [run.config.seed for run in methods[0]]
    if len(seeds) == 1:
        title = [f"model calls for {tokens} tokens, window {first.config.window}, seed {seeds[0]}"]
    else:
        shown = ", ".join(map(str, seeds[:SHOWN_SEEDS]))
        title = [f"model calls for {tokens} tokens, window {first.config.window}",
                 f"mean \u00b1 sd over seeds {seed_text(seeds)}; images of seeds {shown}"]
    columns = [((runs[0].label, calls_caption(runs)),
                stacked([enlarged(to_pil(run.images, vertical=True)) for run in runs[:SHOWN_SEEDS]]))
               for runs in methods]
    return labelled_columns(title, columns)


# ---------------------------------------------------------------- generate

def seed_text(seeds: Sequence[int]) -> str:
    """Seeds as --seeds takes them: "5-7" when consecutive, else "0, 3, 9"."""
    if len(seeds) > 2 and list(seeds) == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def compare_configs(config: SamplerConfig, seeds: Sequence[int]) -> list[list[SamplerConfig]]:
    """--compare's runs: per method (COMPARE_MODES), one config per seed; each is checked on creation."""
    return [[replace(config, coupler=coupler, window=window or config.window, seed=seed) for seed in seeds]
            for coupler, window in COMPARE_MODES]


def chosen_seeds(args: argparse.Namespace) -> tuple[int, ...]:
    """--seeds, else --seed (one or the other)."""
    if args.seeds is None:
        return (DEFAULTS.seed if args.seed is None else args.seed,)
    if not args.compare:
        raise ValueError("--seeds goes with --compare (it averages each method's calls over the seeds); "
                         "one image: --seed")
    if args.seed is not None:
        raise ValueError("give --seed or --seeds, not both")
    return args.seeds


def run_all(model: Any, cond: Any, methods: Sequence[Sequence[SamplerConfig]], batch_size: int
            ) -> list[list[Run]]:
    """Each method's runs; where no progress bar draws (stderr is not a terminal), a line as each one ends."""
    log = not sys.stderr.isatty()
    total, runs = sum(map(len, methods)), []
    for configs in methods:
        runs.append([])
        for seeded in configs:
            label = mode_label(seeded) + (f" seed {seeded.seed}" if len(configs) > 1 else "")
            runs[-1].append(run_once(model, cond, seeded, batch_size, label))
            if log:
                print(finished_line(runs[-1][-1], label, sum(map(len, runs)), total), file=sys.stderr, flush=True)
    return runs


def run_generate(args: argparse.Namespace) -> int:
    seeds = chosen_seeds(args)
    config = sampler_config(args, seed=seeds[0])  # every setting is checked before the weights are read
    methods = compare_configs(config, seeds) if args.compare else [[config]]
    check_device(args.device)
    check_output(args.output)
    check_image_size(args.width, args.height)
    if args.size_auto and (args.width or args.batch_size != 1):
        raise ValueError("--size-auto lets the model write the size of one image: give no --width / --height and "
                         "--batch-size 1")
    decoding = decoder_settings(args)
    model = open_model(args.model, args.device, args.dtype, args.quantize, args.width, args.height,
                       args.compile, decoding, args.offload_stages)
    cond = model.encode(args.prompt, args.negative_prompt)
    if args.size_auto:
        cond = auto_size(model, cond)
    for warning in unusual_settings(model, config.cfg_scale, config.temperature):
        print(f"warning: {warning}", file=sys.stderr)
    runs = run_all(model, cond, methods, args.batch_size)
    if args.compare:
        compare_sheet(runs).save(args.output, format="PNG")
        print(compare_table(runs))
        print(same_image_line(runs))
    else:
        to_pil(runs[0][0].images).save(args.output, format="PNG")
        print(run_summary(runs[0][0]))
    print(f"wrote {args.output}")
    return 0


# Subcommands: name -> (help, add its arguments, run it and return the exit code).
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "generate": ("generate images with AR, SJD or SCD decoding", add_generate_arguments, run_generate),
    "batch": ("many images from a JOBS.jsonl file into a folder, resumable, optionally on Ray",
              add_batch_arguments, run_batch),
    "fetch": ("download a published model folder from the Hugging Face hub (resumable, checked, no code run)",
              add_fetch_arguments, run_fetch),
    "story": ("an interleaved Emu3.5 story, how-to or exploration: text and images into a folder",
              add_story_arguments, run_story),
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m scd_core",
                     description="Lossless speculative Jacobi / coupled decoding for autoregressive image models.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (summary, add_arguments, _) in COMMANDS.items():
        add_arguments(commands.add_parser(name, help=summary, description=summary, formatter_class=_HelpFormatter))
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
