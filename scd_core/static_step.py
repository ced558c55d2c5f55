"""Calls with static shapes: torch.compile'd regions and, on CUDA, one captured graph per window width.

A model loaded with `compile=True` runs every window call at its bucket's width (the window, or one of the
automatic window's widths 1, 2, 4, ..., 64): a call narrower than its bucket at the end of the image feeds
drafts past the last position, whose slots the engine already ignores (commits never pass the last
position, and each row's block verification ends at its last position, as in any call).  The family's
session reads its whole pre-sized KV cache with a mask built on the device (`RowCache.static`); per-row
lengths, positions, seed keys and call counters are device tensors; nothing in the forward,
the verification or the coupling reads a value back to the host.  So each bucket has one shape, and:

  - torch.compile (inductor, `dynamic=False`, `fullgraph=True`) compiles the family's decoder layer once per
    width (regional: one layer class serves every layer) and the engine's sampling step once per width
    and sampler setting, on any device;
  - on CUDA, the whole step (forward, distributions, verification, coupling) is captured as one CUDA graph
    per width and replayed with its inputs copied into a static buffer.

Either falls back to eager, with one warning, when it fails (whatever it raises: dynamo's and inductor's errors,
the recompile limit's plain Exception, a missing C++ compiler), and the generation's result lists what ran
eagerly and why (`eager_fallbacks`); on a torch older than the oldest the tests run
(OLDEST_TESTED_TORCH), compile=True runs eagerly with one warning.  Compiled code is kept for the process (and in
inductor's on-disk cache).  What it is specialised on is kept to shapes: the sampler's numbers are device
tensors (`sampling.sampler_tensors`), and a static KV cache holds its prompt's slots rounded up to a bucket
(`row_session.PROMPT_BUCKET`), so prompts of one bucket share their compiled code.  CUDA graphs hold the
addresses of the generation they were captured in (its KV cache, decoder state and input buffers): they are
kept with that memory for the model's next generation (`keep`), which replays them where its state has the same
layout (`graph_state`: the same batch and bucket of prompt lengths, the same sampler options on or off; the
prompt, the seed, the CFG scale, temperature, top-k and top-p values may differ) after copying its own state
into that memory.

Families that declare `compile` (`models.family.Family`) are `Compilable`: through their own blocks or the row
attention (`models.row_attention.attention_layer`).  Trees of candidates are refused
(they would grow the cache); rows that finish stay in the batch (regrouping would change the shapes).
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from typing import Any, Callable, Optional

import torch

from .capture_scope import outside_host_graphs
from .graph_state import State
from .model import Logits

# dynamo compiles one graph per width bucket, batch size, cache size and coupler for each compiled function;
# its default limit (8 per function) would be reached by a process that switches couplers
RECOMPILE_LIMIT = 64
OLDEST_TESTED_TORCH = (2, 11)  # tests/run.sh's oldest tier, the GPU image's: compile=True runs eagerly before it
WARMUP_CALLS = 2  # eager calls of a width before its graph is captured (they are real calls, not repeats)
BACKEND = "inductor"
# CUDA's own allocator: graphs have no private pool under it, and memory of a graph freed outside it (what a
# kept set's state is, once the next image rebinds it) warns and may be handed out again: graphs are not kept
ASYNC_ALLOCATOR = "cudaMallocAsync"
_WARNED: set[str] = set()
_EAGER = [0]  # > 0 within `eager_regions`


def _warn_once(key: str, message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _reason(err: Exception) -> str:
    """An error as one line for a warning or a report."""
    return f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"


def recompile_limit_name(config: Any) -> str:
    """The name of dynamo's per-function graph limit in `config` (torch._dynamo.config): `recompile_limit`
    from torch 2.7 on, `cache_size_limit` before."""
    return "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"


def raise_recompile_limit(config: Any) -> None:
    """Lift dynamo's per-function graph limit in `config` to RECOMPILE_LIMIT (never lower it)."""
    name = recompile_limit_name(config)
    setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))


def torch_tested(version: str) -> bool:
    """Whether torch `version` ("2.13.0+cu130") is at least the oldest one the compiled tests run on."""
    major, minor = (int("".join(ch for ch in part if ch.isdigit()) or 0) for part in version.split(".")[:2])
    return (major, minor) >= OLDEST_TESTED_TORCH


