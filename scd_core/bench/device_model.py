"""The device run's model-level parts, on the Janus-Pro shape with random weights (`device_check.build`).

- `model_rows`: a position's logits over MODEL_SPAN positions in calls of width 1, 8 and 32 and in a batch of 4
  against 1, as today's calls make them and in the window-invariant tiles; where they differ, forward hooks name
  the first module whose output differs.  `admit_rows`: a job admitted beside a job with a longer prompt,
  and one beside a shorter prompt, against each job alone.  `flip_rows`: the faithful coupler's tokens at
  windows 8 and 32 against window 1's, the share that flipped.
- `compiled_rows`: compiled calls (one compiled layer over the static cache) at widths 1, 8 and 32, replayed as
  CUDA graphs against run without (where graphs exist): the positions the widths share, bit for bit.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator, Optional

import torch

from ..compiled import compiled_regions, cuda_graphs, invariant
from ..decoding.config import SamplerConfig
from ..decoding.engine import generate

MODEL_WIDTHS = (1, 8, 32)
MODEL_SPAN, TINY_MODEL_SPAN = 256, 64  # positions compared, after the prompt
BATCH = 4
# the other job's prompt tokens: beside the shape's (64; tiny 8) in one layout of row_session.PROMPT_BUCKET slots
# (jobs of two layouts never share a bfloat16 session)
OTHER_PROMPT = 40
FLIP_WINDOWS = (8, 32)
FLIP_GRID = (16, 16)  # the flip rate's image: 256 positions, a window-1 image within the part's cap
POLICIES = (("today's", False), ("tiles", True))


@contextlib.contextmanager
def invariant_calls(rows: Optional[int]) -> Iterator[None]:
    """Today's calls (`rows` None) or window-invariant calls in tiles of `rows` rows, for the sessions started
    inside."""
    saved = os.environ.get(invariant.POLICY_VARIABLE), invariant.TILE_ROWS, invariant.DEFAULT_TILE_ROWS
    os.environ[invariant.POLICY_VARIABLE] = "off" if rows is None else "on"
    invariant.TILE_ROWS, invariant.DEFAULT_TILE_ROWS = {}, rows or invariant.DEFAULT_TILE_ROWS  # on every device
    try:
        yield
    finally:
        invariant.TILE_ROWS, invariant.DEFAULT_TILE_ROWS = saved[1:]
        if saved[0] is None:
            del os.environ[invariant.POLICY_VARIABLE]
        else:
            os.environ[invariant.POLICY_VARIABLE] = saved[0]


def policy_calls(tiled: bool, device: torch.device) -> contextlib.AbstractContextManager:
    """Today's calls, or the window-invariant calls in the device's own tile."""
    return invariant_calls(invariant.tile_rows(device) if tiled else None)


def span_logits(network: Any, ids: torch.Tensor, width: int, batch: int = 1) -> torch.Tensor:
    """The cond rows' float logits (batch, positions, V) of `ids` (1, positions) fed in calls of `width` after the
    prompt, each of the `batch` samples fed the same ids."""
    session = network.start(None, batch)
    session.prefill()
    chunks = [session.forward(ids[:, at:at + width].repeat(batch, 1))[0] for at in range(0, ids.shape[1], width)]
    return torch.cat(chunks, dim=1).float()


def module_outputs(modules: dict[str, torch.nn.Module], call: Callable[[], Any]) -> dict[str, torch.Tensor]:
    """Each module's last output during `call` (its first tensor), in the order the modules first ran."""
    captured: dict[str, torch.Tensor] = {}

    def hook(name: str) -> Callable[..., None]:
        def store(module: Any, args: Any, output: Any) -> None:
            out = output[0] if isinstance(output, (tuple, list)) else output
            if isinstance(out, torch.Tensor) and out.dim() >= 3:
                captured[name] = out.detach().float().clone()
        return store

    handles = [module.register_forward_hook(hook(name)) for name, module in modules.items()]
    try:
        call()
    finally:
        for handle in handles:
            handle.remove()
    return captured


def first_differing_module(network: Any, ids: torch.Tensor, position: int, width: int) -> str:
    """The first module (in the order they run) whose output at `position` differs between the width-1 call
    that computes it and the width-`width` call that holds it, the prefix before both fed alike."""
    modules = {name: module for name, module in network.module.named_modules() if name}
    modules["image head"] = network.head
    start = position - position % width
    outputs = []
    for step, at in ((1, position), (width, start)):
        session = network.start(None, 1)
        session.prefill()
        for fed in range(0, at, step):
            session.forward(ids[:, fed:fed + step])
        outputs.append(module_outputs(modules, lambda: session.forward(ids[:, at:at + step])))
    alone, inside = outputs
    for name, out in alone.items():
        theirs = inside.get(name)
        if theirs is not None and theirs.dim() == out.dim() and theirs.shape[1] == width:
            if not torch.equal(out[:, -1], theirs[:, position - start]):
                return name
    return "none (the logits differ after the modules' outputs)"


