"""In bfloat16 a position's logits do not depend on the width of the call that computes it: every family's window
calls over the same cached prefix give each position the same bits at widths 1, 8 and 32
(scd_core.compiled.invariant), and so the seed decides the image at any window.  Each check compares
whole logits bit for bit.  Each check's power is shown under stand-in kernels whose rounding depends on the
call's row count on every machine (row_count_kernels.py, as CUDA's kernels do): there the same check passes with
the invariant calls and fails with them off (`SCD_INVARIANT_CALLS=off`, today's calls).  The machine's own CPU kernels cannot
show it everywhere: whether they round apart by row count depends on the instruction set."""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from emu3p5_fixture import tiny_emu3p5_dir  # noqa: F401  (fixture, one checkpoint per session)
from mammothmoda2_fixture import tiny_preview_dir  # noqa: F401  (fixture, one checkpoint per session)

from scd_core import SamplerConfig, generate, load_model
from scd_core.frontends.cli import main
from scd_core.compiled import invariant
from lumina_fixture import tiny_lumina_dir  # noqa: F401  (fixture)
from row_count_kernels import RowCountKernels

WIDTHS = (1, 8, 32)
FED = 40  # teacher-forced positions (fewer where the image is smaller)


def logits_by_width(model, cond, batch: int = 1) -> dict[int, torch.Tensor]:
    """The cond rows' logits of image positions 1..n over one random teacher-forced prefix, computed by calls of
    each width of WIDTHS back to back (the last call of a width may be narrower)."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        session = model.start(cond, batch)
        session.prefill()
        fed = min(FED, model.num_tokens - 1)
        tokens = torch.randint(0, model.vocab_size, (batch, fed), generator=generator)
        out = {}
        for width in WIDTHS:
            out[width] = torch.cat([session.forward(tokens[:, start:start + width])[0]
                                    for start in range(0, fed, width)], dim=1)
            session.rewind(fed)
    return out


def differing_widths(model, cond) -> list[int]:
    logits = logits_by_width(model, cond)
    return [width for width in WIDTHS[1:] if not torch.equal(logits[width], logits[1])]


def demo_case():
    model = load_model("demo", "cpu", "bfloat16")
    return model, model.encode("3")


def janus_case(folder: Path):
    model = load_model(folder, device="cpu", dtype="bfloat16")
    return model, model.encode("a cat")


def emu3_case(folder: Path):
    model = load_model(folder, device="cpu", dtype="bfloat16")
    model.set_resolution("1:1", 64 * 64)  # an 8 x 8 code grid, 75 positions: the test size's 18 round alike
    return model, model.encode("a cat")


def emu3p5_case(folder: Path):
    model = load_model(folder, device="cpu", dtype="bfloat16")
    model.set_image_size(128, 128)  # 8 x 8 codes, 72 positions: all 40 fed (the test size has 8, one call at 8 or 32)
    return model, model.encode("a cat")


def lumina_case(folder: Path):
    model = load_model(folder, device="cpu", dtype="bfloat16")
    return model, model.encode("a cat")


def llamagen_case(root: Path):
    from llamagen_fixture import write_original_c2i

    model = load_model(write_original_c2i(root / "llamagen"), "cpu", "bfloat16")
    return model, model.encode("3")


def cosmos_case(root: Path):
    from cosmos_fixture import context_frames, write_cosmos

    folder = write_cosmos(root, "4B")
    # the context's codes through float32 (the fixture's scripted tokenizer pools in a way CPU bfloat16 lacks)
    context = load_model(folder, "cpu", "float32").encode_video(context_frames(1))
    return load_model(folder, "cpu", "bfloat16"), context


def glm_case(folder: Path):
    from test_glm_image import loaded

    model = loaded(folder, "bfloat16")
    return model, model.encode("a red cube")


def mammothmoda2_case(folder: Path):
    model = load_model(folder, device="cpu", dtype="bfloat16")
    model.set_grid(6, 6)  # 42 positions (the row-ends forced): several calls at width 8
    return model, model.encode("a cat")


@pytest.fixture(scope="module")
def emu3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from emu3_fixture import write_tiny_emu3

    return write_tiny_emu3(tmp_path_factory.mktemp("tiny_emu3"))


@pytest.fixture(scope="module")
def glm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from glm_image_fixture import write_tiny_glm_image

    return write_tiny_glm_image(tmp_path_factory.mktemp("tiny_glm_image"))


@pytest.fixture(params=["demo", "janus", "emu3", "emu3p5", "lumina", "llamagen", "cosmos", "glm_image",
                        "mammothmoda2"])
def case(request: pytest.FixtureRequest, tmp_path: Path):
    name = request.param
    if name == "lumina":
        return lumina_case(request.getfixturevalue("tiny_lumina_dir"))
    if name == "llamagen":
        return llamagen_case(tmp_path)
    if name == "cosmos":
        return cosmos_case(tmp_path)
    if name == "demo":
        return demo_case()
    if name == "janus":
        return janus_case(request.getfixturevalue("tiny_janus_dir"))
    if name == "emu3":
        return emu3_case(request.getfixturevalue("emu3_dir"))
    if name == "emu3p5":
        return emu3p5_case(request.getfixturevalue("tiny_emu3p5_dir"))
    if name == "mammothmoda2":
        return mammothmoda2_case(request.getfixturevalue("tiny_preview_dir"))
    return glm_case(request.getfixturevalue("glm_dir"))


def test_bfloat16_logits_do_not_depend_on_the_call_width(case, monkeypatch):
    """With this machine's kernels, and under kernels whose result depends on the call's row count (CUDA's round
    apart so: the matrix products, attention and the norms' row reductions), no width differs.  Under the latter
    the same check fails with today's calls, and with only the norms left as they come (a row's `mean(-1)` on
    CUDA reduces in another order in a call of 1, 2, 4, 8 or 16+ rows)."""
    model, cond = case
    assert differing_widths(model, cond) == []
    with RowCountKernels():
        assert differing_widths(model, cond) == []
        with monkeypatch.context() as untiled_norms:
            untiled_norms.setattr(invariant, "ROW_REDUCTIONS", ())
            untiled_norms.setattr(invariant, "NORMS", ())
            assert differing_widths(model, cond) != []
        monkeypatch.setenv(invariant.POLICY_VARIABLE, "off")
        assert differing_widths(model, cond) != []


def test_the_cli_gives_a_seed_one_png_at_every_window_in_bfloat16(tmp_path, monkeypatch, capsys):
    """The issue's check: `generate --model demo --dtype bfloat16 --prompt 3 --seed S --window W` writes the same
    PNG for W in 1, 16, 32 and auto, seeds 0-3 (with the old calls 12 of 12 differed here, seed 0 among them)."""
    def png(seed: int, window: str) -> bytes:
        output = tmp_path / f"s{seed}-w{window}.png"
        assert main(["generate", "--model", "demo", "--prompt", "3", "--device", "cpu", "--dtype", "bfloat16",
                     "--seed", str(seed), "--window", window, "-o", str(output)]) == 0
        return output.read_bytes()

    for seed in range(4):
        reference = png(seed, "1")
        assert [window for window in ("16", "32", "auto") if png(seed, window) != reference] == [], seed
    with RowCountKernels():  # the check can fail: under kernels that round by row count, today's calls differ
        assert png(0, "32") == png(0, "1")
        monkeypatch.setenv(invariant.POLICY_VARIABLE, "off")
        assert png(0, "32") != png(0, "1")


def test_a_batch_row_is_its_seed_alone_in_bfloat16(case):
    """Row i of a batch of seed s at window 32 is seed s + i alone at window 1, in every family."""
    model, cond = case
    batch = generate(model, cond, SamplerConfig(window=32, seed=5), batch_size=3).tokens
    for row in range(3):
        alone = generate(model, cond, SamplerConfig(window=1, seed=5 + row)).tokens
        assert torch.equal(batch[row:row + 1], alone), row


def test_compiled_calls_give_a_seed_one_image_in_bfloat16():
    """compile=True (inductor on this CPU) in bfloat16: the static-shape calls run under the same tiles, so a
    seed's tokens at windows 8 and 32 are its window-1 tokens (compiled is a path of its own: its window 1 need
    not be eager's).  With SCD_INVARIANT_CALLS=off the same four runs differed from window 1's, all four (checked
    once by hand: a second set of compilations would double this test's three minutes)."""
    model = load_model("demo", "cpu", "bfloat16", compile=True)
    cond = model.encode("3")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a compile that fell back to eager calls fails here
        for seed in (0, 1):
            reference = generate(model, cond, SamplerConfig(window=1, seed=seed))
            for window in (8, 32):
                result = generate(model, cond, SamplerConfig(window=window, seed=seed))
                assert result.eager_fallbacks == []
                assert torch.equal(result.tokens, reference.tokens), (seed, window)


def test_tiles_give_each_row_its_own_bits_where_the_plain_kernels_do_not():
    """bfloat16 F.linear at K = 1024 (512 outputs) and attention at 128-wide heads over 1100 keys: a row's tile
    output alone equals its output among 40 / 8 rows, with this machine's kernels and with stand-ins that round
    by row count (as CUDA's do), under which the plain calls give a row other bits alone than among the others."""
    generator = torch.Generator().manual_seed(0)
    bf16 = lambda *shape: torch.randn(*shape, generator=generator).bfloat16()
    weight, x = bf16(512, 1024) / 32, bf16(40, 1024)
    one_by_one = lambda linear: torch.cat([linear(row[None], weight) for row in x])
    keys, values, queries = bf16(1, 4, 1100, 128), bf16(1, 4, 1100, 128), bf16(1, 4, 8, 128)
    mask = (torch.arange(1100) < torch.arange(700, 708)[:, None])[None, None]
    each = lambda attend: torch.cat([attend(queries[:, :, i:i + 1], keys, values, attn_mask=mask[:, :, i:i + 1])
                                     for i in range(8)], dim=2)
    for kernels in (contextlib.nullcontext(), RowCountKernels()):
        with kernels:
            assert torch.equal(invariant.tiled_linear(x, weight), one_by_one(invariant.tiled_linear))
            assert torch.equal(invariant.tiled_attention(queries, keys, values, attn_mask=mask),
                               each(invariant.tiled_attention))
    with RowCountKernels():
        assert not torch.equal(F.linear(x, weight), one_by_one(F.linear))
        assert not torch.equal(F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask),
                               each(F.scaled_dot_product_attention))


