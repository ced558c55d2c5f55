"""NFE tables: model calls, tokens per call, acceptance and draft flicker for AR / SJD / SCD side by side
(synthetic grids, a loaded model, the cost of one window call at a published shape)."""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Optional, Sequence

import torch

from ..decoding.config import SamplerConfig
from ..decoding.engine import generate
from ..decoding.sampling import Sampling, to_probs
from .synthetic import GridModel
from .tables import markdown

METHODS = (("AR", "independent"), ("SJD", "independent"), ("SCD-maximal", "maximal"), ("SCD-gumbel", "gumbel"),
           ("faithful", "faithful"))
# The NFE tables also show SJD with block verification (exact with independent drafts only) and SCD with a
# second candidate for the first draft of every call (a tree of two chains).
NFE_METHODS = (METHODS[:2] + (("SJD-block", "independent"),) + METHODS[2:3] + (("SCD-maximal-cand2", "maximal"),)
               + METHODS[3:])
OPTIONS = {"SJD-block": dict(verification="block"), "SCD-maximal-cand2": dict(candidates=2)}
SHARPNESS = (("high", 0.5), ("medium", 1.5), ("low", 2.5))  # per-token entropy about 6.5 / 4 / 2.2 nats


def mean_entropy(model: Any, tokens: torch.Tensor, sampling: Sampling = Sampling()) -> float:
    """Mean entropy (nats) of the distribution sampled from (`sampling`'s guidance and filters) along sampled
    sequences, over the positions the model samples (its forced ones left out)."""
    session = model.start(None, tokens.shape[0])
    first, first_uncond = session.prefill()
    rest, rest_uncond = session.forward(tokens[:, :-1])
    logits = torch.cat([first, rest], dim=1)
    uncond = None if first_uncond is None else torch.cat([first_uncond, rest_uncond], dim=1)
    p = to_probs(logits, uncond, sampling)
    entropy = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
    forced = list(getattr(model, "forced_tokens", None) or {})
    sampled = torch.ones(tokens.shape[1], dtype=torch.bool)
    sampled[forced] = False
    return float(entropy[:, sampled].mean())


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


def window_rows(model: Any, methods: Sequence[tuple[str, str]], windows: Sequence[int],
                seeds: Sequence[int]) -> list[dict]:
    """`measure` of each (label, coupler) of `methods` at each window (AR at window 1 only), without a prompt."""
    return [dict(method=label, window=window, **measure(model, None, SamplerConfig(coupler=coupler, window=window),
                                                        seeds))
            for label, coupler in methods for window in ([1] if label == "AR" else windows)]


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
    from .shapes import model_benchmark
    from ..models.loading import load_model

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
    from .shapes import SHAPE_NAMES, shape_benchmark

    rows = shape_benchmark(size, device=device, dtype=dtype, layers=layers)
    return (f"{SHAPE_NAMES[size]}-shaped backbone with random weights, one window after a {rows[0]['prefix']}-token "
            f"prefix, CFG double batch, {rows[0]['device']} {rows[0]['dtype']}, {rows[0]['layers']} of "
            f"{rows[0]['full_layers']} layers\n\n"
            + markdown(rows, ("window", "seconds", "ratio", "per_layer_ms", "full_depth_s")))
