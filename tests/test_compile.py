"""compile=True (scd_core.compiled.compiled_regions, scd_core.compiled.cuda_graphs): the eager tokens, no graph
break, one compilation per width bucket, fixed tensor addresses, clear refusals.

Most tests trace with dynamo's "eager" backend: the same graphs, traced with `fullgraph=True` and the same
guards, without inductor's code generation (minutes per graph on a shared CPU); `test_inductor_*` runs the
real inductor on the smallest model at windows 1 and 8.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import random
import types
import warnings
from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from emu3_fixture import tiny_emu3_dir  # noqa: F401  (fixture)
from emu3p5_fixture import tiny_emu3p5_dir  # noqa: F401  (fixture)
from llamagen_fixture import write_safetensors_c2i, write_t2i
from lumina_fixture import tiny_lumina_dir  # noqa: F401  (fixture)
from scd_core import GenerationCancelled, ModelLoadError, SamplerConfig, generate, generate_many, load_model
from scd_core.windows import auto_window
from scd_core.compiled import compiled_regions, cuda_graphs, graph_state
from scd_core.decoding import sampling
from scd_core.windows.auto_window import candidate_widths
from scd_core.decoding.config import AUTO_WINDOW
from scd_core.decoding.given import GivenCells, continuation, from_cell_mask
from scd_core.models.sessions.row_session import PROMPT_BUCKET

COUPLINGS = [dict(coupler="maximal"), dict(coupler="gumbel"), dict(coupler="independent"),
             dict(coupler="faithful"), dict(coupler="independent", verification="block"),
             dict(coupler="maximal", alpha=0.5)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compile")
    return {"c2i": write_safetensors_c2i(root / "c2i"), "t2i": write_t2i(root / "t2i", with_t5=True)}


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dynamo's graphs without code generation; a graph break or failed compile is an error, not a warning."""
    monkeypatch.setattr(compiled_regions, "BACKEND", "eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        yield


def pair(folder: Path) -> tuple:
    return load_model(folder, device="cpu"), load_model(folder, device="cpu", compile=True)


def assert_same_run(eager, compiled, cond, config: SamplerConfig, batch_size: int = 1) -> None:
    a = generate(eager, cond, config, batch_size=batch_size)
    b = generate(compiled, cond, config, batch_size=batch_size)
    assert torch.equal(a.tokens, b.tokens), config
    # the same calls and commits; with one image the same statistics too (the padded calls are cut back to
    # their true width), while with more the eager run drops finished rows from the batch and averages over
    # the others only
    assert (a.nfe, a.windows, a.committed) == (b.nfe, b.windows, b.committed)
    if batch_size == 1:
        assert (a.acceptance, a.draft_changes) == (b.acceptance, b.draft_changes)


@pytest.mark.parametrize("window", [1, 8])
@pytest.mark.parametrize("settings", COUPLINGS, ids=lambda s: "-".join(map(str, s.values())))
def test_tokens_match_eager_every_coupler(folders, traced, settings: dict, window: int) -> None:
    eager, compiled = pair(folders["c2i"])
    cond = eager.encode("3")
    # two images at their own pace: the faster one runs past the end while the slower one finishes
    assert_same_run(eager, compiled, cond, SamplerConfig(window=window, seed=5, **settings), batch_size=2)


@pytest.mark.parametrize("family", ["janus", "emu3", "emu3p5"])
def test_transformers_families_match_eager(request: pytest.FixtureRequest, traced, family: str) -> None:
    """Janus-Pro and Emu3 run their layers through the row attention (one compiled graph for all layers);
    left-padded CFG prefixes of two lengths, forced row-end tokens (Emu3).  In float64: the compiled calls
    attend over the whole static cache (its spare prompt slots included), whose float32 sums round apart
    from the eager calls' at some seeds (block verification's accept rule jumps where p = q); the function
    computed is the same, which float64 shows token for token."""
    folder = request.getfixturevalue(f"tiny_{family}_dir")
    eager, compiled = (load_model(folder, device="cpu", dtype="float64", compile=flag) for flag in (False, True))
    if family == "emu3":
        eager.set_image_size(32, 24)  # 4 x 3 codes of 8 px, a row-end token after each row
    if family == "emu3p5":
        eager.set_image_size(48, 32)  # 2 x 3 codes of 16 px, a row end after the first row, the image end
    cond = eager.encode("a red cat", *([] if family == "emu3p5" else ["blue"]))  # Emu3.5: no negative prompt
    for window in (1, 8):
        for settings in (dict(coupler="maximal"), dict(coupler="gumbel"),
                         dict(coupler="independent", verification="block")):
            assert_same_run(eager, compiled, cond, SamplerConfig(window=window, seed=3, **settings), batch_size=2)


def test_text_conditional_padding(folders, traced) -> None:
    """Caption padding in the prefix: the device-built mask over the whole cache hides it as the sliced one."""
    eager, compiled = pair(folders["t2i"])
    cond = eager.encode("a red cat")
    for settings in (dict(coupler="maximal"), dict(coupler="independent", verification="block")):
        assert_same_run(eager, compiled, cond, SamplerConfig(window=8, seed=2, **settings))


def test_every_bucket_traces_as_one_graph(folders, traced) -> None:
    """fullgraph=True at every width the automatic window uses: a break would raise (an error here)."""
    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    eager, compiled = pair(folders["c2i"])
    cond = eager.encode("1")
    widths = candidate_widths(eager.num_tokens)
    for window in widths:
        assert_same_run(eager, compiled, cond, SamplerConfig(window=window, seed=1))
    # one block graph and one sampling-step graph per width (the prefill runs eagerly), nothing more
    assert counters["stats"]["unique_graphs"] - before == 2 * len(widths)
    assert not compiled.compiled_layer.failed and not compiled_regions.SAMPLING_STEP.failed
    assert generate(compiled, cond, SamplerConfig(window=8, seed=1)).eager_fallbacks == []


def test_whole_step_traces_as_one_graph(folders, traced, monkeypatch: pytest.MonkeyPatch) -> None:
    """What one CUDA graph holds -- forward, distributions, verification, coupling -- traces as one graph with
    fullgraph=True at every width, so nothing in it reads a value back to the host; run through the engine's
    graph path (the decisions come back with the forward), it gives the eager tokens."""
    widths_traced: list[int] = []

    def traced_graphs(self, session, decoder, network, state):
        original_init(self, session, decoder, network, state)
        whole = torch.compile(self._step, fullgraph=True, dynamic=False, backend="eager")

        def replay(width: int):
            widths_traced.append(width)
            return whole(width)
        replay.failed = False  # (as GraphedSteps: kept for the next generation)
        self.graphs = replay

    original_init = cuda_graphs.StaticCalls.__init__
    monkeypatch.setattr(cuda_graphs.StaticCalls, "__init__", traced_graphs)
    # the regions themselves run inside the one traced step
    monkeypatch.setattr(compiled_regions, "SAMPLING_STEP", compiled_regions._decide)
    eager, compiled = pair(folders["c2i"])
    monkeypatch.setattr(compiled, "compiled_layer", compiled.layer_step)
    cond = eager.encode("8")
    widths = candidate_widths(eager.num_tokens)
    for window in widths:
        assert_same_run(eager, compiled, cond, SamplerConfig(window=window, seed=2, coupler="gumbel"))
    assert sorted(set(widths_traced)) == widths  # every window call went through the traced step


def test_no_recompilation_after_warm_up(folders, traced) -> None:
    eager, compiled = pair(folders["c2i"])
    cond = eager.encode("2")
    generate(compiled, cond, SamplerConfig(window=8, seed=0), batch_size=2)
    # other seeds end the image with other narrow calls: padded to the bucket, they compile nothing new
    with torch.compiler.set_stance("fail_on_recompile"):
        for seed in (1, 2, 3):
            assert_same_run(eager, compiled, cond, SamplerConfig(window=8, seed=seed), batch_size=2)


def test_tensors_keep_their_addresses(folders, traced, monkeypatch: pytest.MonkeyPatch) -> None:
    """What CUDA graph replay needs: the inputs, the cache and the engine's state stay where they are."""
    seen: list[tuple[int, ...]] = []
    forward = cuda_graphs.StaticCalls.forward

    def recording(self, inputs):
        out = forward(self, inputs)
        cache, decoder = self.session.cache, self.decoder
        tensors = [self.inputs[inputs.shape[1]], cache.lengths, *cache.keys, *cache.values, decoder.seq,
                   decoder.committed, decoder.proposals, decoder.keys, decoder.calls, decoder.rows]
        seen.append(tuple(t.data_ptr() for t in tensors))
        return out

    monkeypatch.setattr(cuda_graphs.StaticCalls, "forward", recording)
    compiled = load_model(folders["c2i"], device="cpu", compile=True)
    result = generate(compiled, compiled.encode("4"), SamplerConfig(window=4, seed=3), batch_size=2)
    assert len(seen) == result.nfe - 1 > 3
    assert len(set(seen)) == 1


class KernelTrace(TorchDispatchMode):
    """What a CUDA graph captured from one step would replay: each op with its arguments, where a tensor is
    named by the memory it lives in.  Memory the step did not make (the caches, the decoder's state, the
    weights) is named by its address, which a graph holds; memory the step made is named by the order it was
    made in (the graph's own pool); numbers, shapes and flags are taken as they are, since a graph keeps
    the values of its capture.  A constant the step makes from a Python number (`lift_fresh`: `h[:, 0] = 0.0`)
    is the step's own memory."""

    def __init__(self) -> None:
        super().__init__()
        self.made: dict[int, int] = {}  # storage address -> order made in
        self.ops: list[tuple] = []
        self.count = itertools.count()

    @property
    def external(self) -> frozenset:
        """The addresses the step read that it did not make."""
        return frozenset(name[1] for op in self.ops for name in op if isinstance(name, tuple) and name[0] == "at")

    def _name(self, value):
        if not isinstance(value, torch.Tensor):
            return value
        address = value.untyped_storage().data_ptr()
        where = ("made", self.made[address]) if address in self.made else ("at", address)
        return where + (value.dtype, tuple(value.shape), value.stride(), value.storage_offset())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {value.untyped_storage().data_ptr() for value in pytree.tree_leaves((args, kwargs))
                  if isinstance(value, torch.Tensor)}
        if func is torch.ops.aten.lift_fresh.default:
            inputs.discard(args[0].untyped_storage().data_ptr())
            self.made[args[0].untyped_storage().data_ptr()] = next(self.count)
        self.ops.append((str(func),) + tuple(self._name(value) for value in pytree.tree_leaves((args, kwargs))))
        out = func(*args, **kwargs)
        for value in pytree.tree_leaves(out):  # a view or an in-place result keeps its input's name
            if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() not in inputs:
                self.made[value.untyped_storage().data_ptr()] = next(self.count)
        return out


class EmulatedGraphs:
    """`cuda_graphs.GraphedSteps` on this CPU: each call of a width runs its step under a `KernelTrace` (what a
    graph captured from it would replay), kept by width; every set made is listed in `made`."""

    failed = False
    made: list["EmulatedGraphs"] = []

    def __init__(self, step, weights) -> None:
        self.step = step
        self.traces: dict[int, list[KernelTrace]] = {}
        self.made.append(self)

    def __call__(self, width: int):
        with KernelTrace() as trace:
            outputs = self.step(width)
        self.traces.setdefault(width, []).append(trace)
        return outputs

    def assert_replays_its_captures(self) -> None:
        """Each call of a width ran the kernels of the width's first call (its capture), on the same memory and
        with the same numbers."""
        for width, calls in self.traces.items():
            first = calls[0]
            assert all(call.external == first.external for call in calls), width  # the same memory read
            for call in calls[1:]:  # the same ops, memory and numbers, or the first op that differs
                assert len(call.ops) == len(first.ops), width
                assert next(((a, b) for a, b in zip(first.ops, call.ops) if a != b), None) is None, width


@pytest.fixture
def emulated_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's CUDA-graph path on this CPU, its captures emulated (`EmulatedGraphs`), the compiled regions
    run eagerly (the traces record reads, not code)."""
    monkeypatch.setattr(EmulatedGraphs, "made", [])
    monkeypatch.setattr(cuda_graphs, "graphs_available", lambda device: True)
    monkeypatch.setattr(cuda_graphs, "GraphedSteps", EmulatedGraphs)
    monkeypatch.setattr(compiled_regions, "SAMPLING_STEP", compiled_regions._decide)


EMULATED_SIZES = {"emu3": (32, 24), "emu3p5": (48, 32)}  # 4 x 3 codes of 8 px; 2 x 3 codes of 16 px


def emulated_pair(request: pytest.FixtureRequest, folders, monkeypatch: pytest.MonkeyPatch, family: str) -> tuple:
    """The eager and the compiled model of `family` ("demo" and "t2i": LlamaGen's own blocks, class- and
    text-conditioned), the compiled one's layer run eagerly; Emu3 and Emu3.5 at EMULATED_SIZES (row-end tokens).  Float64 for the row-attention families: their static cache's float32 sums may round apart from
    eager's (see test_transformers_families_match_eager); what a graph reads does not depend on it."""
    own_blocks = {"demo": "c2i", "t2i": "t2i"}
    folder = folders[own_blocks[family]] if family in own_blocks else request.getfixturevalue(f"tiny_{family}_dir")
    dtype = "float32" if family in own_blocks else "float64"
    eager, compiled = (load_model(folder, device="cpu", dtype=dtype, compile=flag) for flag in (False, True))
    monkeypatch.setattr(compiled, "compiled_layer", compiled.layer_step)
    if family in EMULATED_SIZES:
        for model in (eager, compiled):
            model.set_image_size(*EMULATED_SIZES[family])
    return eager, compiled


@pytest.mark.parametrize("family", ["demo", "t2i", "janus", "emu3", "emu3p5"])
@pytest.mark.parametrize("settings", [dict(coupler="faithful", window=AUTO_WINDOW),
                                      dict(coupler="maximal", window=8, top_k=5, cfg_scale=3.0),
                                      dict(coupler="independent", window=4, verification="block")],
                         ids=lambda s: "-".join(map(str, s.values())))
def test_what_a_graph_would_replay_is_what_every_call_runs(
        request: pytest.FixtureRequest, folders, monkeypatch: pytest.MonkeyPatch, unlearned_auto_window,
        emulated_graphs, family: str, settings: dict) -> None:
    """The CUDA-graph path run on this CPU with the capture emulated: the step a graph holds (forward and
    sampling step of one width, `StaticCalls._step`) runs eagerly under a dispatch mode that records its
    kernels as a graph would (`KernelTrace`).  A graph replays its capture, so each call of a width must run
    the very ops its first call ran, on the same memory and with the same numbers: a tensor rebound to new
    memory between calls would be read stale on a GPU, a host number that changed would keep its captured
    value (wrong tokens, no error); and the tokens are eager's."""
    eager, compiled = emulated_pair(request, folders, monkeypatch, family)
    cond = eager.encode("4" if family == "demo" else "a red cat")
    for model in (eager, compiled):  # fixed costs on which the automatic window calls several widths, alike
        auto_window.remember_costs(model, 2, {w: w ** 0.7 for w in candidate_widths(eager.num_tokens)})
    config = SamplerConfig(seed=2, **settings)
    assert_same_run(eager, compiled, cond, config, batch_size=2)
    [graphs] = EmulatedGraphs.made
    traces = graphs.traces
    assert traces and sum(map(len, traces.values())) > len(traces)  # widths called more than once
    assert len(traces) > 1 or settings["window"] != AUTO_WINDOW  # the automatic window's several graphs
    graphs.assert_replays_its_captures()


@pytest.mark.parametrize("family", ["demo", "t2i", "janus", "emu3", "emu3p5"])
def test_kept_graphs_replay_in_later_generations_what_they_captured(
        request: pytest.FixtureRequest, folders, monkeypatch: pytest.MonkeyPatch, unlearned_auto_window,
        emulated_graphs, family: str) -> None:
    """CUDA graphs kept from one generation for the next (`KeptGraphs.keep`), emulated as above: a generation
    whose state has the kept one's layout (batch, bucket of prompt lengths, sampler options on or off) takes
    the kept calls over, its tensors moved into their memory (`graph_state`), and every call of a width, in
    every generation that replays it, runs what its capture ran; a generation of another layout makes its own.
    The tokens are eager's, and stay so when later generations reuse the memory."""
    eager, compiled = emulated_pair(request, folders, monkeypatch, family)
    for model in (eager, compiled):
        for batch in (1, 2):
            auto_window.remember_costs(model, batch, {w: w ** 0.7 for w in candidate_widths(eager.num_tokens)})
    prompt, same_length, longer = ("4", "5", None) if family == "demo" else ("a red cat", "a red dog", "a red cat, oil")
    if family == "emu3p5":  # its tiny tokenizer is nearly byte-level: 61 prompt tokens, 5 more leave the bucket of 64
        longer = "a red cat,"
    another_bucket = None if family == "demo" else longer + ", " + "in the style of a painting " * 10
    base = dict(coupler="faithful", window=8, top_k=5, top_p=0.95, cfg_scale=3.0)

    def move_a_weight() -> None:  # one that the kept graphs read ...
        read = {address for calls in EmulatedGraphs.made[-1].traces.values() for call in calls
                for address in call.external}
        weight = next(weight for weight in reversed(list(compiled.module.parameters()))
                      if weight.untyped_storage().data_ptr() in read)
        weight.data = weight.data.clone()

    # (prompt, settings, batch, whether the generation takes the last one's calls over)
    generations = [(prompt, dict(seed=1), 1, False),
                   (prompt, dict(seed=2, cfg_scale=2.0, temperature=0.7, top_k=9, top_p=0.9), 1, True),
                   (same_length, dict(seed=3), 1, True),
                   (prompt, dict(seed=4, window=AUTO_WINDOW), 1, False),  # buffers sized for its widest call
                   (prompt, dict(seed=5, window=AUTO_WINDOW, cfg_scale=4.0), 1, True),  # several widths replayed
                   (prompt, dict(seed=6, top_k=None), 1, False),  # no top-k: another step
                   (prompt, dict(seed=7), 2, False),  # another batch
                   (prompt, dict(seed=8), 2, True),
                   (prompt, dict(seed=9, coupler="maximal"), 2, False),
                   (prompt, dict(seed=10, coupler="maximal", alpha=0.5), 2, False),  # a number the step reads
                   (prompt, dict(seed=11, coupler="maximal", alpha=0.75), 2, False),
                   (prompt, dict(seed=12, coupler="maximal", alpha=0.75), 2, True),
                   move_a_weight,  # ... as ComfyUI's partial unload and a later load move some
                   (prompt, dict(seed=20, coupler="maximal", alpha=0.75), 2, False),
                   (prompt, dict(seed=21, coupler="maximal", alpha=0.75), 2, True)]
    if longer is not None:  # a longer prompt of the same bucket of lengths (the cache's size), then of another
        last = dict(coupler="maximal", alpha=0.75)  # (the settings of the last generation above)
        generations += [(longer, dict(seed=13, **last), 2, True),
                        (another_bucket, dict(seed=14, **last), 2, family == "t2i"),  # (T5 prompts: one length)
                        (another_bucket, dict(seed=15, **last), 2, True)]
    else:  # an image's cells kept outside a region from one cell on (the cells before it fed with the prompt)
        image = generate(eager, eager.encode(prompt), SamplerConfig(seed=0)).tokens
        rows, cols = eager.grid

        def region_kept(last_row: int):
            def given(model):
                region = torch.zeros(1, rows, cols, dtype=torch.bool)
                region[:, rows // 4:last_row, cols // 2:] = True
                return GivenCells(model.encode(prompt), image, from_cell_mask(image, region, model.grid))
            return given
        generations += [(region_kept(rows), dict(seed=16), 2, False),  # calls widened over kept cells
                        (region_kept(rows // 4 + 1), dict(seed=17, cfg_scale=2.0), 2, True)]  # other kept cells
    made, results, cache = 0, [], None
    for entry in generations:
        if callable(entry):
            entry()
            continue
        text, settings, batch, taken_over = entry
        config = SamplerConfig(**{**base, **settings})
        cond = text if callable(text) else lambda model: model.encode(text)
        expected = generate(eager, cond(eager), config, batch_size=batch)
        results.append((expected, generate(compiled, cond(compiled), config, batch_size=batch)))
        assert torch.equal(results[-1][1].tokens, expected.tokens), (text, settings)
        assert len(EmulatedGraphs.made) == made + (not taken_over), (text, settings, batch)
        made = len(EmulatedGraphs.made)
        # a cache of the kept one's size (one batch, one bucket of prompt lengths) is the kept one's memory
        keys = compiled.graph_holder.kept.session.cache.keys[0]
        assert (keys is cache) == (cache is not None and keys.shape == cache.shape), (text, settings)
        cache = keys
    assert all(torch.equal(a.tokens, b.tokens) for a, b in results)  # no result reads memory reused since
    assert compiled.graph_holder.kept is not None and eager.graph_holder is None
    for graphs in EmulatedGraphs.made:
        graphs.assert_replays_its_captures()
    assert sum(len(calls) > 1 for graphs in EmulatedGraphs.made for calls in graphs.traces.values()) > 3


def test_kept_graphs_that_cannot_be_reused_give_way_to_new_ones(
        request: pytest.FixtureRequest, folders, monkeypatch: pytest.MonkeyPatch, emulated_graphs) -> None:
    """A take-over that fails (whatever it raises) warns once and captures anew: the image is eager's."""
    def broken(self, kept, root):
        raise RuntimeError("unsupported operation: overlapping memory")

    monkeypatch.setattr(compiled_regions, "_WARNED", set())
    monkeypatch.setattr(graph_state.State, "move_to", broken)
    eager, compiled = emulated_pair(request, folders, monkeypatch, "demo")
    cond = eager.encode("6")
    with pytest.warns(RuntimeWarning, match="could not be reused, capturing new ones: RuntimeError: unsupported"):
        for seed in (1, 2, 3):
            assert_same_run(eager, compiled, cond, SamplerConfig(window=8, seed=seed))
    assert len(EmulatedGraphs.made) == 3


def test_inductor_tokens_match_eager(folders) -> None:
    """The real compiler (inductor, C++ on this CPU) at windows 1 and 8."""
    eager, compiled = pair(folders["c2i"])
    cond = eager.encode("5")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for window in (1, 8):
            assert_same_run(eager, compiled, cond, SamplerConfig(window=window, seed=4), batch_size=2)


def test_failed_compilation_runs_eagerly_with_one_warning(folders, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(graph, example_inputs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(compiled_regions, "BACKEND", broken)
    monkeypatch.setattr(compiled_regions, "_WARNED", set())
    monkeypatch.setattr(compiled_regions.SAMPLING_STEP, "error", None)
    eager, compiled = pair(folders["c2i"])
    cond = eager.encode("6")
    with pytest.warns(RuntimeWarning, match="torch.compile of .* failed, running it eagerly") as caught:
        assert_same_run(eager, compiled, cond, SamplerConfig(window=8, seed=6))
        assert_same_run(eager, compiled, cond, SamplerConfig(window=8, seed=7))
    messages = [str(w.message) for w in caught if "torch.compile" in str(w.message)]
    assert len(messages) == 2  # one per region (the block, the sampling step), not one per call
    assert compiled.compiled_layer.failed and compiled_regions.SAMPLING_STEP.failed
    assert "RuntimeError: no compiler here" in compiled.compiled_layer.error  # what reports show (device check)
    # and what each generation's result says ran eagerly
    assert generate(compiled, cond, SamplerConfig(window=8, seed=6)).eager_fallbacks == [
        f"{compiled.compiled_layer.name}: {compiled.compiled_layer.error}",
        f"the sampling step: {compiled_regions.SAMPLING_STEP.error}"]
    assert generate(eager, cond, SamplerConfig(window=8, seed=6)).eager_fallbacks == []


def test_failed_graph_capture_runs_the_step_eagerly_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA graph that cannot be captured (this CPU has none to capture: the capture is made to raise as it
    would) runs its step eagerly from then on, warns once, and keeps the reason for the generation's
    result."""
    class NoCapture:
        def __init__(self) -> None:
            raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", NoCapture)
    monkeypatch.setattr(cuda_graphs, "WARMUP_CALLS", 0)
    monkeypatch.setattr(compiled_regions, "_WARNED", set())
    steps = []
    graphs = cuda_graphs.GraphedSteps(lambda width: steps.append(width) or (torch.full((width,), 1.0),),
                                      torch.zeros(1))
    with pytest.warns(RuntimeWarning, match="CUDA graph capture of the window call failed, running it eagerly: "
                                            "RuntimeError: operation not permitted"):
        assert torch.equal(graphs(4)[0], torch.ones(4))
    assert torch.equal(graphs(2)[0], torch.ones(2)) and steps == [4, 2]  # no capture tried again
    monkeypatch.setattr(compiled_regions.SAMPLING_STEP, "error", None)
    assert compiled_regions.eager_fallbacks(object(), graphs) == [
        f"the CUDA graphs of the window call: {graphs.error}"]


def test_capture_runs_in_thread_local_error_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture asks for the thread-local error mode (another thread's CUDA work does not fail it), once per
    width, and the later calls replay it."""
    modes, replays, steps = [], [], []

    @contextlib.contextmanager
    def graph(cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        modes.append(capture_error_mode)
        yield

    class Graph:
        def replay(self) -> None:
            replays.append(self)

        def pool(self) -> str:
            return "the pool"

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(cuda_graphs, "WARMUP_CALLS", 0)
    graphs = cuda_graphs.GraphedSteps(lambda width: steps.append(width) or (torch.ones(width),), torch.zeros(1))
    for _ in range(3):
        assert torch.equal(graphs(4)[0], torch.ones(4))
    assert modes == ["thread_local"] and steps == [4] and len(replays) == 3 and graphs.pool == "the pool"


def test_refusals(folders, tiny_lumina_dir: Path) -> None:
    compiled = load_model(folders["c2i"], device="cpu", compile=True)
    with pytest.raises(ValueError, match="candidates=2 is not available with a compiled model"):
        generate(compiled, compiled.encode("1"), SamplerConfig(coupler="maximal", window=8, candidates=2))
    with pytest.raises(ModelLoadError, match="compile=True is not available .*lumina family"):
        load_model(tiny_lumina_dir, device="cpu", compile=True)
    with pytest.raises(ValueError, match="compile must be True or False"):
        load_model(folders["c2i"], device="cpu", compile="yes")



def test_generate_many_runs_batches_of_consecutive_seeds(folders, traced, monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """A compiled model's generate_many runs groups as batches (no row joins a static batch): every window call
    is a static one, and every job's tokens are its own seed's eager image, alone, whatever row of a compiled
    batch it decoded in."""
    static_calls = []
    forward = cuda_graphs.StaticCalls.forward
    monkeypatch.setattr(cuda_graphs.StaticCalls, "forward",
                        lambda self, *args: static_calls.append(1) or forward(self, *args))
    eager, compiled = pair(folders["c2i"])
    three, five = eager.encode("3"), eager.encode("5")
    jobs = [(three, 7), (three, 8), (five, 2**64 - 1), (three, 4)]
    config = SamplerConfig(window=8, coupler="gumbel")
    results = dict(generate_many(compiled, iter(jobs), config, slots=2))
    assert sorted(results) == [0, 1, 2, 3]
    assert results[0].nfe == results[1].nfe  # seeds 7 and 8 of one prompt: one batch
    assert len(static_calls) == sum(results[index].nfe - 1 for index in (0, 2, 3))  # all but the prefills
    for index, (cond, seed) in enumerate(jobs):
        alone = generate(eager, cond, dataclasses.replace(config, seed=seed))
        assert torch.equal(results[index].tokens, alone.tokens), (index, seed)


def test_sampler_tensors_give_the_same_probabilities() -> None:
    """The numbers a compiled step reads from the device: bit-equal probabilities to the host numbers, top-k
    from the sorted logits included (ties at the k-th value kept, as topk's threshold keeps them)."""
    generator = torch.Generator().manual_seed(0)
    cond, uncond = (torch.randn(2, 3, 50, generator=generator) * 4 for _ in range(2))
    cond[0, 0, :6] = cond[0, 0, 0]  # a tie across the k-th value
    for numbers in [(3.5, 0.7, 5, 1.0), (1.0, 1.3, None, 0.9), (7.0, 0.45, 1, 0.5), (2.0, 1.0, 49, 1.0),
                    (1.0, 1.0, 50, 1.0)]:
        settings = sampling.Sampling(**dict(zip(("cfg_scale", "temperature", "top_k", "top_p"), numbers)))
        on_device = sampling.sampler_tensors(settings, vocab=50, device=torch.device("cpu"))
        assert torch.equal(sampling.to_probs(cond, uncond, on_device), sampling.to_probs(cond, uncond, settings))
    # what changes nothing stays a host constant: applying it would be another graph, not another value
    kept = sampling.sampler_tensors(sampling.Sampling(top_k=50), 50, torch.device("cpu"))
    assert (kept.cfg_scale, kept.top_k) == (1.0, None)


def test_sampler_numbers_match_eager(folders, traced) -> None:
    eager, compiled = pair(folders["t2i"])
    cond = eager.encode("a red cat")
    for numbers in (dict(cfg_scale=3.5, temperature=0.7, top_k=5), dict(cfg_scale=1.0, top_k=12, top_p=0.8)):
        assert_same_run(eager, compiled, cond, SamplerConfig(window=4, seed=8, **numbers), batch_size=2)


def test_recompile_limit_of_every_torch() -> None:
    """torch 2.4-2.6 name the limit cache_size_limit, later ones recompile_limit; it is only ever raised."""
    for name in ("recompile_limit", "cache_size_limit"):
        for before, after in ((8, compiled_regions.RECOMPILE_LIMIT), (1000, 1000)):
            config = types.SimpleNamespace(**{name: before})
            compiled_regions.raise_recompile_limit(config)
            assert vars(config) == {name: after}


def test_untested_torch_runs_eagerly_with_one_warning(folders, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled_regions, "_WARNED", set())
    monkeypatch.setattr(torch, "__version__", "2.6.0+cu124")
    with pytest.warns(RuntimeWarning, match=r"compile=True needs torch 2\.11 or newer \(this is 2\.6\.0\+cu124\); "
                                            "running eagerly") as caught:
        eager, compiled = pair(folders["c2i"])
        load_model(folders["c2i"], device="cpu", compile=True)
    assert len(caught) == 1 and not compiled.compiled
    assert_same_run(eager, compiled, eager.encode("2"), SamplerConfig(window=8, seed=1))
    assert [compiled_regions.torch_tested(v) for v in ("2.4.1", "2.10.0a0+git", "2.11.0", "2.14.1+cu130", "3.0")] == [
        False, False, True, True, True]


def test_recompile_limit_runs_eagerly_with_one_warning(folders, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past dynamo's limit, fullgraph=True raises a plain Exception (FailOnRecompileLimitHit): each region
    warns once and runs eagerly from then on, with the eager tokens."""
    torch._dynamo.reset()
    monkeypatch.setattr(compiled_regions, "BACKEND", "eager")
    monkeypatch.setattr(compiled_regions, "RECOMPILE_LIMIT", 1)
    monkeypatch.setattr(compiled_regions, "_WARNED", set())
    monkeypatch.setattr(compiled_regions.SAMPLING_STEP, "error", None)
    eager, compiled = pair(folders["c2i"])
    cond = eager.encode("6")
    with torch._dynamo.config.patch(**{compiled_regions.recompile_limit_name(torch._dynamo.config): 1}):
        with pytest.warns(RuntimeWarning, match="torch.compile of .* failed, running it eagerly: .*[Rr]ecompile"
                          ) as caught:
            for window in (4, 2, 8):  # one graph per region and width: past the limit at the second
                assert_same_run(eager, compiled, cond, SamplerConfig(window=window, seed=6))
    assert len([w for w in caught if "torch.compile" in str(w.message)]) == 2  # the block, the sampling step
    torch._dynamo.reset()


def _session_settings(count: int, windows: list, seed: int, vocab: int) -> list[tuple[int, SamplerConfig]]:
    """`count` (prompt words, config) pairs as a ComfyUI user makes them: new prompts, guidance scales,
    temperatures and top-k values (`vocab`: none), at the windows given in turn."""
    rng = random.Random(seed)
    return [(rng.randrange(12), SamplerConfig(window=windows[index % len(windows)], seed=index,
                                              cfg_scale=round(rng.uniform(1.5, 8.0), 2),
                                              temperature=round(rng.uniform(0.5, 1.5), 2),
                                              top_k=rng.choice([vocab, rng.randrange(2, vocab)])))
            for index in range(count)]


@pytest.mark.parametrize("family", ["demo", "janus"])
def test_a_long_comfyui_session_stops_compiling(request: pytest.FixtureRequest, folders, traced,
                                                unlearned_auto_window, family: str) -> None:
    """One loaded model, many generations as a ComfyUI session makes them: once the first few have compiled
    every width (with and without top-k, pinned and automatic), new prompt lengths (Janus-Pro), guidance
    scales, temperatures and top-k values compile nothing more (dynamo's own graph count), and nothing fails (a
    failed compile would warn: an error here).  The automatic window runs on costs that make it call width 4
    only and explores no other (`unlearned_auto_window`), so that which widths it picks is known: each further
    width it may pick is one more graph per region and top-k use, bounded as the pinned widths are (its
    buffers are sized for its widest width, so its graphs are not the pinned window's)."""
    torch._dynamo.reset()
    folder = request.getfixturevalue("tiny_janus_dir") if family == "janus" else folders["c2i"]
    model = load_model(folder, device="cpu", compile=True)
    widths = candidate_widths(model.num_tokens)
    auto_window.remember_costs(model, 1, {width: 1.0 if width == 4 else 1000.0 for width in widths})
    prompt = (lambda words: model.encode(" ".join(["cat"] * words))) if family == "janus" else (
        lambda words: model.encode(str(words % 10)))
    pinned = widths if family == "janus" else [4]
    # Janus: the shortest and the longest prompt, one in each prompt bucket (cfg_session.PROMPT_BUCKET)
    warm_up_words = (0, 11) if family == "janus" else (0,)
    for window in [*pinned, AUTO_WINDOW]:
        for top_k in (model.vocab_size, 7):  # without top-k, with it
            for words in warm_up_words:
                generate(model, prompt(words), SamplerConfig(window=window, seed=0, top_k=top_k))
    compiled_graphs = counters["stats"]["unique_graphs"]
    session = _session_settings(20 if family == "janus" else 6, [4, AUTO_WINDOW, 2 if family == "janus" else 4],
                                seed=len(family), vocab=model.vocab_size)
    prompt_lengths = set()
    for words, config in session:
        cond = prompt(words)
        prompt_lengths.add(len(getattr(cond, "cond", ())))
        generate(model, cond, config)
        assert counters["stats"]["unique_graphs"] == compiled_graphs, config
    assert family == "demo" or len(prompt_lengths) > 5
    if family == "janus":  # the lengths span two buckets, and no more (else the warm-up missed one)
        assert len({-(-length // PROMPT_BUCKET) for length in prompt_lengths}) == 2


@pytest.mark.parametrize("settings", [dict(coupler="faithful", window=8), dict(coupler="maximal", window=4)],
                         ids=lambda s: "-".join(map(str, s.values())))
def test_given_cells_match_eager(folders, traced, settings: dict) -> None:
    """Kept cells in a compiled run: calls widened past a bucket run eagerly, the others in their graphs."""
    eager, compiled = pair(folders["c2i"])
    cond = eager.encode("3")
    image = generate(eager, cond, SamplerConfig(seed=1)).tokens
    rows, cols = eager.grid
    region = torch.zeros(1, rows, cols, dtype=torch.bool)
    region[:, rows // 4:, cols // 2:] = True
    for keep in (continuation(image, rows // 2, eager.grid), from_cell_mask(image, region, eager.grid)):
        given = GivenCells(cond, image, keep)
        assert_same_run(eager, compiled, given, SamplerConfig(seed=5, **settings), batch_size=2)
        result = generate(compiled, given, SamplerConfig(seed=5, **settings))
        assert torch.equal(result.tokens[keep], image[keep])


def tensor_bytes() -> int:
    """The bytes of every tensor storage that Python holds, collectable garbage included (with the cycle
    collector off, what a reference cycle keeps is still here)."""
    storages = {}
    for value in gc.get_objects():
        if type(value) in (torch.Tensor, torch.nn.Parameter) and value.device.type != "meta":
            storage = value.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


class Stop(Exception):
    """An error a callback raises mid-generation."""


class PlainGraphs:
    """`cuda_graphs.GraphedSteps` on this CPU without a capture: each call runs its step, and the set holds the
    step as the real one does (a method of the static calls that hold the set)."""

    failed = False
    made = 0  # sets made (a count: a list would hold them)

    def __init__(self, step, weights) -> None:
        self.step = step
        type(self).made += 1

    def __call__(self, width: int):
        return self.step(width)


@pytest.mark.parametrize("family", ["demo", "janus"])
def test_a_cancel_or_an_error_frees_everything_at_once(request: pytest.FixtureRequest, folders, traced,
                                                       monkeypatch: pytest.MonkeyPatch, family: str) -> None:
    """With Python's cycle collector off, the tensor bytes alive after a cancelled (or failed) compiled
    generation on the CUDA-graph path (its graphs as `PlainGraphs`) are those alive before it, whether it
    made its own calls or took the last image's over; a finished one keeps only its calls for the next image
    (`KeptGraphs.keep`), which `forget` (ComfyUI's unload) frees."""
    monkeypatch.setattr(cuda_graphs, "graphs_available", lambda device: True)
    monkeypatch.setattr(cuda_graphs, "GraphedSteps", PlainGraphs)
    folder = folders["c2i"] if family == "demo" else request.getfixturevalue("tiny_janus_dir")
    model = load_model(folder, device="cpu", compile=True)
    batch = 8 if family == "demo" else 2
    cond = model.encode("4" if family == "demo" else "a red cat")
    config = SamplerConfig(window=8, seed=1, cfg_scale=3.0)
    generate(model, cond, config, batch_size=batch)  # dynamo's and the families' one-time state
    model.graph_holder.forget()

    def cancel_after(calls: int):
        count = itertools.count()
        return lambda: next(count) >= calls

    def fail_after(calls: int):
        count = itertools.count()

        def callback(stats) -> None:
            if next(count) >= calls:
                raise Stop("from the callback")
        return callback

    gc.collect()
    gc.disable()
    try:
        nothing_kept = tensor_bytes()
        with pytest.raises(GenerationCancelled):  # with calls of its own
            generate(model, cond, config, batch_size=batch, should_cancel=cancel_after(3))
        assert tensor_bytes() == nothing_kept
        generate(model, cond, config, batch_size=batch)
        assert model.graph_holder.kept is not None and tensor_bytes() > nothing_kept
        with pytest.raises(GenerationCancelled):  # with the last image's calls taken over
            generate(model, cond, config, batch_size=batch, should_cancel=cancel_after(3))
        assert model.graph_holder.kept is None and tensor_bytes() == nothing_kept
        generate(model, cond, config, batch_size=batch)
        with pytest.raises(Stop):
            generate(model, cond, config, batch_size=batch, callback=fail_after(2))
        assert model.graph_holder.kept is None and tensor_bytes() == nothing_kept
        generate(model, cond, config, batch_size=batch)
        model.graph_holder.forget()
        assert tensor_bytes() == nothing_kept
    finally:
        gc.enable()


def test_graphs_are_not_kept_under_the_async_allocator(folders, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torch's cudaMallocAsync allocator (as ComfyUI sets it on NVIDIA) each image captures graphs of its
    own, with one warning that says so; under the native one they are kept.  The backend is asked of torch,
    which reports none without CUDA."""
    assert cuda_graphs.allocator_backend() == (torch.cuda.get_allocator_backend() if torch.cuda.is_available()
                                               else None)
    monkeypatch.setattr(PlainGraphs, "made", 0)
    monkeypatch.setattr(cuda_graphs, "graphs_available", lambda device: True)
    monkeypatch.setattr(cuda_graphs, "GraphedSteps", PlainGraphs)
    monkeypatch.setattr(compiled_regions, "SAMPLING_STEP", compiled_regions._decide)
    monkeypatch.setattr(compiled_regions, "_WARNED", set())
    eager, compiled = pair(folders["c2i"])
    monkeypatch.setattr(compiled, "compiled_layer", compiled.layer_step)
    cond = eager.encode("7")
    monkeypatch.setattr(cuda_graphs, "allocator_backend", lambda: "cudaMallocAsync")
    with pytest.warns(RuntimeWarning, match="CUDA graphs are not kept between images under torch's "
                                            "cudaMallocAsync allocator .*: each image captures its own") as caught:
        for seed in (1, 2, 3):
            assert_same_run(eager, compiled, cond, SamplerConfig(window=8, seed=seed))
            assert compiled.graph_holder.kept is None
    assert len(caught) == 1 and PlainGraphs.made == 3
    monkeypatch.setattr(cuda_graphs, "allocator_backend", lambda: "native")
    for seed in (4, 5):
        assert_same_run(eager, compiled, cond, SamplerConfig(window=8, seed=seed))
        assert compiled.graph_holder.kept is not None
    assert PlainGraphs.made == 4