def model_rows(network: Any, ids: torch.Tensor, device: torch.device) -> list[dict[str, Any]]:
    """Under today's calls and the tiles: positions whose logits are bit-equal between widths 1 / 8 / 32 and
    batch 1 / 4, and the first module apart where they are not."""
    rows = []
    for policy, tiled in POLICIES:
        with policy_calls(tiled, device):
            logits = {width: span_logits(network, ids, width) for width in MODEL_WIDTHS}
            logits["batch 4"] = span_logits(network, ids, MODEL_WIDTHS[1], BATCH)[:1]
            for pair in ((1, 8), (1, 32), (8, 32), (8, "batch 4")):
                a, b = logits[pair[0]], logits[pair[1]]
                differ = [p for p in range(ids.shape[1]) if not torch.equal(a[:, p], b[:, p])]
                first = "-"
                if differ and isinstance(pair[1], int):
                    first = first_differing_module(network, ids, differ[0], pair[1])
                rows.append(dict(calls=policy, compared=" vs ".join(map(str, pair)) if pair[1] != "batch 4"
                                 else "batch 1 vs 4 (width 8)",
                                 positions_bit_equal=f"{ids.shape[1] - len(differ)}/{ids.shape[1]}",
                                 max_abs_diff=float((a - b).abs().max()), first_module_apart=first))
    return rows


def admit_rows(network: Any, other: Any, ids: torch.Tensor, device: torch.device) -> list[dict[str, Any]]:
    """A job of each network's alone, and admitted beside a running job of the other's (a prompt of another
    length in the same layout), each call of width 8 feeding both: positions whose cond logits are bit-equal."""
    width, rows = MODEL_WIDTHS[1], []
    for job, running in ((other, network), (network, other)):
        for policy, tiled in POLICIES:
            with policy_calls(tiled, device):
                alone = span_logits(job, ids, width)
                live = running.start(None, 1)
                live.prefill()
                live.admit([job.start(None, 1)])
                beside = torch.cat([live.forward(ids[:, at:at + width].repeat(2, 1))[0][1:].float()
                                    for at in range(0, ids.shape[1], width)], dim=1)
            same = sum(bool(torch.equal(alone[:, p], beside[:, p])) for p in range(ids.shape[1]))
            rows.append(dict(calls=policy, compared=f"admitted ({job.prompt.numel()}-token prompt beside "
                             f"{running.prompt.numel()}) vs alone", positions_bit_equal=f"{same}/{ids.shape[1]}",
                             max_abs_diff=float((alone - beside).abs().max()), first_module_apart="-"))
    return rows


def flip_rows(network: Any, device: torch.device) -> list[dict[str, Any]]:
    """The faithful coupler's image (seed 0) at FLIP_WINDOWS against window 1's: tokens that flipped."""
    rows = []
    for policy, tiled in POLICIES:
        with policy_calls(tiled, device):
            images = {w: generate(network, None, SamplerConfig(seed=0, window=w)).tokens for w in (1, *FLIP_WINDOWS)}
        for window in FLIP_WINDOWS:
            flipped = int((images[window] != images[1]).sum())
            rows.append(dict(calls=policy, window=window, tokens=images[1].numel(), flipped=flipped,
                             flip_rate=flipped / images[1].numel()))
    return rows


def compiled_rows(shape: Any, model: Any, head: torch.nn.Module, device: torch.device, dtype: torch.dtype
                  ) -> Iterator[list[dict[str, Any]]]:
    """Compiled calls at each MODEL_WIDTHS width, without and with CUDA graphs: the logits of the positions a
    width shares with the narrower ones (and with the run without graphs), bit for bit; rows so far after each
    width (each one a compilation)."""
    from ..models.sessions.row_attention import attention_layer
    from .device_compiled import _ShapeCalls, static_capacity

    context = shape.prefix + shape.grid[0] * shape.grid[1] // 2
    calls = _ShapeCalls(model, head, context, static_capacity(shape), device, dtype)
    region = compiled_regions.compile_region(attention_layer, f"the {shape.name} layer")
    run = calls.cache(static=True, layer=region)
    graphs = cuda_graphs.graphs_available(device)
    logits: dict[tuple[int, bool], torch.Tensor] = {}
    rows: list[dict[str, Any]] = []
    for width in MODEL_WIDTHS:
        for graphed in (False, True):
            row: dict[str, Any] = dict(width=width, graphs="CUDA graph replay" if graphed else "no graph")
            if graphed and not graphs:
                rows.append(dict(row, runs=f"skipped: no CUDA graphs on {device.type}"))
                continue
            call = calls.step(run)
            call = cuda_graphs.GraphedSteps(call, next(model.parameters())) if graphed else call
            seconds, logits[width, graphed] = calls.timed(run, width, call)
            row.update(runs="compile failed, ran eagerly: " + region.error[:60] if region.error else "yes",
                       ms=1000 * seconds)
            for narrower in (w for w in MODEL_WIDTHS if w < width):
                shared = logits[narrower, graphed].shape[1]
                row[f"vs_width_{narrower}"] = _bits(logits[narrower, graphed], logits[width, graphed][:, :shared])
            if graphed:
                row["vs_no_graph"] = _bits(logits[width, False], logits[width, True])
            rows.append(row)
        yield rows


def _bits(a: torch.Tensor, b: torch.Tensor) -> str:
    same = sum(bool(torch.equal(a[:, p], b[:, p])) for p in range(a.shape[1]))
    return f"{same}/{a.shape[1]} bit-equal"
