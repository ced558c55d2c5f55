"""What holds in bfloat16: the demo images that differ where float32 gives the same tokens.

    python -m scd_core.bench bf16 --seeds 8

In float32 on this CPU the tests show equal tokens for faithful across widths, for a batch row against its seed
alone and for compiled against eager calls (tests/test_reproducible.py, tests/test_compile.py).  In bfloat16 a
call of another width, a batched call or a compiled kernel can round a position's logits differently, and a
draw that falls on such an edge picks another token (the image goes its own way from there; its law is the
same).  Each row counts the seeds whose image differs in any token from its reference, all with faithful.

    python -m scd_core.bench bf16-stand-in --seeds 64

The Janus-Pro-1B-shaped stand-in (random weights, bfloat16, the CFG double batch) is too slow here for whole
images at every window (a 16-wide call takes seconds on this CPU, and its near-uniform random logits accept
few drafts), so its share is measured teacher-forced: one image sampled at window 1 (faithful's draw with fresh
noise), then its positions' logits computed again over the same tokens by calls of another layout: each pinned
width back to back, and the automatic window's widths in the order it picks them on the stand-in's grid under
the stand-in's cost profile.  (A real run's calls overlap, each starting after the last commit; what rounds
apart is the call's width, its matrix shapes, so where a call starts matters little.)  faithful's token at a
position is the Gumbel-max of that position's distribution under noise fixed by the seed and the position, so
an image of a seed differs between two layouts exactly where, at some position along its prefix, the two
distributions' Gumbel-max differ under its noise.  Each "seed" here is one fresh noise draw per position over
the one teacher-forced prefix: the estimate takes the positions' flips to behave alike along any image's prefix.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import torch

from ..decoding.config import SamplerConfig
from ..decoding.engine import generate
from ..decoding.sampling import Sampling, gumbel_argmax, to_probs
from .tables import markdown

WINDOW = 32
STAND_IN_CFG = 5.0  # Janus-Pro's default guidance


def bf16_table(seeds: Sequence[int]) -> str:
    from ..models.loading import load_model

    eager = load_model("demo", "cpu", "bfloat16")
    cond = eager.encode("7")

    def tokens(model, window: int, seed: int, batch_size: int = 1) -> torch.Tensor:
        config = SamplerConfig(coupler="faithful", window=window, seed=seed)
        return generate(model, cond, config, batch_size=batch_size).tokens

    alone = [tokens(eager, WINDOW, seed)[0] for seed in seeds]
    ar = [tokens(eager, 1, seed)[0] for seed in seeds]
    batched = tokens(eager, WINDOW, seeds[0], len(seeds))  # row i is seed seeds[0] + i
    with warnings.catch_warnings(record=True) as caught:  # a failed compile runs eagerly: say so, not "equal"
        warnings.simplefilter("always", RuntimeWarning)
        compiled_model = load_model("demo", "cpu", "bfloat16", compile=True)
        compiled = [tokens(compiled_model, WINDOW, seed)[0] for seed in seeds]
    failed = [str(w.message) for w in caught if "eagerly" in str(w.message)]

    def differ(others: Sequence[torch.Tensor]) -> str:
        return f"{sum(not torch.equal(a, b) for a, b in zip(alone, others))}/{len(seeds)}"

    rows = [{"comparison": f"window {WINDOW} against window 1 (plain AR)", "differ": differ(ar)},
            {"comparison": f"row of a batch of {len(seeds)} against its seed alone (window {WINDOW})",
             "differ": differ(list(batched))},
            {"comparison": f"compiled against eager calls (window {WINDOW})",
             "differ": f"not measured: {failed[0][:120]}" if failed else differ(compiled)}]
    return (f"**demo in bfloat16, faithful, seeds {seeds[0]}-{seeds[-1]}**: images that differ from the reference "
            f"in any token (float32: none)\n\n{markdown(rows, ('comparison', 'differ'))}")


def _gumbel(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    return -torch.log(-torch.log(torch.rand(shape, generator=generator).clamp_(1e-12, 1 - 1e-7)))


def _probs(logits: Sequence[torch.Tensor]) -> torch.Tensor:
    """(cond, uncond) logits (1, T, V) -> the stand-in's distributions (T, V) at Janus-Pro's default guidance."""
    return to_probs(logits[0], logits[1], Sampling(cfg_scale=STAND_IN_CFG))[0]


def stand_in_layouts(widths: Sequence[int]) -> dict[str, list[int]]:
    """The width of each call over the image, by name: each pinned width, and "auto": the widths the automatic
    window picks, in their order, on the stand-in's grid under the stand-in's cost profile on this CPU (the
    calls table's setting, `bench faithful`)."""
    import itertools
    import math

    from ..windows import auto_window
    from .faithful import MEDIUM_SHARPNESS, STAND_IN_PROFILE
    from .synthetic import GridModel

    grid = GridModel(rows=24, cols=24, vocab_size=16384, sharpness=MEDIUM_SHARPNESS)
    auto_window.remember_costs(grid, 1, STAND_IN_PROFILE)
    chosen = generate(grid, None, SamplerConfig(window="auto", seed=0)).windows[1:]
    image = grid.num_tokens - 1  # the positions after the prefill's
    layouts = {str(width): [width] * math.ceil(image / width) for width in widths}
    auto = list(itertools.accumulate(chosen))  # the calls, in their order, until they cover the image
    return layouts | {"auto": chosen[:next((i + 1 for i, end in enumerate(auto) if end >= image), len(chosen))]}


def stand_in_logits(layouts: dict[str, list[int]]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The stand-in's (cond, uncond) logits (1, N - 1, V) of image positions 1 .. N - 1 by layout: "1" samples
    the image one position a call (Gumbel-max, fresh noise); each layout of `layouts` is fed the same tokens in
    calls of its widths."""
    from .device_check import SHAPES, ShapeModel, build

    torch.manual_seed(0)
    shape = SHAPES[0]
    module, head = build(shape, torch.device("cpu"), torch.bfloat16, tiny=False)
    model = ShapeModel(shape, module, head)
    generator = torch.Generator().manual_seed(1)
    logits: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    with torch.no_grad():
        session = model.start(None, 1)
        first = session.prefill()
        token = gumbel_argmax(_probs(first)[-1:], _gumbel((1, model.vocab_size), generator))
        tokens, steps = [token], []
        for _ in range(model.num_tokens - 1):  # window 1: plain AR, one position a call
            step = session.forward(tokens[-1].view(1, 1))
            steps.append(step)
            tokens.append(gumbel_argmax(_probs(step), _gumbel((1, model.vocab_size), generator)))
        logits["1"] = tuple(torch.cat([s[b].float() for s in steps], dim=1) for b in range(2))
        session.rewind(model.num_tokens - 1)
        fed = torch.cat(tokens[:-1]).view(1, -1)
        for name, widths in layouts.items():
            starts = [sum(widths[:i]) for i in range(len(widths))]
            chunks = [session.forward(fed[:, start:start + width])
                      for start, width in zip(starts, widths) if start < fed.shape[1]]
            logits[name] = tuple(torch.cat([c[b].float() for c in chunks], dim=1) for b in range(2))
            session.rewind(fed.shape[1])
    return logits


def stand_in_table(seeds: int, widths: Sequence[int]) -> str:
    """Share of the stand-in's images (one per noise draw) that differ between two layouts of calls: each
    against window 1's, neighbouring widths, and the automatic window's against its most common width."""
    import collections

    layouts = stand_in_layouts(widths)
    logits = stand_in_logits(layouts)
    commonest = str(collections.Counter(layouts["auto"]).most_common(1)[0][0])
    pairs = [(name, "1") for name in layouts] + [(str(a), str(b)) for a, b in zip(widths, widths[1:])]
    pairs.append(("auto", commonest if commonest in layouts else str(widths[0])))
    generator = torch.Generator().manual_seed(2)
    rows = []
    for name, reference_name in pairs:
        reference, other = _probs(logits[reference_name]), _probs(logits[name])
        differs = torch.zeros(seeds, dtype=torch.bool)
        flips = 0
        for position in range(reference.shape[0]):
            noise = _gumbel((seeds, reference.shape[1]), generator)
            flipped = gumbel_argmax(reference[position], noise) != gumbel_argmax(other[position], noise)
            differs |= flipped
            flips += int(flipped.sum())
        gap = (logits[name][0] - logits[reference_name][0]).abs()
        rows.append({"calls": f"window {name}", "against": f"window {reference_name}",
                     "images_differ": f"{int(differs.sum())}/{seeds}",
                     "flips_per_position": flips / (seeds * reference.shape[0]),
                     "max_logit_diff": float(gap.max()), "mean_logit_diff": float(gap.mean())})
    auto = ", ".join(f"{count} call{'s' * (count != 1)} of {width}"
                     for width, count in collections.Counter(layouts["auto"]).most_common())
    return (f"**Janus-Pro-1B-shaped stand-in in bfloat16** (random weights, CPU, CFG {STAND_IN_CFG:g}, "
            f"{reference.shape[0] + 1} positions; teacher-forced, {seeds} noise draws; window auto: {auto}): "
            "images that differ in any token between two layouts of calls, the share of positions whose token "
            "flips, and how far the cond logits moved\n\n" + markdown(rows, list(rows[0])))


def _call_ms(model, cond, width: int, repeats: int) -> float:
    """Mean ms of one `width`-wide window call (after one warm-up) over a prefilled session."""
    import time

    tokens = torch.zeros(1, width, dtype=torch.long)
    with torch.no_grad():
        session = model.start(cond, 1)
        session.prefill()
        session.forward(tokens)
        session.rewind(width)
        start = time.perf_counter()
        for _ in range(repeats):
            session.forward(tokens)
            session.rewind(width)
    return 1000 * (time.perf_counter() - start) / repeats


PREFILL_TOKENS = 4096  # a long prompt (an image in it): its prefill re-reads the weights once per tile
PREFILL_LAYERS = 2     # of the stand-in's 24: the ratio is the question, a whole 1B prefill takes minutes here


def _prefill_ms() -> float:
    """ms of one prefill of PREFILL_TOKENS prompt tokens (CFG: twice the rows) at the Janus-Pro-1B shape, with
    PREFILL_LAYERS of its layers."""
    import dataclasses
    import time

    from .device_check import SHAPES, ShapeModel, build

    shape = dataclasses.replace(SHAPES[0], config={**SHAPES[0].config, "num_hidden_layers": PREFILL_LAYERS},
                                prefix=PREFILL_TOKENS)
    model = ShapeModel(shape, *build(shape, torch.device("cpu"), torch.bfloat16, tiny=False))
    with torch.no_grad():
        start = time.perf_counter()
        model.start(None, 1).prefill()
    return 1000 * (time.perf_counter() - start)


def invariant_cost_table(widths: Sequence[int], repeats: int, seeds: Sequence[int], stand_in: bool) -> str:
    """What the window-invariant calls (scd_core.compiled.invariant) cost in bfloat16 against today's calls, the
    two interleaved in one process: one call of each width on the demo (and the Janus-Pro-1B stand-in, with a
    prefill of PREFILL_TOKENS tokens), and the demo's whole images (faithful) at windows 1, 32 and auto."""
    import os
    import time
    from unittest import mock

    from ..compiled import invariant
    from ..models.loading import load_model
    from .device_check import SHAPES, ShapeModel, build

    def under(policy: str, measure):
        with mock.patch.dict(os.environ, {invariant.POLICY_VARIABLE: policy}):
            return measure()

    demo = load_model("demo", "cpu", "bfloat16")
    models = [("demo", demo, demo.encode("3"), repeats)]
    if stand_in:
        module, head = build(SHAPES[0], torch.device("cpu"), torch.bfloat16, tiny=False)
        models.append(("Janus-Pro-1B stand-in", ShapeModel(SHAPES[0], module, head), None, 1))
    rows = []
    for name, model, cond, count in models:
        for width in widths:
            old, new = (under(policy, lambda: _call_ms(model, cond, width, count)) for policy in ("off", "auto"))
            rows.append({"model": name, "what": f"one call of width {width}", "today_ms": old, "invariant_ms": new,
                         "ratio": new / old})
    if stand_in:
        old, new = (under(policy, _prefill_ms) for policy in ("off", "auto"))
        rows.append({"model": f"Janus-Pro-1B stand-in, {PREFILL_LAYERS} layers", "ratio": new / old,
                     "what": f"prefill of {PREFILL_TOKENS} tokens", "today_ms": old, "invariant_ms": new})
    cond = models[0][2]
    for window in (1, 32, "auto"):
        def images() -> tuple[float, float]:
            start = time.perf_counter()
            calls = [generate(demo, cond, SamplerConfig(window=window, seed=seed)).nfe for seed in seeds]
            return (time.perf_counter() - start) / len(seeds), sum(calls) / len(calls)
        (old, old_calls), (new, new_calls) = (under(policy, images) for policy in ("off", "auto"))
        rows.append({"model": "demo", "what": f"image at window {window} ({old_calls:.1f} / {new_calls:.1f} calls)",
                     "today_ms": 1000 * old, "invariant_ms": 1000 * new, "ratio": new / old})
    return (f"**bfloat16 on this CPU ({torch.get_num_threads()} threads): today's calls against window-invariant "
            f"calls** (demo images: seeds {seeds[0]}-{seeds[-1]}, mean calls today / invariant)\n\n"
            + markdown(rows, list(rows[0])))
