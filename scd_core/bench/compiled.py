"""Eager against compiled (`load_model(..., compile=True)`): time per call and per image, compile time apart,
and where the time of a call goes.

    python -m scd_core.bench compile [--readme scd_core/bench/README.md]

Demo: AR (window 1) and SCD (maximal coupling, window 16) images, eager and compiled alternately, the same
seeds; the first compiled image of each window pays the compilation (reported apart, then excluded).
Janus-Pro-1B shape: one window call (backbone + image head, CFG double batch, after a cached prompt and half
an image) through the row attention, eager (keys sliced to the cached length) against compiled (one
compiled layer, the whole pre-sized cache with a device-built mask), on `layers` of the 24 layers and scaled
to the full depth; per image predicted from the calls the engine makes on a synthetic 24 x 24 grid.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Iterator, Optional

import torch

from ..compiled import compiled_regions, cuda_graphs
from ..decoding import engine
from ..decoding.config import SamplerConfig
from ..decoding.engine import generate
from ..models.loading import load_model, pick_device, pick_dtype
from ..models.sessions.row_attention import RowAttentionBackbone, attention_layer
from ..models.sessions.row_cache import RowCache
from .synthetic import GridModel
from .tables import markdown

DEMO_RUNS = (("AR", 1), ("SCD 16", 16))
JANUS_WIDTHS = (1, 16)
JANUS_CONTEXT = 64 + 288  # prompt + half the image: the cache a typical call attends to
JANUS_TOKENS = 576
MEDIUM_SHARPNESS = 1.5


def _image_seconds(model: Any, cond: Any, config: SamplerConfig) -> tuple[float, Any]:
    started = time.perf_counter()
    result = generate(model, cond, config)
    return time.perf_counter() - started, result


def demo_rows(seeds: list[int], device: torch.device, dtype: torch.dtype) -> list[dict[str, Any]]:
    eager = load_model("demo", device=device, dtype=dtype)
    compiled = load_model("demo", device=device, dtype=dtype, compile=True)
    cond = eager.encode("7")
    rows = []
    for label, window in DEMO_RUNS:
        first, _ = _image_seconds(compiled, cond, SamplerConfig(window=window, seed=seeds[0]))
        eager_s, compiled_s, calls, same = [], [], [], True
        for seed in seeds:
            config = SamplerConfig(window=window, seed=seed)
            seconds, a = _image_seconds(eager, cond, config)
            eager_s.append(seconds)
            seconds, b = _image_seconds(compiled, cond, config)
            compiled_s.append(seconds)
            calls.append(a.nfe)
            same &= torch.equal(a.tokens, b.tokens)
        image_eager, image_compiled = statistics.median(eager_s), statistics.median(compiled_s)
        nfe = statistics.median(calls)
        rows.append(dict(model="demo", method=label, calls=nfe, eager_ms_call=1000 * image_eager / nfe,
                         compiled_ms_call=1000 * image_compiled / nfe, eager_s_image=image_eager,
                         compiled_s_image=image_compiled, ratio=image_compiled / image_eager,
                         compile_s=first - image_compiled, same_tokens=same))
    return rows


def _janus_call_costs(layers: int, device: torch.device, dtype: torch.dtype, repeats: int = 5
                      ) -> tuple[dict[int, float], dict[int, float], dict[int, float]]:
    """Seconds per call by width: eager, compiled (warm), and the first compiled call (compilation)."""
    from .shapes import JANUS_SHAPES, _build_backbone

    shape = JANUS_SHAPES["1B"]
    backbone, head = _build_backbone(shape, layers, device, dtype)
    generator = torch.Generator().manual_seed(0)
    embeds = (torch.randn(2, JANUS_CONTEXT + max(JANUS_WIDTHS), shape["hidden_size"], generator=generator) * 0.02
              ).to(device, dtype)
    region = compiled_regions.compile_region(attention_layer, "the Janus-Pro-1B-shaped layer")

    def backbone_over(static: bool) -> RowAttentionBackbone:
        cache = RowCache(2, JANUS_CONTEXT + JANUS_TOKENS, JANUS_CONTEXT, device)
        cache.static = static
        run = RowAttentionBackbone(backbone, cache, region if static else None)
        run(embeds[:, :JANUS_CONTEXT])
        return run

    def seconds(run: RowAttentionBackbone, width: int) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        head(run(embeds[:, JANUS_CONTEXT:JANUS_CONTEXT + width])).flatten()[:1].tolist()
        run.rows.rewind(width)
        return time.perf_counter() - started

    runs = {"eager": backbone_over(static=False), "compiled": backbone_over(static=True)}
    eager, compiled, first = {}, {}, {}
    for width in JANUS_WIDTHS:
        seconds(runs["eager"], width)
        first[width] = seconds(runs["compiled"], width)
        # interleaved, so that load elsewhere on the machine hits both alike; the fastest counts
        samples = [(seconds(runs["eager"], width), seconds(runs["compiled"], width)) for _ in range(repeats)]
        eager[width], compiled[width] = (min(column) for column in zip(*samples))
    return eager, compiled, first


def janus_rows(layers: int, device: torch.device, dtype: torch.dtype) -> list[dict[str, Any]]:
    eager, compiled, first = _janus_call_costs(layers, device, dtype)
    scale = 24 / layers
    rows = []
    for label, window in (("AR", 1), ("SCD 16", 16)):
        grid = GridModel(rows=24, cols=24, vocab_size=16384, sharpness=MEDIUM_SHARPNESS, device=str(device))
        nfe = JANUS_TOKENS if window == 1 else generate(grid, None, SamplerConfig(window=window, seed=0)).nfe
        rows.append(dict(model=f"Janus-Pro-1B shape ({layers} of 24 layers, x{scale:g})", method=label, calls=nfe,
                         eager_ms_call=1000 * scale * eager[window], compiled_ms_call=1000 * scale * compiled[window],
                         eager_s_image=nfe * scale * eager[window], compiled_s_image=nfe * scale * compiled[window],
                         ratio=compiled[window] / eager[window], compile_s=first[window] - compiled[window],
                         same_tokens="(forward only)"))
    return rows


@contextlib.contextmanager
def _timed(owner: Any, name: str, totals: dict[str, float], label: str) -> Iterator[None]:
    """Add the seconds spent in `owner.name` to totals[label] while inside."""
    original = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[label] = totals.get(label, 0.0) + time.perf_counter() - started

    setattr(owner, name, timed)
    try:
        yield
    finally:
        setattr(owner, name, original)


def split_rows(device: torch.device, dtype: torch.dtype, window: int = 16, seed: int = 0) -> list[dict[str, Any]]:
    """Milliseconds per call of one demo image by part, eager and compiled (warm)."""
    rows = []
    config = SamplerConfig(window=window, seed=seed)
    models = {compile_: load_model("demo", device=device, dtype=dtype, compile=compile_) for compile_ in (False, True)}
    cond = models[False].encode("7")
    for model in models.values():
        generate(model, cond, config)  # warm: compiled, caches allocated
    for compile_, model in models.items():
        totals: dict[str, float] = {}
        session_class = type(model.start(cond, 1))
        parts: list[tuple[Any, str, str]] = [
            (session_class, "forward", "forward"), (engine.Run, "feed", "feed"),
            (engine.Run, "verify", "verify"), (engine.Run, "settle_cache", "cache"),
            (engine.Run, "record", "record")]
        if compile_:
            parts.append((cuda_graphs.StaticCalls, "decide", "sampling step"))
        else:  # eager: the sampling step's two parts can be timed apart
            parts += [(engine._Decoder, "probs", "distributions"), (engine._Decoder, "step", "verification")]
        with contextlib.ExitStack() as stack:
            for owner, name, label in parts:
                stack.enter_context(_timed(owner, name, totals, label))
            seconds, result = _image_seconds(model, cond, config)
        calls = result.nfe
        sampling = totals.get("sampling step", totals.get("distributions", 0.0) + totals.get("verification", 0.0))
        row = dict(mode="compiled" if compile_ else "eager", calls=calls, ms_call=1000 * seconds / calls,
                   forward=totals["forward"], distributions=totals.get("distributions"),
                   verification=totals.get("verification"), sampling_step=sampling,
                   host_sync=totals["verify"] - sampling, inputs=totals["feed"] - totals["forward"],
                   cache=totals["cache"],
                   other=seconds - totals["feed"] - totals["verify"] - totals["cache"])
        rows.append({key: (1000 * value / calls if isinstance(value, float) and key not in ("ms_call",) else value)
                     for key, value in row.items()})
    return rows


def compile_tables(seeds: list[int], device: Optional[str] = None, dtype: Optional[str] = None,
                   layers: int = 4) -> str:
    import torch._inductor.config

    # compile in this process: inductor's pool of compile workers would compete with the timings that follow
    torch._inductor.config.compile_threads = 1
    torch_device = pick_device(device)
    torch_dtype = pick_dtype(dtype, torch_device)
    rows = demo_rows(seeds, torch_device, torch_dtype) + janus_rows(layers, torch_device, torch_dtype)
    split = split_rows(torch_device, torch_dtype)
    columns = ["model", "method", "calls", "eager_ms_call", "compiled_ms_call", "eager_s_image", "compiled_s_image",
               "ratio", "compile_s", "same_tokens"]
    split_columns = ["mode", "calls", "ms_call", "forward", "distributions", "verification", "sampling_step",
                     "host_sync", "inputs", "cache", "other"]
    return (f"{torch_device.type} {str(torch_dtype).replace('torch.', '')}, torch {torch.__version__}, "
            f"backend {compiled_regions.BACKEND}, seeds {seeds[0]}..{seeds[-1]} (medians)\n\n"
            + markdown(rows, columns)
            + "\n\nWhere a demo call's time goes (SCD 16, one image, ms per call; the compiled sampling step is one "
              "graph: distributions, verification and coupling together)\n\n"
            + markdown([{k: ("-" if v is None else v) for k, v in row.items()} for row in split], split_columns))
