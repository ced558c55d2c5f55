"""A compiled model's window calls as CUDA graphs: one captured graph per width (`GraphedSteps`), a generation's
static calls (`StaticCalls`), and the calls a model keeps for its next generation (`KeptGraphs`).

On CUDA, the whole step of a static-shape call (scd_core.compiled.compiled_regions: forward, distributions,
verification, coupling) is captured as one CUDA graph per width and replayed with its inputs copied into a
static buffer; a capture that fails runs the step eagerly, with one warning, and the generation's result says
why (`compiled_regions.eager_fallbacks`).  CUDA graphs hold the addresses of the generation they were captured in
(its KV cache, decoder state and input buffers): they are kept with that memory for the model's next generation
(`KeptGraphs.keep`), which replays them where its state has the same layout (`graph_state`: the same batch and
bucket of prompt lengths, the same sampler options on or off; the prompt, the seed, the CFG scale, temperature,
top-k and top-p values may differ) after copying its own state into that memory.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Optional

import torch

from . import compiled_regions
from .capture_scope import outside_host_graphs
from .graph_state import State
from ..model import Logits

WARMUP_CALLS = 2  # eager calls of a width before its graph is captured (they are real calls, not repeats)
# CUDA's own allocator: graphs have no private pool under it, and memory of a graph freed outside it (what a
# kept set's state is, once the next image rebinds it) warns and may be handed out again: graphs are not kept
ASYNC_ALLOCATOR = "cudaMallocAsync"


class GraphedSteps:
    """One CUDA graph per width of `step(width) -> tensors`, a step that reads its inputs from static buffers.

    The first WARMUP_CALLS calls of a width run eagerly on a side stream (warming up compiled kernels and
    library handles; they are real calls), the next captures the graph and replays it.  `step` must read
    nothing back to the host and keep every tensor it reads or writes at a fixed address; the outputs of a
    replay are overwritten by the next one.  `weights` (one parameter) detects moved weights: replaying on
    them would read freed memory, so the graphs are dropped and captured again.
    """

    def __init__(self, step: Callable[[int], tuple[Any, ...]], weights: torch.Tensor) -> None:
        self.step, self.weights = step, weights
        self.graphs: dict[int, tuple[Any, tuple[Any, ...]]] = {}
        self.calls: dict[int, int] = {}
        self.error: Optional[str] = None  # why capturing failed, for reports (`eager_fallbacks`)
        self.stream = torch.cuda.Stream(device=weights.device)
        self.pool: Any = None
        self.address = weights.data_ptr()

    @property
    def failed(self) -> bool:
        return self.error is not None

    def __call__(self, width: int) -> tuple[Any, ...]:
        if self.failed:
            return self.step(width)
        if self.weights.data_ptr() != self.address:
            self.graphs, self.calls, self.address = {}, {}, self.weights.data_ptr()
        if width not in self.graphs:
            self.calls[width] = self.calls.get(width, 0) + 1
            if self.calls[width] <= WARMUP_CALLS:  # outside a host's allocation record, as the capture
                return outside_host_graphs(lambda: self._on_side_stream(width))
            try:
                self.graphs[width] = outside_host_graphs(lambda: self._capture(width))
            except Exception as err:  # nothing ran: a capture records the step without running it
                self.error = compiled_regions.error_line(err)
                torch.cuda.synchronize(self.weights.device)
                compiled_regions.warn_once("cuda-graph", f"CUDA graph capture of the window call failed, running it "
                                           f"eagerly: {self.error}")
                return self.step(width)
        graph, outputs = self.graphs[width]
        graph.replay()
        return outputs

    def _on_side_stream(self, width: int) -> tuple[Any, ...]:
        current = torch.cuda.current_stream(self.weights.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            outputs = self.step(width)
        current.wait_stream(self.stream)
        return outputs

    def _capture(self, width: int) -> tuple[Any, tuple[Any, ...]]:
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(self.weights.device)
        # thread-local: CUDA work a host's other threads do meanwhile (ComfyUI's previews, its other nodes) is
        # neither captured nor fails the capture
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
            outputs = self.step(width)  # recorded, not run: the replay after it makes the call
        self.pool = graph.pool()
        return graph, outputs


class StaticCalls:
    """A generation's window calls at static shapes, for the engine (`generate` with a compiled model).

    Holds one input buffer per width, so a call's tensors keep their addresses (what changes per call, each
    row's commits and call counter, is decoder state updated in place); on CUDA the forward and the sampling
    step of each width run as one captured graph.  `session` has static shapes (`static_shapes`), `decoder`
    is the engine's per-row state with `static` set; `state` is theirs right after the prefill, when the
    calls were made for them: a later generation whose state has its layout takes the calls over (`taken_by`).
    """

    def __init__(self, session: Any, decoder: Any, network: Optional[torch.nn.Module], state: State) -> None:
        self.session, self.decoder, self.state = session, decoder, state
        self.inputs: dict[int, torch.Tensor] = {}
        weights = None if network is None else next(network.parameters(), None)
        self.graphs = (GraphedSteps(self._step, weights)
                       if weights is not None and graphs_available(weights.device) else None)
        self.weights_at = weight_addresses(network)  # where the graphs read the weights

    def release(self) -> None:
        """Drop the graphs and the generation's state now (they refer to each other: without this, only Python's
        cycle collector would free their memory)."""
        self.graphs, self.session, self.decoder, self.state, self.inputs = None, None, None, None, {}

    def taken_by(self, session: Any, decoder: Any, state: State) -> None:
        """Serve a new generation's `session` and `decoder` (whose `state` has this one's layout): their tensors
        move into the memory these calls' graphs read, and the calls run on them from now on."""
        state.move_to(self.state, [session, decoder])
        self.session, self.decoder = session, decoder

    def forward(self, inputs: torch.Tensor
                ) -> tuple[Optional[Logits], Optional[tuple[Any, ...]]]:
        """Feed a bucket's inputs (B, W); returns (logits, None), or (None, decisions) when the call ran as a
        graph with its sampling step."""
        if inputs.shape[1] not in self.inputs:
            self.inputs[inputs.shape[1]] = torch.empty_like(inputs)
        buffer = self.inputs[inputs.shape[1]]
        buffer.copy_(inputs)
        if self.graphs is not None:
            return None, self.graphs(inputs.shape[1])
        return self.session.forward(buffer), None

    def decide(self, logits: Logits) -> tuple[Any, ...]:
        """The compiled sampling step of a call that `forward` fed."""
        return compiled_regions.SAMPLING_STEP(self.decoder, logits, logits[0].shape[1])

    def _step(self, width: int) -> tuple[Any, ...]:
        """Forward and sampling step of the call in `inputs[width]`: what one graph holds."""
        logits = self.session.forward(self.inputs[width])
        return compiled_regions.SAMPLING_STEP(self.decoder, logits, width)


