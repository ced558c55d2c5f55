"""The device check's compiled phase: what a window call costs eager, as CUDA graphs and as graphs of compiled
layers, against the weight-read floor measured on the device.

For each Janus-Pro shape (random weights, the CFG double batch, a prompt and half an image cached) one call
(backbone through the row attention + image head) over a static RowCache the size a compiled run's is (the
whole pre-sized cache, a mask built on the device; scd_core.compiled.compiled_regions) at widths 1 / 16 / 32 / 64:

  - eager: the static call, eager layers;
  - graphs: the same call captured as one CUDA graph per width (cuda_graphs.GraphedSteps) and replayed;
    `graphs_vs_eager` (meant to be bit-equal: the same kernels; a failed capture says so);
  - compiled: the layers through torch.compile (one compiled layer for all), captured the same way;
    `compiled_vs_eager` (inductor's kernels may round apart: equal greedy tokens, the largest logit difference);
    a failed compile reads "compile failed (ran eagerly): why".

A tree of candidates (3 chains at width 32: 94 tokens) is timed eagerly: compiled mode refuses trees.  The
floor is the bytes a static call reads (the weights and the whole static KV cache) over the bandwidth of a
large device copy.  On a CPU the graph columns read "not available on cpu" and the compiled column is
torch.compile alone.  Compiling is the phase's cost: it compiles only the given compile widths (the others read
"not compiled") and stops after its time budget (the columns it skipped say so).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Optional, Sequence

import torch

from ..compiled import compiled_regions, cuda_graphs
from ..models.weights.memory import release_memory
from ..models.sessions.row_attention import RowAttentionBackbone, attention_layer
from ..models.sessions.row_cache import RowCache
from ..models.sessions.row_session import PROMPT_BUCKET, prompt_slots
from .long import kv_cache_bytes
from .tables import markdown

WIDTHS = (1, 16, 32, 64)
TINY_WIDTHS = (1, 4)  # on a CPU each width is a compilation of its own (tens of seconds)
TREE = (3, 32)        # chains, width
REPEATS = 5
# The compile budget's levers (`device-check --compile-widths / --compile-budget`): each compiled width costs one
# compilation per shape; eager and CUDA graphs run at every width whatever they say.
COMPILE_WIDTHS = (1, 32)
COMPILE_BUDGET_S = 150.0
COPY_BYTES = 2**30


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bandwidth_gb_s(device: torch.device, tiny: bool) -> float:
    """Bytes read and written per second by a large device-to-device copy (the best of a few)."""
    count = (2**24 if tiny else COPY_BYTES) // 4
    source = torch.empty(count, dtype=torch.float32, device=device).fill_(1.0)
    target = torch.empty_like(source)
    best = float("inf")
    for attempt in range(4):
        _sync(device)
        started = time.perf_counter()
        target.copy_(source)
        _sync(device)
        if attempt:
            best = min(best, time.perf_counter() - started)
    return 2 * source.numel() * 4 / best / 1e9


def _median_seconds(call: Callable[[], Any], device: torch.device, repeats: int = REPEATS) -> float:
    samples = []
    for _ in range(repeats):
        _sync(device)
        started = time.perf_counter()
        call()
        _sync(device)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


class _ShapeCalls:
    """One shape's static-cache window call, eager or through a compiled layer, plain or as CUDA graphs."""

    def __init__(self, model: Any, head: torch.nn.Module, context: int, capacity: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        """`capacity`: the slots of the static cache (`static_capacity`)."""
        self.backbone, self.head, self.context, self.device = model.model, head, context, device
        hidden = model.config.hidden_size
        generator = torch.Generator().manual_seed(0)
        embeds = torch.randn(2, context + max(WIDTHS) + 2 * (TREE[1] - 1), hidden, generator=generator) * 0.02
        self.embeds = embeds.to(device, dtype)
        self.capacity = capacity
        self.inputs: dict[int, torch.Tensor] = {}

    def cache(self, static: bool, layer: Optional[Callable[..., torch.Tensor]]) -> RowAttentionBackbone:
        cache = RowCache(2, self.capacity, self.context, self.device)  # a tree grows the dynamic cache
        cache.static = static
        run = RowAttentionBackbone(self.backbone, cache, layer)
        run(self.embeds[:, :self.context])
        return run

    def step(self, run: RowAttentionBackbone) -> Callable[[int], tuple[torch.Tensor, ...]]:
        def call(width: int) -> tuple[torch.Tensor, ...]:
            return (self.head(run(self.inputs[width])),)
        return call

    def timed(self, run: RowAttentionBackbone, width: int, call: Callable[[int], tuple[torch.Tensor, ...]]
              ) -> tuple[float, torch.Tensor]:
        """Median seconds of a rewound call at `width`, and its logits."""
        self.inputs.setdefault(width, self.embeds[:, self.context:self.context + width].clone())
        out: list[torch.Tensor] = []

        def once() -> None:
            out[:] = [call(width)[0].float().clone()]
            run.rows.rewind(width)

        for _ in range(cuda_graphs.WARMUP_CALLS + 1):  # warm-up, and the graph's capture
            once()
        return _median_seconds(once, self.device), out[0]

    def tree_seconds(self) -> float:
        run = self.cache(static=False, layer=None)
        chains, width = TREE
        fed = 1 + chains * (width - 1)
        tokens = self.embeds[:, self.context:self.context + fed]

        def once() -> None:
            self.head(run(tokens, chains)).flatten()[:1].tolist()
            run.rows.rewind(fed)

        once()
        return _median_seconds(once, self.device)


def static_capacity(shape: Any) -> int:
    """Slots of a compiled run's static cache: the prompt rounded up to its bucket, and the image."""
    return prompt_slots(shape.prefix, PROMPT_BUCKET) + shape.grid[0] * shape.grid[1]  # Janus-Pro: a CFGSession


def cache_bytes(config: Any, capacity: int, dtype: torch.dtype) -> int:
    """Bytes of keys and values a static call reads: every slot of every layer, both CFG rows."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return kv_cache_bytes(config.num_hidden_layers, config.num_key_value_heads, head_dim, capacity, rows=2,
                          dtype_bytes=dtype.itemsize)


def _compare(reference: torch.Tensor, other: torch.Tensor) -> dict[str, Any]:
    return dict(same_tokens=bool(torch.equal(reference.argmax(-1), other.argmax(-1))),
                max_logit_diff=float((reference - other).abs().max()))


def agreement(comparison: Any) -> str:
    """A table cell for a comparison with eager: bit-equal, equal tokens (and the largest logit difference),
    or different tokens; a string (not measured, and why) as it is."""
    if not isinstance(comparison, dict):
        return comparison
    if comparison["max_logit_diff"] == 0:
        return "bit-equal"
    tokens = "equal tokens" if comparison["same_tokens"] else "TOKENS DIFFER"
    return f"{tokens}, max diff {comparison['max_logit_diff']:.1e}"


def check_shape(shape: Any, model: Any, head: torch.nn.Module, device: torch.device, dtype: torch.dtype,
                context: int, floor_s: float, widths: Sequence[int], compile_widths: Sequence[int],
                deadline: float) -> dict[str, Any]:
    """Every mode at each of `widths`, the compiled one only at `compile_widths` and before `deadline`."""
    compile_widths = [w for w in widths if w in compile_widths]
    calls = _ShapeCalls(model, head, context, static_capacity(shape), device, dtype)
    graphs = cuda_graphs.graphs_available(device)
    weights = next(model.parameters())
    region = compiled_regions.compile_region(attention_layer, f"the {shape.name} layer")
    rows = []
    with torch.no_grad():
        eager_run = calls.cache(static=True, layer=None)
        compiled_run = calls.cache(static=True, layer=region)
        # (name, run, captured as CUDA graphs); "compiled" is graphs of compiled layers where graphs exist
        modes: list[tuple[str, RowAttentionBackbone, bool]] = [("eager", eager_run, False)]
        if graphs:
            modes.append(("graphs", eager_run, True))
        modes.append(("compiled", compiled_run, graphs))
        for width in widths:
            row: dict[str, Any] = dict(model=shape.name, width=width, floor_ms=1000 * floor_s)
            if not graphs:
                row["graphs_ms"] = row["graphs_vs_eager"] = f"not available on {device.type}"
            reference = None
            for name, run, graphed in modes:
                if name == "compiled" and (width not in compile_widths or time.perf_counter() > deadline):
                    row["compiled_ms"] = row["compiled_vs_eager"] = (
                        "not compiled (compile widths)" if width not in compile_widths
                        else "skipped (compile budget)")
                    continue
                call = calls.step(run)
                if graphed:
                    call = cuda_graphs.GraphedSteps(call, weights)
                started = time.perf_counter()
                seconds, logits = calls.timed(run, width, call)
                if name == "compiled" and width == compile_widths[0]:  # one width's compile time: the estimate
                    spent, more = time.perf_counter() - started, len(compile_widths) - 1
                    print(f"{shape.name}: compiling width {width} took {spent:.0f} s; {more} more widths: about "
                          f"{spent * more:.0f} s, within {max(0.0, deadline - time.perf_counter()):.0f} s of "
                          "compile budget left", flush=True)
                row[f"{name}_ms"] = 1000 * seconds
                if reference is None:
                    reference = logits
                else:
                    row[f"{name}_vs_eager"] = _compare(reference, logits)
                if graphed and call.failed:  # it ran eagerly: its time and agreement are eager's
                    row[f"{name}_vs_eager"] = "CUDA graph capture failed (ran eagerly)"
            rows.append(row)
        tree_ms = 1000 * calls.tree_seconds()
    return dict(name=shape.name, floor_ms=1000 * floor_s, rows=rows, tree_ms=tree_ms,
                tree=f"{TREE[0]} chains at width {TREE[1]}", compile_error=region.error)


def table(results: list[dict[str, Any]], bandwidth: float) -> str:
    rows = []
    for result in results:
        failed = result["compile_error"] and f"compile failed (ran eagerly): {result['compile_error'][:80]}"
        for r in result["rows"]:
            rows.append(dict(model=r["model"], width=r["width"], floor_ms=r["floor_ms"], eager_ms=r["eager_ms"],
                             graphs_ms=r["graphs_ms"], graphs_vs_eager=agreement(r["graphs_vs_eager"]),
                             compiled_ms=failed or r["compiled_ms"],
                             compiled_vs_eager=failed or agreement(r["compiled_vs_eager"])))
        rows.append(dict(model=result["name"], width=f"tree: {result['tree']}", floor_ms=result["floor_ms"],
                         eager_ms=result["tree_ms"], graphs_ms="refused (trees)", graphs_vs_eager="-",
                         compiled_ms="refused (trees)", compiled_vs_eager="-"))
    return (f"Compiled phase: copy bandwidth {bandwidth:.0f} GB/s; floor = (weight bytes + the static KV cache's "
            "bytes, which a static call reads whole) / bandwidth; compiled = graphs of compiled layers where CUDA "
            "graphs exist, else torch.compile alone; `*_vs_eager`: bit-equal logits, or whether the greedy "
            "tokens agree and the largest logit difference\n\n"
            + markdown(rows, list(rows[0])))


def compiled_phase(shapes: list[Any], build: Callable[..., tuple[Any, torch.nn.Module]], device: torch.device,
                   dtype: torch.dtype, tiny: bool, compile_widths: Sequence[int], budget_s: float
                   ) -> dict[str, Any]:
    """Run the phase on the Llama-family (Janus-Pro) shapes, compiling at `compile_widths` only (each width a
    compilation of its own) until the phase has run `budget_s` seconds.  Returns {bandwidth, results, table}."""
    started = time.perf_counter()
    bandwidth = bandwidth_gb_s(device, tiny)
    deadline = started + budget_s
    results = []
    for shape in shapes:
        model, head = build(shape, device, dtype, tiny)
        # what a call reads: every layer, the final norm and the image head (not the embedding table), and the
        # whole static cache
        read = [*model.model.layers.parameters(), *model.model.norm.parameters(), *head.parameters()]
        weight_bytes = sum(p.numel() * p.element_size() for p in read)
        kv_bytes = cache_bytes(model.config, static_capacity(shape), dtype)
        context = shape.prefix + shape.grid[0] * shape.grid[1] // 2
        results.append(check_shape(shape, model, head, device, dtype, context,
                                   (weight_bytes + kv_bytes) / bandwidth / 1e9, TINY_WIDTHS if tiny else WIDTHS,
                                   compile_widths, deadline))
        results[-1].update(weight_mb=weight_bytes / 2**20, kv_cache_mb=kv_bytes / 2**20)
        del model, head
        release_memory()
    return dict(bandwidth_gb_s=bandwidth, results=results, seconds=time.perf_counter() - started,
                table=table(results, bandwidth))
