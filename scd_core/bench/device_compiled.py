"""The device check's compiled phase: what a window call costs eager, as CUDA graphs and as graphs of compiled
layers, against the weight-read floor measured on the device.

For each Janus-Pro shape (random weights, the CFG double batch, a prompt and half an image cached) one call
(backbone through the row attention + image head) over a static RowCache (the whole pre-sized cache, a mask
built on the device; scd_core.static_step) at widths 1 / 16 / 32 / 64:

  - eager: the static call, eager layers;
  - graphs: the same call captured as one CUDA graph per width (static_step.GraphedSteps) and replayed;
  - graphs + compile: the layers through torch.compile (one compiled layer for all), captured the same way;

each checked against eager (the greedy token of every position, and the largest logit difference).  A tree
of candidates (3 chains at width 32: 94 tokens) is timed eagerly: compiled mode refuses trees.  The floor is
the weight bytes over the bandwidth of a large device copy.  On a CPU the graph columns read "not available
on cpu" and the compiled column is torch.compile alone.  Compiling stops once the phase has used its time
budget; the columns it skipped say so.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Optional

import torch

from .. import static_step
from ..models.memory import release_memory
from ..models.row_attention import RowAttentionBackbone, attention_layer
from ..models.row_cache import RowCache
from .tables import markdown

WIDTHS = (1, 16, 32, 64)
TINY_WIDTHS = (1, 4)  # on a CPU each width is a compilation of its own (tens of seconds)
TREE = (3, 32)        # chains, width
REPEATS = 5
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

    def __init__(self, model: Any, head: torch.nn.Module, context: int, tokens: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.backbone, self.head, self.context, self.device = model.model, head, context, device
        hidden = model.config.hidden_size
        generator = torch.Generator().manual_seed(0)
        embeds = torch.randn(2, context + max(WIDTHS) + 2 * (TREE[1] - 1), hidden, generator=generator) * 0.02
        self.embeds = embeds.to(device, dtype)
        self.capacity = context + tokens
        self.inputs: dict[int, torch.Tensor] = {}

    def cache(self, static: bool, layer: Optional[Callable[..., torch.Tensor]]) -> RowAttentionBackbone:
        cache = RowCache(2, self.capacity + TREE[0] * TREE[1], self.context, self.device)
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

        for _ in range(static_step.WARMUP_CALLS + 1):  # warm-up, and the graph's capture
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


def _compare(reference: torch.Tensor, other: torch.Tensor) -> dict[str, Any]:
    return dict(same_tokens=bool(torch.equal(reference.argmax(-1), other.argmax(-1))),
                max_logit_diff=float((reference - other).abs().max()))


def check_shape(shape: Any, model: Any, head: torch.nn.Module, device: torch.device, dtype: torch.dtype,
                context: int, tiny: bool, floor_s: float, deadline: float) -> dict[str, Any]:
    tokens = shape.grid[0] * shape.grid[1]
    calls = _ShapeCalls(model, head, context, tokens, device, dtype)
    graphs = static_step.graphs_available(device)
    weights = next(model.parameters())
    region = static_step.compile_region(attention_layer, f"the {shape.name} layer")
    widths = TINY_WIDTHS if tiny else WIDTHS
    rows = []
    with torch.no_grad():
        eager_run = calls.cache(static=True, layer=None)
        compiled_run = calls.cache(static=True, layer=region)
        modes: list[tuple[str, RowAttentionBackbone, bool]] = [("eager", eager_run, False)]
        if graphs:
            modes.append(("graphs", eager_run, True))
        modes.append(("graphs_compile" if graphs else "compile", compiled_run, graphs))
        for width in widths:
            row: dict[str, Any] = dict(model=shape.name, width=width, floor_ms=1000 * floor_s)
            reference = None
            for name, run, graphed in modes:
                if name != "eager" and run is compiled_run and time.perf_counter() > deadline:
                    row[f"{name}_ms"] = "skipped (time budget)"
                    continue
                call = calls.step(run)
                if graphed:
                    call = static_step.GraphedSteps(call, weights)
                seconds, logits = calls.timed(run, width, call)
                row[f"{name}_ms"] = 1000 * seconds
                if reference is None:
                    reference = logits
                else:
                    row[f"{name}_vs_eager"] = _compare(reference, logits)
            if not graphs:
                row["graphs_ms"] = f"not available on {device.type}"
            rows.append(row)
        tree_ms = 1000 * calls.tree_seconds()
    return dict(name=shape.name, floor_ms=1000 * floor_s, rows=rows, tree_ms=tree_ms,
                tree=f"{TREE[0]} chains at width {TREE[1]}", compile_failed=region.failed)


def table(results: list[dict[str, Any]], bandwidth: float) -> str:
    rows = []
    for result in results:
        for r in result["rows"]:
            rows.append(dict(model=r["model"], width=r["width"], floor_ms=r["floor_ms"], eager_ms=r["eager_ms"],
                             graphs_ms=r.get("graphs_ms", "-"),
                             compiled_ms=r.get("graphs_compile_ms", r.get("compile_ms", "-")),
                             same_tokens=all(v["same_tokens"] for k, v in r.items() if k.endswith("_vs_eager")),
                             max_logit_diff=max([v["max_logit_diff"] for k, v in r.items()
                                                 if k.endswith("_vs_eager")] or [0.0])))
        rows.append(dict(model=result["name"], width=f"tree: {result['tree']}", floor_ms=result["floor_ms"],
                         eager_ms=result["tree_ms"], graphs_ms="refused (trees)", compiled_ms="refused (trees)",
                         same_tokens="-", max_logit_diff="-"))
    return (f"Compiled phase: copy bandwidth {bandwidth:.0f} GB/s; floor = weight bytes / bandwidth; "
            "compiled = graphs of compiled layers where CUDA graphs exist, else torch.compile alone\n\n"
            + markdown(rows, list(rows[0])))


def compiled_phase(shapes: list[Any], build: Callable[..., tuple[Any, torch.nn.Module]], device: torch.device,
                   dtype: torch.dtype, tiny: bool) -> dict[str, Any]:
    """Run the phase on the Llama-family (Janus-Pro) shapes; returns {bandwidth, results, table}."""
    started = time.perf_counter()
    bandwidth = bandwidth_gb_s(device, tiny)
    deadline = float("inf") if tiny else started + COMPILE_BUDGET_S  # tiny: every column, to test them
    results = []
    for shape in shapes:
        model, head = build(shape, device, dtype, tiny)
        # what a call reads: every layer, the final norm and the image head (not the embedding table)
        read = [*model.model.layers.parameters(), *model.model.norm.parameters(), *head.parameters()]
        weight_bytes = sum(p.numel() * p.element_size() for p in read)
        context = shape.prefix + shape.grid[0] * shape.grid[1] // 2
        results.append(check_shape(shape, model, head, device, dtype, context, tiny, weight_bytes / bandwidth / 1e9,
                                   deadline))
        del model, head
        release_memory()
    return dict(bandwidth_gb_s=bandwidth, results=results, seconds=time.perf_counter() - started,
                table=table(results, bandwidth))