def weight_addresses(network: Optional[torch.nn.Module]) -> tuple[int, ...]:
    """Where each weight of `network` lies: ComfyUI may move any of them between two generations (a partial
    unload, then a load), and a graph would read the old addresses."""
    if network is None:
        return ()
    return tuple(tensor.data_ptr() for tensor in itertools.chain(network.parameters(), network.buffers()))


def calls_for(kept: Optional[StaticCalls], session: Any, decoder: Any,
              network: Optional[torch.nn.Module]) -> StaticCalls:
    """A generation's static calls, right after its prefill: `kept` (`KeptGraphs.take`) where its state has the
    layout of theirs and the weights lie where their graphs read them, else new ones for the `network`."""
    state = State.of([session, decoder])
    if (kept is not None and kept.graphs is not None and not kept.graphs.failed and kept.state.layout == state.layout
            and kept.weights_at == weight_addresses(network)):
        try:
            kept.taken_by(session, decoder, state)
            return kept
        except Exception as err:  # (a layout that matches should move) the image goes on with graphs of its own
            compiled_regions.warn_once("kept-graphs", f"the last image's CUDA graphs could not be reused, capturing "
                                       f"new ones: {compiled_regions.error_line(err)}")
    if kept is not None:
        kept.release()
    return StaticCalls(session, decoder, network, state)


class KeptGraphs:
    """The static calls a compiled model keeps from its last generation for its next (`kept`), where their
    window calls ran as CUDA graphs under torch's native allocator: they hold that generation's KV cache and
    graphs until the next takes them (`take`) or ComfyUI unloads the model (`forget`)."""

    def __init__(self) -> None:
        self.kept: Optional[StaticCalls] = None

    def take(self, session: Any) -> Optional[StaticCalls]:
        """The kept calls, taken for a generation that is about to prefill `session`: the session's static cache
        gets their cache's memory where it has its size (zeroed), so that it is not held twice and is where their
        graphs read it."""
        kept, self.kept = self.kept, None
        if kept is None:
            return None
        take = getattr(getattr(session, "cache", None), "take_memory", None)
        if callable(take) and take(kept.session.cache):
            return kept
        kept.release()  # a cache of another size: the kept one's memory is freed before this prefill allocates
        return None

    def keep(self, calls: Optional[StaticCalls]) -> None:
        """Keep a finished generation's static calls for the next generation, where their window calls ran as
        CUDA graphs under torch's native allocator; the next replays the graphs where its state has their layout
        (`graph_state`: the same batch and bucket of prompt lengths, the same sampler options on or off) instead
        of capturing its own."""
        if calls is None or calls.graphs is None or calls.graphs.failed:
            return
        if allocator_backend() == ASYNC_ALLOCATOR:
            compiled_regions.warn_once(
                "async-allocator", f"CUDA graphs are not kept between images under torch's {ASYNC_ALLOCATOR} "
                "allocator (ComfyUI's default on NVIDIA; --disable-cuda-malloc turns it off): each image "
                "captures its own")
            return
        self.kept = calls

    def kept_bytes(self) -> int:
        """The memory the kept calls hold in their state (the KV cache, mostly): the next generation reuses it, or
        frees it before it allocates its own (`take`)."""
        if self.kept is None:
            return 0
        storages = {tensor.untyped_storage().data_ptr(): tensor.untyped_storage().nbytes()
                    for tensor in self.kept.state.tensors.values()}
        return sum(storages.values())

    def forget(self) -> None:
        """Free the kept calls: their graphs and the KV cache they read (when ComfyUI unloads the model)."""
        kept, self.kept = self.kept, None
        if kept is not None:
            kept.release()


def kept_graphs(model: Any) -> KeptGraphs:
    """`model`'s kept graphs (`Compilable.graph_holder`), or an empty holder for a model that keeps none (not
    compiled)."""
    holder = getattr(model, "graph_holder", None)
    return KeptGraphs() if holder is None else holder


def allocator_backend() -> Optional[str]:
    """The CUDA allocator torch runs on, as it reports it ("native", or ASYNC_ALLOCATOR where
    PYTORCH_CUDA_ALLOC_CONF says backend:cudaMallocAsync); None without CUDA."""
    return torch.cuda.get_allocator_backend() if torch.cuda.is_available() else None


def graphs_available(device: torch.device) -> bool:
    """Whether the window call is captured as CUDA graphs on `device`."""
    return device.type == "cuda" and torch.cuda.is_available()