class CompiledRegion:
    """`fn` through torch.compile, or `fn` itself once compiling it failed (one warning per region)."""

    shared_across_generations = True  # (graph_state: one region for the model's or the process's life)

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self.fn, self.name = fn, name
        self.compiled: dict[str, Callable[..., Any]] = {}  # by BACKEND (tests trace with "eager": no codegen)
        self.error: Optional[str] = None  # why compiling failed, for reports (the device check's table)

    @property
    def failed(self) -> bool:
        return self.error is not None

    def __call__(self, *args: Any) -> Any:
        if self.failed or _EAGER[0]:
            return self.fn(*args)
        try:
            if BACKEND not in self.compiled:
                from torch import _dynamo  # (not `import torch._dynamo`: that would make `torch` a local name)

                raise_recompile_limit(_dynamo.config)
                self.compiled[BACKEND] = torch.compile(self.fn, dynamic=False, fullgraph=True, backend=BACKEND)
            return self.compiled[BACKEND](*args)
        except torch.cuda.OutOfMemoryError:  # not a compile failure: the eager call would need the memory too
            raise
        except Exception as err:  # compile failures have no common type; they raise before the graph runs
            # an error of `fn` itself raises again here, as it would have without compile
            result = self.fn(*args)
            self.error = _reason(err)
            _warn_once(f"compile:{self.name}", f"torch.compile of {self.name} failed, running it eagerly: "
                       f"{self.error}")
            return result


@contextlib.contextmanager
def eager_regions() -> Any:
    """Compiled regions run their own function within: for a call of a shape no bucket has (a call widened over
    given cells), which would compile a graph for a width that may not come again."""
    _EAGER[0] += 1
    try:
        yield
    finally:
        _EAGER[0] -= 1


def compile_region(fn: Callable[..., Any], name: str) -> CompiledRegion:
    """A compiled `fn` (tensors and constants in, tensors out) with an eager fallback."""
    return CompiledRegion(fn, name)


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
                self.error = _reason(err)
                torch.cuda.synchronize(self.weights.device)
                _warn_once("cuda-graph", f"CUDA graph capture of the window call failed, running it eagerly: "
                           f"{self.error}")
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


def _decide(decoder: Any, logits: Logits, width: int) -> tuple[torch.Tensor, torch.Tensor, None]:
    return decoder.decide(logits, width, 0, None)


# one region for the process: compiled once per width and sampler setting, whichever generation calls it
SAMPLING_STEP = compile_region(_decide, "the sampling step")


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
        return SAMPLING_STEP(self.decoder, logits, logits[0].shape[1])

    def _step(self, width: int) -> tuple[Any, ...]:
        """Forward and sampling step of the call in `inputs[width]`: what one graph holds."""
        logits = self.session.forward(self.inputs[width])
        return SAMPLING_STEP(self.decoder, logits, width)


def take_kept(model: Any, session: Any) -> Optional[StaticCalls]:
    """The static calls `model` kept from its last generation (`keep`), taken for a generation that is about
    to prefill `session`: the session's static cache gets their cache's memory where it has its size (zeroed),
    so that it is not held twice and is where their graphs read it."""
    kept, model.kept_calls = getattr(model, "kept_calls", None), None
    if kept is None:
        return None
    take = getattr(getattr(session, "cache", None), "take_memory", None)
    if callable(take) and take(kept.session.cache):
        return kept
    kept.release()  # a cache of another size: the kept one's memory is freed before this prefill allocates
    return None


def weight_addresses(network: Optional[torch.nn.Module]) -> tuple[int, ...]:
    """Where each weight of `network` lies: ComfyUI may move any of them between two generations (a partial
    unload, then a load), and a graph would read the old addresses."""
    if network is None:
        return ()
    return tuple(tensor.data_ptr() for tensor in itertools.chain(network.parameters(), network.buffers()))


