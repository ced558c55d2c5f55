"""How a run's window calls are made: eagerly at the width each needs, or at static shapes (a model loaded with
compile=True: compiled regions, scd_core.compiled.compiled_regions, and on CUDA, CUDA graphs,
scd_core.compiled.cuda_graphs).  A run picks one once (`calls_for`); its loop then feeds and decides calls through it without asking which."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from . import compiled_regions, cuda_graphs
from ..model import Logits


@dataclass
class Call:
    """One model call: what was fed and what came back."""

    width: int                 # window slots verified (1 for the prefill)
    fed: int                   # tokens fed after the committed ones: the width, more for a tree
    pad: int                   # committed tokens fed again in front (fixed shapes)
    logits: Logits
    tree: Optional[tuple[torch.Tensor, torch.Tensor]]  # (alternatives, valid) when the call fed a tree
    forward_s: float
    decided: Optional[tuple] = None  # a captured static step's decisions, made with its forward
    prefill: bool = False      # the prompt's call: nothing of it to rewind, and no window chose its width
    free: int = 1              # the width the window policy chose: free positions to verify per row
    eager: bool = False        # a static run's call wider than its bucket, run eagerly (`StaticShapeCalls.feed`)


class EagerCalls:
    """Each call at the width it needs (or, with fixed shapes, padded in front with committed tokens), a tree of
    chains with candidates; decided eagerly."""

    def __init__(self, run: Any) -> None:
        self.run = run  # the engine's `Run`: its session, decoder and books

    def before_prefill(self) -> None:
        """The run is about to prefill its session."""

    def after_prefill(self) -> None:
        """The run's decoder exists: its state right after the prefill."""

    def feed(self, window: int, width: int, t0: float) -> Call:
        """Feed a call of `width` slots verifying `window` free positions (the window policy's choice)."""
        run = self.run
        # fixed shapes: rather than narrow the call at the end, feed committed tokens again in front
        pad = max(0, min(window - width, run.done - 1)) if run.config.fixed_shapes else 0
        if pad:
            run.rewind_all(pad)
        inputs = run.decoder.window_inputs(width, pad)
        tree = None
        if run.branches > 1 and 1 < width <= window:  # (a call widened over forced cells feeds no tree: its
            # chains would repeat them)
            tree = run.decoder.alternatives(run.branches - 1)
        fed, logits = run.forward(inputs, None if tree is None else tree[0])
        if pad:
            logits = (logits[0][:, pad:], None if logits[1] is None else logits[1][:, pad:])
        return Call(width, fed - pad, pad, logits, tree, run.elapsed(t0), free=window)

    def decide(self, call: Call) -> tuple[tuple, int]:
        """The call's decisions (`_Decoder.decide`) and the width they were made at."""
        run = self.run
        return run.decoder.decide(call.logits, call.width, run.max_shift, call.tree), call.width

    def cost_width(self, call: Call) -> int:
        """The width a call's seconds stand for: what it fed."""
        return call.width + call.pad

    def finish(self) -> None:
        """The run is over."""

    def close(self) -> None:
        """The run ends, finished or not (`engine.Run.close`): let go of what the calls hold."""


class StaticShapeCalls(EagerCalls):
    """Every call at its bucket's width (the window the policy chose): drafts past the end fill it, each row's
    verification ends at its last position (`verify.Window`); the forward and the sampling step are compiled, and
    on CUDA captured as one graph per width, kept on the model for its next generation."""

    def __init__(self, run: Any) -> None:
        super().__init__(run)
        self.holder = cuda_graphs.kept_graphs(run.model)  # what the model keeps for its next generation
        self.kept: Optional[cuda_graphs.StaticCalls] = None
        self.static: Optional[cuda_graphs.StaticCalls] = None

    def before_prefill(self) -> None:
        # the model's last generation's calls: their graphs, and their KV cache's memory for this prefill
        self.kept = self.holder.take(self.run.session)

    def after_prefill(self) -> None:
        run, kept, self.kept = self.run, self.kept, None
        self.static = cuda_graphs.calls_for(kept, run.session, run.decoder, _network(run.model))

    def feed(self, window: int, width: int, t0: float) -> Call:
        run = self.run
        if width <= window:
            logits, decided = self.static.forward(run.decoder.window_inputs(window))
            return Call(width, window, 0, logits, None, run.elapsed(t0), decided, free=window)
        # widened over forced cells past the bucket: one eager call of its own width (a graph for a width that
        # may not come again would cost more than it saves)
        with compiled_regions.eager_regions():
            logits = run.session.forward(run.decoder.window_inputs(width))
        return Call(width, width, 0, logits, None, run.elapsed(t0), free=window, eager=True)

    def decide(self, call: Call) -> tuple[tuple, int]:
        if call.prefill or call.eager:
            return super().decide(call)
        # decided at its bucket's width: its commit counts and acceptance are cut to the true width
        return (call.decided if call.decided is not None else self.static.decide(call.logits)), call.fed

    def cost_width(self, call: Call) -> int:
        # a static call costs its bucket's width, however few of its slots were verified
        return super().cost_width(call) if call.eager else call.fed

    def finish(self) -> None:
        graphs = None if self.static is None else self.static.graphs
        self.run.result.eager_fallbacks = compiled_regions.eager_fallbacks(self.run.model, graphs)
        self.holder.keep(self.static)

    def close(self) -> None:
        # static calls and their CUDA graphs refer to each other: released here, a cancel or an error leaves
        # their memory to nobody (the calls the model keeps for its next generation aside)
        for calls in (self.kept, self.static):
            if calls is not None and self.holder.kept is not calls:
                calls.release()
        self.kept = self.static = None


def _network(model: Any) -> Optional[torch.nn.Module]:
    """The model's network (where its weights lie tells whether they moved), if it has one."""
    module = getattr(model, "module", None)
    return module if isinstance(module, torch.nn.Module) else None


def calls_for(run: Any, compiled: bool) -> EagerCalls:
    """The calls of `run`: at static shapes where its model was compiled and its session offers them."""
    return StaticShapeCalls(run) if compiled else EagerCalls(run)