def test_a_network_whose_embed_context_gives_ids_is_refused():
    """The compute dtype that turns the fixed shapes on is read from `embed_context`'s output: ids there (as
    Cosmos's network gave before) would leave them off without a word, so the prefill refuses them."""
    from scd_core.models.sessions.row_session import RowSession

    class IdsNetwork:
        def embed_context(self, context: torch.Tensor) -> torch.Tensor:
            return context

        embed_tokens = embed_context

        def __call__(self, *args):
            raise AssertionError("the prefill must stop before the network runs")

    session = RowSession(torch.zeros(2, 3, dtype=torch.long), 4, IdsNetwork())
    with pytest.raises(TypeError, match=r"IdsNetwork\.embed_context must return embeddings \(floating point\), "
                                        r"got torch\.int64"):
        session.prefill()


class _Recorder(TorchFunctionMode):
    """Records, for each function in `watched`, the rows of the first argument of every call that reaches it,
    and the numerics switches as they were during each call."""

    def __init__(self, watched) -> None:
        super().__init__()
        self.watched, self.rows, self.switches = watched, [], set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.watched:
            self.rows.append(args[0].reshape(-1, args[0].shape[-1]).shape[0])
            self.switches.add(tuple(switch.read() for switch in invariant.PINNED))
        return func(*args, **(kwargs or {}))


