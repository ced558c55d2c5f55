"""Wall time per image: the automatic window against pinned windows, in fresh processes, on this machine.

`python -m scd_core.bench auto` starts fresh processes one after the other for the demo model and for a
Janus-Pro-1B-shaped stand-in: a synthetic 24 x 24 grid model over 16384 codes (medium entropy, so the
acceptance is an image model's) whose every call also runs a random-weight Janus-Pro-1B-shaped backbone
(`--layers` of its 24 layers) and image head at the call's width, so that a call costs what it would cost
that model here.  Each process makes one automatic image (its first call times the widths: the seeds of the
cost estimates), then rounds of one automatic image and one at each pinned window, seed for seed, so that
load from elsewhere falls on all windows alike.  The first process's timed calls run under a burst of load: a
busy-loop process for BURST_S seconds, started with them; the images compared start after it ends.

The same command also checks the chooser against cost profiles this machine does not have: for a GPU-like
profile (a call of 64 tokens costs 1.15x one of 1) and a steep CPU-like one (13x), each model's time per image
is the sum of the profile's cost over the calls the engine makes, fixed windows and auto alike, and auto with
its exploration against auto without; and how commits per call grow with the width beyond what the counts at
one width show, on pinned windows (the exponent the chooser takes to be REFINEMENT).
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from ..windows import auto_window
from ..windows.auto_window import AutoWindow
from .nfe import SHARPNESS
from .tables import markdown
from ..decoding.config import SamplerConfig
from ..decoding.engine import generate
from .synthetic import GridModel

PINNED: tuple = (8, 16, 32, 64)  # the windows an automatic image is held against
BURST_S = 1.0  # seconds of the busy loop started with the first process's timed calls
MEDIUM_SHARPNESS = 1.5
PROFILES = {  # seconds per call by width, relative
    "GPU-like (64 costs 1.15x)": {1: 1.0, 2: 1.0, 4: 1.01, 8: 1.02, 16: 1.04, 32: 1.08, 64: 1.15},
    "CPU-like (64 costs 13x)": {1: 1.0, 2: 1.3, 4: 1.7, 8: 2.5, 16: 4.0, 32: 7.0, 64: 13.0},
}
HERE = {  # this CPU's profiles (the timed passes above): the demo's, and the Janus-Pro-1B stand-in's
    "demo here (64 costs 2.1x)": {1: 1.0, 2: 1.02, 4: 1.05, 8: 1.1, 16: 1.25, 32: 1.5, 64: 2.1},
    "stand-in here (64 costs 4x)": {1: 1.0, 2: 1.1, 4: 1.25, 8: 1.5, 16: 2.0, 32: 2.8, 64: 4.0},
}
PROFILE_WINDOWS: tuple = (4, 8, 16, 32, 64, "auto")
PINNED_REPLAYED = PROFILE_WINDOWS[:-1]


class ShapedGridModel(GridModel):
    """A GridModel whose calls cost what a Janus-Pro-shaped call of the same width costs on this device."""

    def __init__(self, size: str = "1B", layers: int = 4, context: int = 352, device: str = "cpu",
                 dtype: Optional[torch.dtype] = None, side: int = 24) -> None:
        from .shapes import JANUS_SHAPES, _build_backbone
        from ..models.sessions.hf_cache import cache_keyword, new_cache

        super().__init__(rows=side, cols=side, vocab_size=16384, sharpness=MEDIUM_SHARPNESS, device=device)
        self.dtype = dtype or torch.float32
        self.backbone, self.head = _build_backbone(JANUS_SHAPES[size], layers, self.device, self.dtype)
        hidden = JANUS_SHAPES[size]["hidden_size"]
        self.embeds = (torch.randn(2, context + 64, hidden, generator=torch.Generator().manual_seed(0)) * 0.02
                       ).to(self.device, self.dtype)
        self.cache, self.keyword, self.context = new_cache(), cache_keyword(), context
        self.backbone(inputs_embeds=self.embeds[:, :context], use_cache=True, **{self.keyword: self.cache})

    def burn(self, width: int) -> None:
        """One CFG double-batch call of `width` tokens after `context` cached ones, then rewound."""
        out = self.backbone(inputs_embeds=self.embeds[:, self.context:self.context + width], use_cache=True,
                            **{self.keyword: self.cache})
        self.head(out.last_hidden_state)
        self.cache.crop(-width)

    def start(self, cond: Any, batch_size: int):
        session = super().start(cond, batch_size)
        forward = session.forward

        def shaped_forward(tokens: torch.Tensor):
            self.burn(tokens.shape[1])
            return forward(tokens)

        session.forward = shaped_forward
        return session


def bench_model(name: str, layers: int, side: int) -> tuple[Any, Any]:
    """(model, cond): "demo", or "janus-1b", the Janus-Pro-1B-shaped stand-in with `layers` layers on a grid of
    `side` x `side`."""
    if name == "demo":
        from ..models.loading import load_model

        demo = load_model("demo")
        return demo, demo.encode("7")
    return ShapedGridModel(layers=layers, side=side), None


def busy_loop(seconds: float) -> subprocess.Popen:
    """A process that keeps one core busy for `seconds`, returned once its loop runs."""
    code = ("import time\nprint(flush=True)\nend = time.perf_counter() + %r\n"
            "while time.perf_counter() < end:\n    pass\n" % seconds)
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    process.stdout.readline()
    return process


class ChooserClock:
    """While entered: the seconds automatic runs spend choosing widths and learning from calls (the policy's
    bookkeeping, outside the model's calls), and the choices that explored a neighbour of the best width."""

    def __enter__(self) -> "ChooserClock":
        self.seconds, self.explored = 0.0, 0
        self.saved = AutoWindow.choose, AutoWindow.observe, auto_window.CallCosts.stalest
        choose, observe, stalest = self.saved

        def timed(method: Callable) -> Callable:
            def run(policy: Any, *args: Any) -> Any:
                started = time.perf_counter()
                try:
                    return method(policy, *args)
                finally:
                    self.seconds += time.perf_counter() - started
            return run

        def exploring(costs: Any, widths: Sequence[int]) -> int:
            self.explored += 1  # the chooser asks for the stalest neighbour only when it explores
            return stalest(costs, widths)

        AutoWindow.choose, AutoWindow.observe = timed(choose), timed(observe)
        auto_window.CallCosts.stalest = exploring
        return self

    def __exit__(self, *exc: Any) -> None:
        AutoWindow.choose, AutoWindow.observe, auto_window.CallCosts.stalest = self.saved


def one_process(name: str, layers: int, side: int, images: int, burst: bool) -> dict[str, Any]:
    """What one fresh process sees: its first automatic image (which times the widths, under a burst of load
    when `burst`), then `images` - 1 rounds of one automatic image and one at each pinned window, seed for seed."""
    torch.set_grad_enabled(False)
    model, cond = bench_model(name, layers, side)
    measure, timed, bursts = auto_window.measure_costs, [], []

    def measured(call, widths):
        if burst:
            bursts.append(busy_loop(BURST_S))
        timed.append(measure(call, widths))
        return timed[-1]

    auto_window.measure_costs = measured
    first = generate(model, cond, SamplerConfig(window="auto", seed=0))
    for process in bursts:
        process.wait()  # the images compared come after the burst
    seconds: dict[str, list[float]] = {str(w): [] for w in ("auto",) + PINNED}
    calls = dict.fromkeys(seconds, 0)
    used: list[int] = []
    chooser_s, explored = 0.0, 0
    clock = ChooserClock()
    for seed in range(1, images):
        for window in ("auto",) + PINNED:
            with clock if window == "auto" else contextlib.nullcontext():
                result = generate(model, cond, SamplerConfig(window=window, seed=seed))
            seconds[str(window)].append(result.total_s)
            calls[str(window)] += result.nfe - 1
            if window == "auto":
                used += result.windows[1:]
                chooser_s, explored = chooser_s + clock.seconds, explored + clock.explored
    def commonest(windows: list[int]) -> str:
        return ", ".join(auto_window.widths_used(windows).split(", ")[:3])

    return dict(first_s=first.total_s, first_widths=commonest(first.windows), widths=commonest([1] + used),
                seconds=seconds, calls=calls, auto_widths=used, chooser_share=chooser_s / sum(seconds["auto"]),
                explored=explored / max(len(used), 1),
                timed={str(w): c for w, c in timed[0].items()})


def per_call_vs_pinned(run: dict[str, Any]) -> float:
    """The automatic images' seconds over what their calls would have taken at the pinned windows' seconds per
    call (a call of a width between pinned ones at the next wider one's, the narrowest's below it): what auto
    mode costs beyond its choice of widths, the chooser's bookkeeping and the timing noise between runs."""
    per_call = {w: sum(run["seconds"][str(w)]) / run["calls"][str(w)] for w in PINNED}
    pinned = sum(auto_window.cost_of_width(per_call, width) for width in run["auto_widths"])
    return sum(run["seconds"]["auto"]) / pinned


def fastest_pinned(seconds: dict[str, list[float]], part: slice = slice(None)) -> str:
    """The pinned window whose images took the least time on average over the seeds `part` picks."""
    return min((w for w in seconds if w != "auto"), key=lambda w: statistics.mean(seconds[w][part]))


def held_out_vs_best(seconds: dict[str, list[float]]) -> Optional[float]:
    """Auto's time over the best pinned window's, the best picked on the other half of the seeds (the odd
    ones pick for the even ones and the reverse, the two ratios averaged): the best of four noisy means is
    biased low, a window picked on other images is not.  None with fewer than two compared seeds."""
    if len(seconds["auto"]) < 2:
        return None
    ratios = []
    for pick, judge in ((slice(0, None, 2), slice(1, None, 2)), (slice(1, None, 2), slice(0, None, 2))):
        best = fastest_pinned(seconds, pick)
        ratios.append(statistics.mean(seconds["auto"][judge]) / statistics.mean(seconds[best][judge]))
    return statistics.mean(ratios)


def fresh_processes(name: str, processes: int, images: int, layers: int, side: int) -> list[dict[str, Any]]:
    """`one_process` in `processes` fresh interpreters one after the other, the first one disturbed."""
    rows = []
    root = Path(__file__).resolve().parents[2]
    for index in range(processes):
        code = ("import json, sys\nfrom scd_core.bench.auto import one_process\n"
                "print(json.dumps(one_process(*json.loads(sys.argv[1]))))")
        argument = json.dumps([name, layers, side, images, index == 0])
        done = subprocess.run([sys.executable, "-c", code, argument], cwd=root, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"benchmark process {index + 1} failed:\n{done.stderr[-3000:]}")
        run = json.loads(done.stdout.strip().splitlines()[-1])
        mean = {window: statistics.mean(times) for window, times in run["seconds"].items()}
        best = fastest_pinned(run["seconds"])
        timed, held_out = run["timed"], held_out_vs_best(run["seconds"])
        rows.append(dict(process=index + 1, burst=f"{BURST_S:g} s" if index == 0 else "-",
                         timed_64_vs_1=timed[max(timed, key=int)] / timed["1"],
                         first_vs_best=run["first_s"] / mean[best], first_widths=run["first_widths"],
                         best_pinned=best, best_s=mean[best], auto_s=mean["auto"],
                         auto_vs_best=mean["auto"] / mean[best],
                         held_out_vs_best="-" if held_out is None else held_out,
                         calls_vs_best=run["calls"]["auto"] / run["calls"][best],
                         per_call_vs_pinned=per_call_vs_pinned(run), chooser_share=run["chooser_share"],
                         explored=run["explored"], widths=run["widths"]))
        # what a cut-short run leaves, and each seed's seconds for another look at them
        print(f"  {name}: {json.dumps({**rows[-1], 'seconds': run['seconds']})}", file=sys.stderr, flush=True)
    return rows


PROCESS_COLUMNS = ("process", "burst", "timed_64_vs_1", "first_vs_best", "first_widths", "best_pinned", "best_s",
                   "auto_s", "auto_vs_best", "held_out_vs_best", "calls_vs_best", "per_call_vs_pinned",
                   "chooser_share", "explored", "widths")


def replay_models(side: int = 24, entropies: Sequence[tuple[str, float]] = SHARPNESS) -> list[tuple[str, Any, Any]]:
    """(name, model, cond) of the models replayed under fixed costs: the demo, and a synthetic `side` x `side`
    grid at each (name, sharpness) of `entropies`."""
    from ..models.loading import load_model

    demo = load_model("demo")
    return [("demo", demo, demo.encode("7"))] + [
        (f"grid {side}x{side}, {name} entropy", GridModel(side, side, 16384, sharpness), None)
        for name, sharpness in entropies]


def replayed_cost(model: Any, cond: Any, costs: dict[int, float], window: Any, seed: int) -> float:
    """One image's time under the cost profile `costs`: the sum of its calls' costs by width (no timing)."""
    result = generate(model, cond, SamplerConfig(window=window, seed=seed))
    return sum(auto_window.cost_of_width(costs, w) for w in result.windows[1:])


def refinement_rows(models: Sequence[tuple[str, Any, Any]], seeds: Sequence[int]) -> list[dict[str, Any]]:
    """The exponent REFINEMENT stands for, measured: for neighbouring pinned widths W < W',
    log(mean commits per call at W' / the chooser's estimate of them from the calls at W) / log(W' / W)
    ("up"), and from the calls at W' for W ("down")."""
    widths = PINNED_REPLAYED
    rows = []
    for name, model, cond in models:
        survival, mean = {}, {}  # per pinned width: the chooser's survival estimate from its calls, their commits
        for width in widths:
            chooser = auto_window.WindowChooser({w: 1.0 for w in auto_window.CANDIDATES})
            commits = []
            for seed in seeds:
                result = generate(model, cond, SamplerConfig(window=width, seed=seed))
                for call_width, committed in zip(result.windows[1:], result.committed[1:]):
                    chooser.observe(call_width, [0] * committed + [1])
                    commits.append(committed)
            survival[width], mean[width] = chooser.survival(), statistics.mean(commits)

        row: dict[str, Any] = {"model": name}
        for narrow, wide in zip(widths, widths[1:]):
            step = math.log(wide / narrow)
            row[f"up_{narrow}_{wide}"] = math.log(mean[wide] / sum(survival[narrow][:wide])) / step
            row[f"down_{wide}_{narrow}"] = math.log(sum(survival[wide][:narrow]) / mean[narrow]) / step
        rows.append(row)
    return rows


def profile_rows(models: Sequence[tuple[str, Any, Any]], seeds: Sequence[int]) -> list[dict[str, Any]]:
    """Time per image under each cost profile (sum of per-call costs), relative to the best fixed window, and
    what exploration costs there: auto against auto that never explores."""
    rows = []
    for profile, costs in PROFILES.items():
        for name, model, cond in models:
            def replay(window: Any) -> float:
                auto_window.remember_costs(model, 1, costs)  # the profile, and exploration's clock from 0
                return statistics.mean(replayed_cost(model, cond, costs, window, seed) for seed in seeds)

            seconds = {window: replay(window) for window in PROFILE_WINDOWS}
            explore_every, auto_window.EXPLORE_EVERY = auto_window.EXPLORE_EVERY, 10 ** 9
            try:
                never_exploring = replay("auto")
            finally:
                auto_window.EXPLORE_EVERY = explore_every
            fixed = {w: t for w, t in seconds.items() if w != "auto"}
            best = min(fixed, key=fixed.get)
            rows.append(dict(profile=profile, model=name, best_fixed=best,
                             auto_vs_best=seconds["auto"] / fixed[best],
                             exploring_vs_not=seconds["auto"] / never_exploring,
                             **{f"w{w}_vs_best": fixed[w] / fixed[best] for w in fixed}))
    return rows


class ProfileCosts(auto_window.CallCosts):
    """Costs seeded with the profile (as an exact timed pass would seed them), then learned as in a process
    from calls that cost exactly what the profile says: early exploration and learning run as on a device,
    without a device's noise."""

    def __init__(self, profile: dict[int, float]) -> None:
        super().__init__(profile)
        self.profile = profile

    def learn(self, width: int, seconds: float) -> None:
        super().learn(width, auto_window.cost_of_width(self.profile, width))


def process_replay_rows(models: Sequence[tuple[str, Any, Any]], profiles: dict[str, dict[int, float]],
                        exponents: Sequence[float], processes: int = 4, images: int = 5) -> list[dict[str, Any]]:
    """Whole processes replayed under fixed cost profiles, for each REFINEMENT in `exponents`: a process makes
    `images` automatic images; the mean cost of all but its first over the best pinned window's (mean over
    2 x `images` seeds), as the mean and the worst over `processes` processes.  With fixed costs nothing is
    learned (and no call explores early); `mean_learning` / `worst_learning`: the chosen REFINEMENT with costs
    learned from the calls as in a process (`ProfileCosts`)."""
    chosen, rows = auto_window.REFINEMENT, []
    for profile, costs in profiles.items():
        for name, model, cond in models:
            def cost(window: Any, seed: int) -> float:
                return replayed_cost(model, cond, costs, window, seed)

            auto_window.remember_costs(model, 1, costs)
            pinned = {w: statistics.mean(cost(w, seed) for seed in range(1000, 1000 + 2 * images))
                      for w in PINNED_REPLAYED}
            best = min(pinned, key=pinned.get)

            def later_images(fresh_costs: Callable[[], auto_window.CallCosts]) -> list[float]:
                """Each process's later images' mean cost over the best pinned window's."""
                ratios = []
                for process in range(processes):
                    auto_window.remember_costs(model, 1, fresh_costs())  # a fresh process: nothing learned yet
                    made = [cost("auto", 100 * process + image) for image in range(images)]
                    ratios.append(statistics.mean(made[1:]) / pinned[best])
                return ratios

            row: dict[str, Any] = dict(profile=profile, model=name, best_pinned=best)
            for exponent in exponents:
                auto_window.REFINEMENT = exponent
                try:
                    ratios = later_images(lambda: auto_window.CallCosts(costs, fixed=True))
                finally:
                    auto_window.REFINEMENT = chosen
                row[f"mean_{exponent:g}"], row[f"worst_{exponent:g}"] = statistics.mean(ratios), max(ratios)
            ratios = later_images(lambda: ProfileCosts(costs))
            row["mean_learning"], row["worst_learning"] = statistics.mean(ratios), max(ratios)
            rows.append(row)
    return rows


def process_replay_table(exponents: Sequence[float] = (0.25, 0.3, 0.35), processes: int = 4, images: int = 5
                         ) -> str:
    """`process_replay_rows` as the README's table."""
    models = replay_models(12, [("medium", MEDIUM_SHARPNESS)])  # the stand-in's grid
    rows = process_replay_rows(models, {**HERE, **PROFILES}, exponents, processes, images)
    return (f"**Whole processes under fixed costs** (REFINEMENT = {auto_window.REFINEMENT} chosen; {processes} "
            f"processes of {images} automatic images each: mean_R / worst_R = the mean / worst over the processes "
            f"of their later images' cost over the best pinned window's, with REFINEMENT = R)\n\n"
            + markdown(rows, tuple(rows[0])))


def auto_tables(seeds: Sequence[int], processes: Sequence[int] = (10,), images: Sequence[int] = (4,),
                layers: int = 2, side: int = 24) -> str:
    """The benchmark's tables; `processes` and `images` per process: the demo's, and (the last number) the
    stand-in's."""
    torch.set_grad_enabled(False)
    titles = {"demo": "**demo** (prompt '7', maximal coupling)",
              "janus-1b": f"**Janus-Pro-1B-shaped** (synthetic {side} x {side} grid, 16384 codes, medium entropy; "
                          f"each call also runs a random Janus-Pro-1B-shaped backbone of {layers} of its 24 "
                          f"layers at its width)"}
    parts = []
    for (name, title), started, count in zip(titles.items(), (processes[0], processes[-1]), (images[0], images[-1])):
        print(parts[-1] if parts else "", file=sys.stderr, flush=True)
        parts.append(f"{title}: {started} fresh processes, each {count} automatic images and {count - 1} at each "
                     f"pinned window {', '.join(map(str, PINNED))} (seeds 1..{count - 1} after the automatic seed 0); "
                     f"seconds are means per image over those seeds\n\n"
                     + markdown(fresh_processes(name, started, count, layers, side), PROCESS_COLUMNS))
    models = replay_models()
    parts.append(f"**Other cost profiles** (time = sum of the profile's per-call cost over the calls made; mean of "
                 f"{len(seeds)} seeds; exploring_vs_not: auto against auto that never explores)\n\n"
                 + markdown(profile_rows(models, seeds), ("profile", "model", "best_fixed", "auto_vs_best",
                                                          "exploring_vs_not",
                                                          *(f"w{w}_vs_best" for w in PINNED_REPLAYED))))
    parts.append(refinement_table(models, seeds))
    return "\n\n".join(parts)


def refinement_table(models: Sequence[tuple[str, Any, Any]], seeds: Sequence[int]) -> str:
    """`refinement_rows` as the README's table."""
    rows = refinement_rows(models, seeds)
    return (f"**Commit growth with width** (the exponent REFINEMENT = {auto_window.REFINEMENT} stands for; pinned "
            f"windows, {len(seeds)} seeds: up_W_W2 = log(mean commits at W2 / the chooser's estimate from the "
            f"calls at W) / log(W2 / W), down_W2_W the reverse)\n\n" + markdown(rows, tuple(rows[0])))