def calls_for(kept: Optional[StaticCalls], session: Any, decoder: Any,
              network: Optional[torch.nn.Module]) -> StaticCalls:
    """A generation's static calls, right after its prefill: `kept` (`take_kept`) where its state has the layout
    of theirs and the weights lie where their graphs read them, else new ones for the `network`."""
    state = State.of([session, decoder])
    if (kept is not None and kept.graphs is not None and not kept.graphs.failed and kept.state.layout == state.layout
            and kept.weights_at == weight_addresses(network)):
        try:
            kept.taken_by(session, decoder, state)
            return kept
        except Exception as err:  # (a layout that matches should move) the image goes on with graphs of its own
            _warn_once("kept-graphs", f"the last image's CUDA graphs could not be reused, capturing new ones: "
                       f"{_reason(err)}")
    if kept is not None:
        kept.release()
    return StaticCalls(session, decoder, network, state)


def keep(model: Any, calls: Optional[StaticCalls]) -> None:
    """Keep a finished generation's static calls on `model` for its next generation, where their window calls ran
    as CUDA graphs under torch's native allocator.  They hold that generation's KV cache and graphs until then (or
    until `forget`); the next replays the graphs where its state has their layout (`graph_state`: the same batch
    and bucket of prompt lengths, the same sampler options on or off) instead of capturing its own."""
    if calls is None or calls.graphs is None or calls.graphs.failed:
        return
    if allocator_backend() == ASYNC_ALLOCATOR:
        _warn_once("async-allocator", f"CUDA graphs are not kept between images under torch's {ASYNC_ALLOCATOR} "
                   "allocator (ComfyUI's default on NVIDIA; --disable-cuda-malloc turns it off): each image "
                   "captures its own")
        return
    model.kept_calls = calls


def allocator_backend() -> Optional[str]:
    """The CUDA allocator torch runs on, as it reports it ("native", or ASYNC_ALLOCATOR where
    PYTORCH_CUDA_ALLOC_CONF says backend:cudaMallocAsync); None without CUDA."""
    return torch.cuda.get_allocator_backend() if torch.cuda.is_available() else None


def kept_bytes(model: Any) -> int:
    """The memory `model`'s kept calls hold in their state (the KV cache, mostly): its next generation reuses
    it, or frees it before it allocates its own (`take_kept`)."""
    kept = getattr(model, "kept_calls", None)
    if kept is None:
        return 0
    storages = {tensor.untyped_storage().data_ptr(): tensor.untyped_storage().nbytes()
                for tensor in kept.state.tensors.values()}
    return sum(storages.values())


def forget(model: Any) -> None:
    """Free the static calls `model` kept: their graphs and the KV cache they read (when ComfyUI unloads it)."""
    kept, model.kept_calls = getattr(model, "kept_calls", None), None
    if kept is not None:
        kept.release()


def eager_fallbacks(model: Any, calls: Optional[StaticCalls]) -> list[str]:
    """What of a compiled model's generation ran eagerly, and why: its compiled layer or the sampling step
    (whose compile failed, in this process), or its CUDA graphs (whose capture failed in this generation)."""
    regions = (getattr(model, "compiled_layer", None), SAMPLING_STEP)
    found = [f"{region.name}: {region.error}" for region in regions
             if isinstance(region, CompiledRegion) and region.failed]
    graphs = None if calls is None else calls.graphs
    if isinstance(graphs, GraphedSteps) and graphs.failed:
        found.append(f"the CUDA graphs of the window call: {graphs.error}")
    return found


class Compilable:
    """A TokenModel that `load_model(..., compile=True)` switches to static-shape calls: its family names the
    one-layer function its sessions run each decoder layer through (`layer_step`), compiled once for all
    layers, and hands `compiled_layer` to its sessions."""

    compiled = False
    compiled_layer: Optional[CompiledRegion] = None
    kept_calls: Optional[StaticCalls] = None  # its last generation's, where they ran as CUDA graphs (`keep`)
    shared_across_generations = True  # (graph_state: the model is not part of a generation's state)
    layer_step: Callable[..., torch.Tensor]

    def enable_compile(self) -> None:
        if not torch_tested(torch.__version__):
            _warn_once("old-torch", f"compile=True needs torch {'.'.join(map(str, OLDEST_TESTED_TORCH))} or newer "
                       f"(this is {torch.__version__}); running eagerly (the same images, uncompiled)")
            return
        self.compiled = True
        self.compiled_layer = compile_region(type(self).layer_step,
                                             f"the {getattr(self, 'family', 'model')} decoder layer")


def graphs_available(device: torch.device) -> bool:
    """Whether the window call is captured as CUDA graphs on `device`."""
    return device.type == "cuda" and torch.cuda.is_available()