def test_quantised_matmuls_run_at_the_tiles_rows(tiny_janus_dir, monkeypatch):
    """int8's fused kernel (a torch function) and bitsandbytes' 4-bit matmul (a custom op the mode cannot enter,
    which picks its kernel from the rows it is given, a separate one for 4 rows or fewer) see only tiles of
    `tile_rows` rows in every call of a bfloat16 session, at widths 1, 8 and 32; without `row_tiled` the 4-bit op
    sees each call's own rows."""
    import bitsandbytes  # noqa: F401  (registers its ops)
    from scd_core.models.weights import quantize

    rows = invariant.tile_rows(torch.device("cpu"))
    for precision, kernel in (("int8", torch._weight_int8pack_mm),
                              ("nf4", torch.ops.bitsandbytes.gemm_4bit.default)):
        model = load_model(tiny_janus_dir, device="cpu", dtype="bfloat16", quantize=precision)
        with _Recorder({kernel}) as recorder:
            logits_by_width(model, model.encode("a cat"))
        assert recorder.rows and set(recorder.rows) == {rows}, (precision, sorted(set(recorder.rows)))
    monkeypatch.setattr(quantize, "row_tiled", lambda module: module)
    model = load_model(tiny_janus_dir, device="cpu", dtype="bfloat16", quantize="nf4")
    with _Recorder({torch.ops.bitsandbytes.gemm_4bit.default}) as recorder:
        logits_by_width(model, model.encode("a cat"))
    assert set(recorder.rows) - {rows}


