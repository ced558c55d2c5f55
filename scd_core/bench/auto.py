"""Wall time per image: the automatic window against fixed windows, on this machine.

`python -m scd_core.bench --auto` times the demo model and a Janus-Pro-1B-shaped stand-in: a synthetic
24 x 24 grid model over 16384 codes (medium entropy, so the acceptance is an image model's) whose every
call also runs a random-weight Janus-Pro-1B-shaped backbone and image head at the call's width, so that
a call costs what it would cost that model here.  Runs are interleaved (seed by seed, every window in turn)
so that load from elsewhere on the machine falls on all windows alike; the first auto run, which measures
the costs, is a warm-up and is reported apart.

The same command also checks the chooser against cost profiles this machine does not have: for a GPU-like
profile (a call of 64 tokens costs 1.15x one of 1) and a steep CPU-like one (13x), each model's time per image
is the sum of the profile's cost over the calls the engine makes, fixed windows and auto alike.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Optional, Sequence

import torch

from .. import auto_window
from .nfe import SHARPNESS
from .tables import markdown
from ..config import SamplerConfig
from ..engine import generate
from .synthetic import GridModel

WINDOWS: tuple = (8, 16, 32, 64, "auto")
MEDIUM_SHARPNESS = 1.5
PROFILES = {  # seconds per call by width, relative
    "GPU-like (64 costs 1.15x)": {1: 1.0, 2: 1.0, 4: 1.01, 8: 1.02, 16: 1.04, 32: 1.08, 64: 1.15},
    "CPU-like (64 costs 13x)": {1: 1.0, 2: 1.3, 4: 1.7, 8: 2.5, 16: 4.0, 32: 7.0, 64: 13.0},
}
PROFILE_WINDOWS: tuple = (4, 8, 16, 32, 64, "auto")


class ShapedGridModel(GridModel):
    """A GridModel whose calls cost what a Janus-Pro-shaped call of the same width costs on this device."""

    def __init__(self, size: str = "1B", layers: int = 4, context: int = 352, device: str = "cpu",
                 dtype: Optional[torch.dtype] = None) -> None:
        from .shapes import JANUS_SHAPES, _build_backbone
        from ..models.janus import cache_keyword, new_cache

        super().__init__(rows=24, cols=24, vocab_size=16384, sharpness=MEDIUM_SHARPNESS, device=device)
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


def time_windows(model: Any, cond: Any, windows: Sequence, seeds: Sequence[int]) -> list[dict[str, Any]]:
    """Median seconds per image for each window (maximal coupling), runs interleaved across windows."""
    started = time.perf_counter()
    generate(model, cond, SamplerConfig(window="auto", seed=seeds[0]))  # measures the costs once
    measure_s = time.perf_counter() - started
    runs: dict[Any, list] = {w: [] for w in windows}
    for seed in seeds:
        for window in windows:
            runs[window].append(generate(model, cond, SamplerConfig(window=window, seed=seed)))
    rows = []
    for window, results in runs.items():
        used: dict[int, int] = {}
        for result in results:
            for width in result.windows[1:]:
                used[width] = used.get(width, 0) + 1
        common = sorted(used.items(), key=lambda item: -item[1])[:3]
        rows.append(dict(window=window, nfe=statistics.mean(r.nfe for r in results),
                         seconds=statistics.median(r.total_s for r in results),
                         widths=" ".join(f"{w}x{n}" for w, n in common) if window == "auto" else "-"))
    best = min(r["seconds"] for r in rows if r["window"] != "auto")
    for row in rows:
        row["vs_best_fixed"] = row["seconds"] / best
    rows[-1]["widths"] += f" (first run, which measured the costs: {measure_s:.1f} s)"
    return rows


def profile_rows(seeds: Sequence[int]) -> list[dict[str, Any]]:
    """Time per image under each cost profile (sum of per-call costs), relative to the best fixed window."""
    from ..models.loading import load_model

    demo = load_model("demo")
    models = [("demo", demo, demo.encode("7"))]
    models += [(f"grid 24x24, {name} entropy", GridModel(24, 24, 16384, sharpness), None)
               for name, sharpness in SHARPNESS]
    rows = []
    for profile, costs in PROFILES.items():
        for name, model, cond in models:
            auto_window.remember_costs(model, 1, costs)
            seconds = {}
            for window in PROFILE_WINDOWS:
                results = [generate(model, cond, SamplerConfig(window=window, seed=seed)) for seed in seeds]
                seconds[window] = statistics.mean(sum(auto_window.cost_of_width(costs, w) for w in r.windows[1:])
                                                  for r in results)
            fixed = {w: t for w, t in seconds.items() if w != "auto"}
            best = min(fixed, key=fixed.get)
            rows.append(dict(profile=profile, model=name, best_fixed=best,
                             auto_vs_best=seconds["auto"] / fixed[best],
                             **{f"w{w}_vs_best": fixed[w] / fixed[best] for w in fixed}))
    return rows


def auto_tables(seeds: Sequence[int], layers: int = 4) -> str:
    from ..models.loading import load_model

    torch.set_grad_enabled(False)
    demo = load_model("demo")
    parts = [f"**demo** (prompt '7', maximal coupling, median of {len(seeds)} seeds)\n\n"
             + markdown(time_windows(demo, demo.encode("7"), WINDOWS, seeds),
                        ("window", "nfe", "seconds", "vs_best_fixed", "widths"))]
    shaped = ShapedGridModel(layers=layers)
    parts.append(f"**Janus-Pro-1B-shaped** (synthetic 24 x 24 grid, 16384 codes, medium entropy; each call also "
                 f"runs a random Janus-Pro-1B-shaped backbone of {layers} layers at its width; median of "
                 f"{len(seeds)} seeds)\n\n"
                 + markdown(time_windows(shaped, None, WINDOWS, seeds),
                            ("window", "nfe", "seconds", "vs_best_fixed", "widths")))
    parts.append(f"**Other cost profiles** (time = sum of the profile's per-call cost over the calls made; mean of "
                 f"{len(seeds)} seeds)\n\n"
                 + markdown(profile_rows(seeds), ("profile", "model", "best_fixed", "auto_vs_best",
                                                  *(f"w{w}_vs_best" for w in PROFILE_WINDOWS[:-1]))))
    return "\n\n".join(parts)
