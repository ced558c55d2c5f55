"""compile=True (scd_core.static_step): the eager tokens, no graph break, one compilation per width bucket,
fixed tensor addresses, clear refusals.

Most tests trace with dynamo's "eager" backend: the same graphs, traced with `fullgraph=True` and the same
guards, without inductor's code generation (minutes per graph on a shared CPU); `test_inductor_*` runs the
real inductor on the smallest model at windows 1 and 8.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from emu3_fixture import tiny_emu3_dir  # noqa: F401  (fixture)
from llamagen_fixture import write_safetensors_c2i, write_t2i
from lumina_fixture import tiny_lumina_dir  # noqa: F401  (fixture)
from scd_core import ModelLoadError, SamplerConfig, generate, generate_many, load_model, static_step
from scd_core.auto_window import candidate_widths

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
    monkeypatch.setattr(static_step, "BACKEND", "eager")
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


@pytest.mark.parametrize("family", ["janus", "emu3"])
def test_transformers_families_match_eager(request: pytest.FixtureRequest, traced, family: str) -> None:
    """Janus-Pro and Emu3 run their layers through the row attention (one compiled graph for all layers);
    left-padded CFG prefixes of two lengths, forced row-end tokens (Emu3)."""
    eager, compiled = pair(request.getfixturevalue(f"tiny_{family}_dir"))
    if family == "emu3":
        eager.set_image_size(32, 24)  # 4 x 3 codes of 8 px, a row-end token after each row
    cond = eager.encode("a red cat", "blue")
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
    assert not compiled.compiled_layer.failed and not static_step.SAMPLING_STEP.failed


def test_whole_step_traces_as_one_graph(folders, traced, monkeypatch: pytest.MonkeyPatch) -> None:
    """What one CUDA graph holds -- forward, distributions, verification, coupling -- traces as one graph with
    fullgraph=True at every width, so nothing in it reads a value back to the host; run through the engine's
    graph path (the decisions come back with the forward), it gives the eager tokens."""
    widths_traced: list[int] = []

    def traced_graphs(self, session, decoder, weights):
        original_init(self, session, decoder, weights)
        whole = torch.compile(self._step, fullgraph=True, dynamic=False, backend="eager")

        def replay(width: int):
            widths_traced.append(width)
            return whole(width)
        self.graphs = replay

    original_init = static_step.StaticCalls.__init__
    monkeypatch.setattr(static_step.StaticCalls, "__init__", traced_graphs)
    # the regions themselves run inside the one traced step
    monkeypatch.setattr(static_step, "SAMPLING_STEP", static_step._decide)
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
    forward = static_step.StaticCalls.forward

    def recording(self, inputs, histogram):
        out = forward(self, inputs, histogram)
        cache, decoder = self.session.cache, self.decoder
        tensors = [self.inputs[inputs.shape[1]], cache.lengths, *cache.keys, *cache.values, decoder.seq,
                   decoder.committed, decoder.proposals, decoder.keys, decoder.calls, decoder.rows]
        seen.append(tuple(t.data_ptr() for t in tensors))
        return out

    monkeypatch.setattr(static_step.StaticCalls, "forward", recording)
    compiled = load_model(folders["c2i"], device="cpu", compile=True)
    result = generate(compiled, compiled.encode("4"), SamplerConfig(window=4, seed=3), batch_size=2)
    assert len(seen) == result.nfe - 1 > 3
    assert len(set(seen)) == 1


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

    monkeypatch.setattr(static_step, "BACKEND", broken)
    monkeypatch.setattr(static_step, "_WARNED", set())
    monkeypatch.setattr(static_step.SAMPLING_STEP, "failed", False)
    eager, compiled = pair(folders["c2i"])
    cond = eager.encode("6")
    with pytest.warns(RuntimeWarning, match="torch.compile of .* failed, running it eagerly") as caught:
        assert_same_run(eager, compiled, cond, SamplerConfig(window=8, seed=6))
        assert_same_run(eager, compiled, cond, SamplerConfig(window=8, seed=7))
    messages = [str(w.message) for w in caught if "torch.compile" in str(w.message)]
    assert len(messages) == 2  # one per region (the block, the sampling step), not one per call
    assert compiled.compiled_layer.failed and static_step.SAMPLING_STEP.failed


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
    forward = static_step.StaticCalls.forward
    monkeypatch.setattr(static_step.StaticCalls, "forward",
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