def test_the_numerics_switches_hold_their_defaults_inside_and_come_back_after(tiny_janus_dir):
    """Another node may flip TF32, the reduced-precision reductions, fp16 accumulation, the float32 matmul
    precision or oneDNN process-wide: inside a bfloat16 session's calls they read torch's defaults (every switch
    this device's kernels read), and after the call the user's values are back."""
    model = load_model(tiny_janus_dir, device="cpu", dtype="bfloat16")
    flipped = {switch: (not switch.default if isinstance(switch.default, bool) else "medium")
               for switch in invariant.PINNED if switch.read() == switch.default
               and (isinstance(switch.default, bool) or switch.default == "highest")}
    assert any("cpu" in switch.devices for switch in flipped)  # oneDNN and the matmul precision at least
    saved = {switch: switch.read() for switch in flipped}
    try:
        for switch, value in flipped.items():
            switch.write(value)
        with _Recorder({F.linear}) as recorder:
            logits_by_width(model, model.encode("a cat"))
        assert recorder.rows
        assert recorder.switches == {tuple(switch.default if "cpu" in switch.devices else
                                           flipped.get(switch, switch.read()) for switch in invariant.PINNED)}
        assert all(switch.read() == value for switch, value in flipped.items())
    finally:
        for switch, value in saved.items():
            switch.write(value)


def test_the_samplers_row_sums_do_not_depend_on_the_calls_rows(monkeypatch):
    """Top-p's `sum` and `cumsum` over a (rows, V) call: a position's probabilities alone (window 1, one row) are
    its probabilities among 32 rows, under a row sum that rounds by the call's rows (CUDA's does; the CPU's at
    V >= 65536 and two threads), through the run's guidance in bfloat16; they differ with the invariant calls off."""
    from scd_core.decoding.guidance import ScaleGuidance
    from scd_core.decoding.sampling import Sampling

    logits = torch.randn(1, 32, 4096, generator=torch.Generator().manual_seed(0)).bfloat16()
    guidance = ScaleGuidance(Sampling(top_p=0.9), torch.device("cpu"))
    probs = lambda rows: guidance.probs((rows, None), lambda: torch.zeros(1, rows.shape[1], dtype=torch.long))
    with RowCountKernels():
        together = probs(logits)
        assert torch.equal(torch.cat([probs(logits[:, i:i + 1]) for i in range(32)], dim=1), together)
        monkeypatch.setenv(invariant.POLICY_VARIABLE, "off")
        assert not torch.equal(torch.cat([probs(logits[:, i:i + 1]) for i in range(32)], dim=1), probs(logits))
