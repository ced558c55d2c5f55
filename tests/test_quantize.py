"""Quantised weights keep the sampler exact: every position's logits depend on its own prefix only.

Checked for every precision offered (int8, nf4) on single layers and on the tiny Janus and Emu3.5 checkpoints:
a position's logits do not change when the drafts after it change, when another sample's drafts change,
or when the CFG partner row changes.  bitsandbytes' LLM.int8 at its default outlier threshold (6.0) is the
negative control the same checks must catch.  Then the sampler on quantised models: faithful at window 8
gives the window-1 tokens, and the output law of a quantised LlamaGen GPT equals its AR law (chi-square).
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cosmos_fixture import context_frames, write_cosmos
from emu3_fixture import tiny_emu3_dir  # noqa: F401  (fixture)
from emu3p5_fixture import tiny_emu3p5_dir  # noqa: F401  (fixture)
from llamagen_fixture import write_original_c2i, write_t2i, write_tiny_t5
from lumina_fixture import tiny_lumina2_dir, tiny_lumina_dir  # noqa: F401  (fixtures)
from scd_core import SamplerConfig, generate, load_model
from scd_core.models.families import cosmos, llamagen
from scd_core.models.weights import quantize
from scd_core.models.loading import estimate_memory
from scd_core.models.weights.memory import t5_folder_estimate
from scd_core.models.families.llamagen import GPT, ClassLabel, GPTConfig, LlamaGenSession
from scd_core.models.text.t5_encoder import load_t5_encoder
from scd_core.decoding.sampling import Sampling, to_probs
from test_lossless import chi_square_pvalue

# bitsandbytes is optional for the library and installed by tests/requirements.txt; without it only the int8
# checks run (the library's own layer needs nothing)
needs_bnb = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None,
                               reason="bitsandbytes (tests/requirements.txt) is not installed")
PRECISIONS = ["int8", pytest.param("nf4", marks=needs_bnb)]
PROMPT, SAME_LENGTH_NEGATIVE = "a red cat", "a big dog"


def small_init_linear(in_features: int, out_features: int, seed: int, bias: bool = True) -> nn.Linear:
    """Weights of std 0.02, as real checkpoints are initialised (sharpened fixtures exaggerate the error)."""
    torch.manual_seed(seed)
    layer = nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        layer.weight.normal_(0.0, 0.02)
        if bias:
            layer.bias.normal_(0.0, 0.02)
    return layer.eval().requires_grad_(False)


def quantized(layer: nn.Linear, precision: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    holder = nn.Sequential(layer)
    quantize.quantize_linears(holder, precision, dtype)
    return holder[0]


def llm_int8(layer: nn.Linear, threshold: float = 6.0) -> nn.Module:
    """bitsandbytes' LLM.int8 layer at its default outlier threshold: the negative control."""
    import bitsandbytes as bnb

    q = bnb.nn.Linear8bitLt(layer.in_features, layer.out_features, bias=layer.bias is not None,
                            has_fp16_weights=False, threshold=threshold)
    q.load_state_dict(layer.state_dict())
    return q.to("cpu").eval()  # eval: in training mode bitsandbytes' CPU path dequantises instead


def other_rows_changed(layer: nn.Module, dtype: torch.dtype = torch.float32, rows: int = 6, seed: int = 0) -> float:
    """Largest change of row 0's output when rows 1.. change (to activations with a few outliers)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, layer.in_features, generator=gen)
    changed = x.clone()
    changed[1:] = torch.randn(rows - 1, layer.in_features, generator=gen)
    changed[1:, :3] *= 12  # real LLM activations have outlier channels
    with torch.no_grad():
        return float((layer(changed.to(dtype))[0] - layer(x.to(dtype))[0]).abs().max())


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantized_layer_rows_are_independent(precision: str, dtype: torch.dtype) -> None:
    assert other_rows_changed(quantized(small_init_linear(128, 96, seed=1), precision, dtype), dtype) == 0.0


@needs_bnb
def test_llm_int8_at_its_default_threshold_mixes_rows() -> None:
    """The check above catches a kernel that chooses outlier columns over all rows of a call."""
    assert other_rows_changed(llm_int8(small_init_linear(128, 96, seed=1))) > 1e-4
    assert other_rows_changed(llm_int8(small_init_linear(128, 96, seed=1), threshold=0.0)) == 0.0


@pytest.mark.parametrize("precision,bound", [("int8", 0.01), pytest.param("nf4", 0.15, marks=needs_bnb)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantization_error_on_small_init_weights(precision: str, bound: float, dtype: torch.dtype) -> None:
    """Relative output error of one layer against float32: int8 under 1 %, NF4 under 15 % (4 bits)."""
    layer = small_init_linear(512, 256, seed=2)
    x = torch.randn(32, 512, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        exact = layer(x)
        approx = quantized(copy.deepcopy(layer).to(dtype), precision, dtype)(x.to(dtype)).float()
    error = float((approx - exact).norm() / exact.norm())
    assert 0 < error < bound


def test_int8_layer_in_bfloat16_on_the_cpu_runs_torchs_fused_kernel_row_by_row() -> None:
    """The fused kernel (`_weight_int8pack_mm`) computes each output element as one dot product: a row's output is
    the same bits at any number of rows (any window width, any batch), and it is the cast path's value up to
    bfloat16 rounding."""
    q = quantized(small_init_linear(64, 48, seed=5), "int8", torch.bfloat16)
    x = torch.randn(2, 40, 64, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    with torch.no_grad():
        assert q._fused(x) is not None
        out = q(x)
        for width in (1, 2, 3, 5, 16, 17, 40):
            assert torch.equal(q(x[:, :width]), out[:, :width])
        assert all(torch.equal(q(x[b, i:i + 1]), out[b, i:i + 1]) for b in range(2) for i in range(40))
        exact = x.double() @ q.dequantized(torch.float64).T + q.bias.double()
    assert float((out.double() - exact).abs().max() / exact.abs().max()) < 1e-2


def test_int8_layer_keeps_off_the_fused_kernel_where_it_would_read_out_of_bounds() -> None:
    """K not a multiple of 16 crashes the kernel (a segfault, at two rows or more): the cast runs instead.  A
    contiguous view at an odd offset is copied to an aligned row first, with the same result."""
    odd = quantized(small_init_linear(40, 24, seed=7), "int8", torch.bfloat16)
    x = torch.randn(5, 40).to(torch.bfloat16)
    with torch.no_grad():
        assert odd._fused(x) is None
        assert torch.equal(odd(x), F.linear(x, odd.qweight.to(x.dtype)) * odd.scale + odd.bias)
        q = quantized(small_init_linear(64, 48, seed=5), "int8", torch.bfloat16)
        flat = torch.randn(5 * 64 + 3).to(torch.bfloat16)
        shifted = flat[3:].view(5, 64)  # contiguous, 6 bytes past an aligned address
        assert shifted.data_ptr() % quantize.FUSED_ALIGNMENT and q._fused(shifted) is not None
        assert torch.equal(q(shifted), q(shifted.clone()))
    for dtype in (torch.float32, torch.float16):  # the kernel's scalar loop: slower than the cast
        assert not quantize.fused_int8_runs(torch.device("cpu"), dtype, 64)
    assert not quantize.fused_int8_runs(torch.device("cuda"), torch.bfloat16, 64)  # unmeasured there


def test_int8_layer_stores_int8_rows_and_one_scale_per_row() -> None:
    layer = small_init_linear(64, 32, seed=4)
    q = quantized(layer, "int8", torch.bfloat16)
    assert q.qweight.dtype == torch.int8 and q.qweight.shape == (32, 64) and q.scale.shape == (32,)
    assert int(q.qweight.abs().amax(dim=1).min()) == 127  # each row's largest weight uses the full range
    assert quantize.module_bytes(q) == 32 * 64 + 2 * 32 + 2 * 32  # int8 weights, bf16 scales and bias


# ---- the tiny Janus checkpoint: logits at a position depend on its own prefix only ----

def janus_at(folder: Path, precision: str, dtype: str = "float32") -> object:
    """The tiny Janus in `dtype` with its backbone at `precision` ("llm.int8": bitsandbytes' outlier kernel)."""
    if precision != "llm.int8":
        return load_model(folder, device="cpu", dtype=dtype, quantize=precision)
    model = load_model(folder, device="cpu", dtype="float32")
    backbone = model.module.model.language_model
    for parent in list(backbone.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, llm_int8(child))
    return model


def window_logits(model, drafts: torch.Tensor, cond) -> tuple[torch.Tensor, torch.Tensor]:
    session = model.start(cond, batch_size=drafts.shape[0])
    session.prefill()
    return session.forward(drafts)


def largest_leaks(model, cond, partnered) -> dict[str, float]:
    """How much the logits of the first 3 positions of sample 0 move when something they must not see changes;
    `partnered` is `cond` with another CFG partner row of the cond row's length (no padding moves)."""
    gen = torch.Generator().manual_seed(0)
    drafts = torch.randint(0, model.vocab_size, (2, 8), generator=gen)
    first_cond, first_uncond = window_logits(model, drafts, cond)
    later = drafts.clone()
    later[:, 3:] = torch.randint(0, model.vocab_size, (2, 5), generator=gen)
    other_sample = drafts.clone()
    other_sample[1] = torch.randint(0, model.vocab_size, (8,), generator=gen)
    leaks = {}
    for name, (c, u) in (("later drafts", window_logits(model, later, cond)),
                         ("other sample", window_logits(model, other_sample, cond))):
        leaks[name] = max(float((c[0, :3] - first_cond[0, :3]).abs().max()),
                          float((u[0, :3] - first_uncond[0, :3]).abs().max()))
    c, _ = window_logits(model, drafts, partnered)
    leaks["CFG partner"] = float((c - first_cond).abs().max())
    return leaks


def janus_leaks(model) -> dict[str, float]:
    assert len(model.encode(PROMPT, SAME_LENGTH_NEGATIVE).uncond) == len(model.encode(PROMPT).cond)
    return largest_leaks(model, model.encode(PROMPT), model.encode(PROMPT, SAME_LENGTH_NEGATIVE))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])  # bfloat16 on the CPU: int8 through the fused kernel
@pytest.mark.parametrize("precision", ["none"] + PRECISIONS)
def test_janus_logits_depend_on_their_own_prefix_only(tiny_janus_dir: Path, precision: str, dtype: str) -> None:
    model = janus_at(tiny_janus_dir, precision, dtype)
    fused = [layer for layer in model.module.modules() if isinstance(layer, quantize.Int8Linear)
             and quantize.fused_int8_runs(torch.device("cpu"), getattr(torch, dtype), layer.in_features)]
    assert bool(fused) == (precision == "int8" and dtype == "bfloat16")
    assert janus_leaks(model) == {"later drafts": 0.0, "other sample": 0.0, "CFG partner": 0.0}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("precision", ["none"] + PRECISIONS)
def test_emu3p5_logits_depend_on_their_own_prefix_only(tiny_emu3p5_dir: Path, precision: str, dtype: str) -> None:
    """Emu3.5 has no negative prompt: the partner row is swapped for another prompt's cond row of equal length."""
    model = load_model(tiny_emu3p5_dir, device="cpu", dtype=dtype, quantize=precision)
    model.set_image_size(64, 64)  # 4 x 4 codes: the 8 drafts lie inside the image
    cond = model.encode(PROMPT)
    partner = model.encode(SAME_LENGTH_NEGATIVE).cond
    assert len(partner) == len(cond.cond) and partner != cond.cond
    assert largest_leaks(model, cond, replace(cond, uncond=partner)) == {
        "later drafts": 0.0, "other sample": 0.0, "CFG partner": 0.0}


@needs_bnb
def test_llm_int8_leaks_into_the_janus_logits(tiny_janus_dir: Path) -> None:
    """The negative control on the same model: at least the batch-wide outlier columns show."""
    leaks = janus_leaks(janus_at(tiny_janus_dir, "llm.int8"))
    assert max(leaks.values()) > 1e-4, leaks


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("folder", ["tiny_janus_dir", "tiny_emu3p5_dir"])
def test_faithful_window_8_gives_the_window_1_tokens(request: pytest.FixtureRequest, folder: str,
                                                     precision: str) -> None:
    model = load_model(request.getfixturevalue(folder), device="cpu", dtype="float32", quantize=precision)
    if model.family == "emu3p5":
        model.set_image_size(64, 48)  # 3 x 4 codes, two row ends and the image end forced
    cond = model.encode(PROMPT)
    tokens = [generate(model, cond, SamplerConfig(coupler="faithful", window=w, seed=3), batch_size=2).tokens
              for w in (1, 8)]
    assert torch.equal(tokens[0], tokens[1])


# ---- the output law of a quantised network equals its AR law ----

class QuantizedGPT:
    """A LlamaGen GPT of 3 codes on a 2 x 2 grid (81 images), its blocks quantised: small enough to enumerate."""

    def __init__(self, precision: str, seed: int = 1, std: float = 0.2) -> None:
        cfg = GPTConfig(dim=16, n_layer=1, n_head=2, n_kv_head=2, ffn_hidden=32, vocab_size=3, grid_size=2,
                        num_classes=2)
        torch.manual_seed(seed)
        self.gpt = GPT(cfg).eval().requires_grad_(False)
        with torch.no_grad():  # peaked distributions, so that a biased sampler shows
            for name, p in self.gpt.named_parameters():
                p.normal_(1.0 if name.endswith("norm.weight") else 0.0, 1.0 if p.dim() == 1 else std)
        assert quantize.quantize_linears(self.gpt.layers, precision, torch.float32) == 5
        self.vocab_size, self.num_tokens, self.grid = cfg.vocab_size, cfg.num_tokens, (2, 2)

    def start(self, cond, batch_size: int) -> LlamaGenSession:
        return LlamaGenSession(self.gpt, ClassLabel(1), batch_size)

    def exact_law(self, cfg_scale: float) -> dict[tuple[int, ...], float]:
        seqs = torch.tensor(list(itertools.product(range(self.vocab_size), repeat=self.num_tokens)))
        session = self.start(None, len(seqs))
        first = session.prefill()
        rest = session.forward(seqs[:, :-1])
        cond, uncond = (torch.cat(pair, dim=1) for pair in zip(first, rest))
        probs = to_probs(cond, uncond, Sampling(cfg_scale=cfg_scale)).double()
        per_sequence = probs.gather(-1, seqs.unsqueeze(-1)).squeeze(-1).prod(-1)
        return {tuple(s): float(p) for s, p in zip(seqs.tolist(), per_sequence)}


@pytest.mark.parametrize("precision,coupler", [("int8", "maximal"), pytest.param("nf4", "gumbel", marks=needs_bnb)])
def test_output_law_of_a_quantized_network_equals_its_ar_law(precision: str, coupler: str) -> None:
    model = QuantizedGPT(precision)
    law = model.exact_law(cfg_scale=2.0)
    result = generate(model, None, SamplerConfig(coupler=coupler, window=3, cfg_scale=2.0, seed=11),
                      batch_size=60_000)
    assert 3 in result.windows  # speculative calls ran
    assert chi_square_pvalue(result.tokens, law) > 1e-4


# ---- bad input ----

def test_unknown_precision_is_refused_before_loading(tiny_janus_dir: Path) -> None:
    with pytest.raises(ValueError, match="quantize must be one of none, int8, nf4"):
        load_model(tiny_janus_dir, device="cpu", quantize="int4")


@needs_bnb
def test_nf4_refuses_what_bitsandbytes_cannot_run(tiny_janus_dir: Path) -> None:
    with pytest.raises(ValueError, match="computes in float32, bfloat16 or float16"):
        load_model(tiny_janus_dir, device="cpu", dtype=torch.float64, quantize="nf4")
    with pytest.raises(ValueError, match="does not run on mps; use 'int8' there"):
        quantize.check_precision("nf4", torch.device("mps"), torch.float16)
    quantize.check_precision("int8", torch.device("mps"), torch.float16)  # our own layer runs anywhere


def test_nf4_without_bitsandbytes_names_the_package(tiny_janus_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import fails as if it were not installed
    with pytest.raises(ValueError, match="pip install bitsandbytes"):
        load_model(tiny_janus_dir, device="cpu", quantize="nf4")
    assert isinstance(load_model(tiny_janus_dir, device="cpu", quantize="int8").module, nn.Module)


def test_a_failed_quantisation_leaves_nothing_loaded(tiny_janus_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_janus import live_janus_modules

    def out_of_memory(linear: nn.Linear, dtype: torch.dtype) -> nn.Module:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    before = live_janus_modules()
    monkeypatch.setattr(quantize.Int8Linear, "from_linear", out_of_memory)
    with pytest.raises(ValueError, match=r"could not quantise model\.language_model\.layers\.0\.\S+ to int8 "
                                         r"\(RuntimeError: CUDA out of memory"):
        load_model(tiny_janus_dir, device="cpu", quantize="int8")
    assert live_janus_modules() == before


def test_janus_read_tensor_by_tensor_holds_what_from_pretrained_loads(tiny_janus_dir: Path) -> None:
    """Every parameter and buffer the streamed loader keeps equals transformers' own from_pretrained load."""
    from transformers import JanusForConditionalGeneration

    from scd_core.models.weights.hf_folders import dtype_keyword

    ours = load_model(tiny_janus_dir, device="cpu", dtype="float32").module
    reference = JanusForConditionalGeneration.from_pretrained(str(tiny_janus_dir),
                                                              **{dtype_keyword(): torch.float32}).eval()
    theirs = dict(reference.named_parameters()) | dict(reference.named_buffers())
    kept = dict(ours.named_parameters()) | dict(ours.named_buffers())
    assert len(kept) > 100 and set(kept) <= set(theirs)
    assert all(torch.equal(tensor, theirs[name]) for name, tensor in kept.items())


def test_generation_only_janus_drops_what_understanding_uses(tiny_janus_dir: Path) -> None:
    net = load_model(tiny_janus_dir, device="cpu", dtype="float32").module
    for name in ("vision_model", "aligner"):
        assert not hasattr(net.model, name)
    assert not hasattr(net, "lm_head")
    assert not hasattr(net.model.vqmodel, "encoder") and not hasattr(net.model.vqmodel, "quant_conv")


# ---- every family's tiny real-format checkpoint at every precision ----

BACKBONES = {  # where each family's quantised linear layers live
    "janus": lambda m: m.module.model.language_model, "emu3": lambda m: m.module.model.text_model,
    "lumina-mgpt": lambda m: m.module["lm"].model, "lumina-mgpt-2": lambda m: m.module["lm"].model,
    "llamagen": lambda m: m.module["gpt"].layers, "cosmos": lambda m: m.module["transformer"].layers,
    "emu3p5": lambda m: m.module.model.layers,
}


@pytest.fixture(scope="module")
def family_folders(tmp_path_factory: pytest.TempPathFactory, tiny_janus_dir: Path, tiny_emu3_dir: Path,
                   tiny_lumina_dir: Path, tiny_lumina2_dir: Path, tiny_emu3p5_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("quantized_families")
    return {"janus": tiny_janus_dir, "emu3": tiny_emu3_dir, "lumina-mgpt": tiny_lumina_dir,
            "lumina-mgpt-2": tiny_lumina2_dir, "llamagen": write_original_c2i(root / "llamagen"),
            "cosmos": write_cosmos(root, "4B"), "emu3p5": tiny_emu3p5_dir}


def family_cond(model):
    if model.family == "cosmos":
        return model.encode_video(context_frames(9))
    if model.family == "emu3":
        model.set_resolution("4:3", 768)  # 3 x 4 codes: keeps the run short
    if model.family == "emu3p5":
        model.set_image_size(64, 48)  # 3 x 4 codes
    return model.encode("3" if model.family == "llamagen" else PROMPT)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("family", list(BACKBONES))
def test_every_family_loads_generates_and_decodes_at_each_precision(family_folders: dict[str, Path], family: str,
                                                                    precision: str) -> None:
    full = load_model(family_folders[family], device="cpu", dtype="float32")
    model = load_model(family_folders[family], device="cpu", dtype="float32", quantize=precision)
    assert model.family == full.family == family
    linears = [m for m in BACKBONES[family](full).modules() if type(m) is nn.Linear]
    layers = [type(m).__name__ for m in BACKBONES[family](model).modules()]
    assert "Linear" not in layers and layers.count("Int8Linear" if precision == "int8" else "Linear4bit") == len(linears)
    real = quantize.module_bytes(model.module)
    assert real < quantize.module_bytes(full.module)
    # the loader node's estimate, from the weight files' headers: close where the folder holds only what is
    # loaded (heads are counted whole), larger where it holds more (Lumina-mGPT 2's MoVQGAN carries its encoder)
    estimate = estimate_memory(family_folders[family]).weight_bytes(precision, torch.float32) / real
    assert (0.97 < estimate < 1.1 if family in ("janus", "emu3", "lumina-mgpt") else 0.7 < estimate < 2.0), estimate
    cond = family_cond(model)
    result = generate(model, cond, SamplerConfig(coupler="maximal", window=4, seed=2))
    assert result.tokens.shape == (1, model.num_tokens)
    pixels = model.decode(result.tokens)
    assert pixels.dtype == torch.float32 and torch.isfinite(pixels).all() and 0 <= pixels.min() <= pixels.max() <= 1


# ---- the T5 text encoders (LlamaGen text-to-image, Cosmos Video2World) at the model's precision ----

T5_IDS = torch.tensor([[3, 4, 5, 6, 7, 8, 1]])  # "a red cat on the mat" </s>


def t5_features(encoder: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return encoder(input_ids=T5_IDS).last_hidden_state.float()


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_t5_read_tensor_by_tensor_holds_what_from_pretrained_loads(tmp_path: Path, full: bool,
                                                                    dtype: torch.dtype) -> None:
    """At the compute dtype, no float32 copy first: every tensor equals transformers' own load at that dtype, `wo`
    float32 in float16 as there; a whole T5 checkpoint (decoder, LM head) gives just its encoder."""
    from transformers import T5EncoderModel

    from scd_core.models.weights.hf_folders import dtype_keyword

    folder = write_tiny_t5(tmp_path / "t5", caption_dim=16, full=full)
    ours = load_t5_encoder(folder, dtype, "none", "google/flan-t5-xl")
    reference = T5EncoderModel.from_pretrained(str(folder), **{dtype_keyword(): dtype}).eval()
    kept, theirs = ours.state_dict(), reference.state_dict()
    assert set(kept) == set(theirs)
    assert all(kept[name].dtype == theirs[name].dtype and torch.equal(kept[name], theirs[name]) for name in kept)
    wo = {str(p.dtype) for name, p in ours.named_parameters() if ".wo." in name}
    assert wo == {"torch.float32" if dtype == torch.float16 else str(dtype)}
    assert torch.allclose(t5_features(ours), t5_features(reference), atol=1e-5)


@pytest.mark.parametrize("precision,bound", [("int8", 0.02), pytest.param("nf4", 0.25, marks=needs_bnb)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantized_t5_features_stay_close_to_full_precision(tmp_path: Path, precision: str, bound: float,
                                                            dtype: torch.dtype) -> None:
    """Relative error of the features against float32 on small-init weights: int8 under 2 %, NF4 under 25 %.
    (Before T5's `wo` saw no cast, NF4 features were off by 100 %: T5 cast the activations to the packed uint8.)"""
    folder = write_tiny_t5(tmp_path / "t5", caption_dim=64, d_ff=256, num_layers=2, weight_std=0.02, full=True)
    exact = t5_features(load_t5_encoder(folder, torch.float32, "none", "google/flan-t5-xl"))
    encoder = load_t5_encoder(folder, dtype, precision, "google/flan-t5-xl")
    quantised = {type(m).__name__ for name, m in encoder.named_modules() if name.endswith((".q", ".wi", ".wo.layer"))}
    assert quantised == {"Int8Linear" if precision == "int8" else "Linear4bit"}
    kept_wo = [m for name, m in encoder.named_modules() if name.endswith(".wo") and type(m) is nn.Linear]
    assert len(kept_wo) == (2 if dtype == torch.float16 else 0)  # float32, unquantised, in float16 only
    error = float((t5_features(encoder) - exact).norm() / exact.norm())
    assert 0 < error < bound


def text_models(root: Path) -> dict[str, tuple[Path, Path]]:
    """Each text-conditional fixture: (model folder, the T5 folder inside it)."""
    t2i, video2world = write_t2i(root / "t2i", with_t5=True), write_cosmos(root, "5B-Video2World", seed=2)
    return {"llamagen t2i": (t2i, t2i / "t5-ckpt" / "flan-t5-xl"),
            "cosmos video2world": (video2world, video2world / "t5")}


@pytest.mark.parametrize("precision", PRECISIONS)
def test_text_conditional_models_load_their_t5_at_the_models_precision(tmp_path: Path, precision: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """LlamaGen t2i and Cosmos Video2World: the T5 encoder's linear layers at the precision, its embeddings at the
    compute dtype, counted by the memory estimate; the model generates from a prompt and decodes."""
    dtype = torch.float32  # the tiny Cosmos tokenizer's pooling has no bfloat16 CPU kernel
    for kind, (folder, t5_folder) in text_models(tmp_path).items():
        in_bf16 = load_model(folder, device="cpu", dtype=torch.bfloat16, quantize=precision).module["t5"].encoder
        floats = {t.dtype for t in [*in_bf16.parameters(), *in_bf16.buffers()] if t.is_floating_point()}
        assert floats == {torch.bfloat16}  # no float32 copy is kept
        full = load_model(folder, device="cpu", dtype=dtype)
        model = load_model(folder, device="cpu", dtype=dtype, quantize=precision)
        t5 = model.module["t5"].encoder
        linears = [m for m in full.module["t5"].encoder.modules() if type(m) is nn.Linear]
        layers = [type(m).__name__ for m in t5.modules()]
        quantised = layers.count("Int8Linear" if precision == "int8" else "Linear4bit")
        assert "Linear" not in layers and quantised == len(linears)
        real = quantize.module_bytes(model.module)
        assert real < quantize.module_bytes(full.module)
        # the loader node's estimate counts the T5 encoder (how closely: test_the_memory_estimate_counts_the_t5_encoder)
        with_t5 = estimate_memory(folder)
        with monkeypatch.context() as patch:  # the loader's own estimate, as if the folder had no T5
            patch.setattr(llamagen if kind == "llamagen t2i" else cosmos, "text_encoder_folder", lambda folder: None)
            without_t5 = estimate_memory(folder)
        added = with_t5.weight_bytes(precision, dtype) - without_t5.weight_bytes(precision, dtype)
        t5_alone = t5_folder_estimate(t5_folder).weight_bytes(precision, dtype)
        assert added == t5_alone > 0, kind
        if kind == "llamagen t2i":
            cond = model.encode("a red cat")
        else:
            cond = model.encode_video(context_frames(9), "a red cat")
        result = generate(model, cond, SamplerConfig(coupler="maximal", window=4, seed=2))
        assert result.tokens.shape == (1, model.num_tokens)
        pixels = model.decode(result.tokens)
        assert torch.isfinite(pixels).all() and 0 <= pixels.min() <= pixels.max() <= 1


def test_the_memory_estimate_counts_the_t5_encoder(tmp_path: Path) -> None:
    """Exactly what load_t5_encoder keeps: a whole T5 checkpoint's decoder and LM head are not counted, and in
    float16 the `wo` layers count as float32."""
    folder = write_tiny_t5(tmp_path / "t5", caption_dim=64, d_ff=256, num_layers=2, full=True)
    estimate = t5_folder_estimate(folder)
    assert estimate.kv_channels == 0
    # full precision exactly; int8 under by its per-row scales (rows of 64 here); NF4 under by bitsandbytes'
    # 1 KiB code table per layer, a large share of layers this small and nothing at T5-XL / 11B sizes
    bounds = {"none": (1.0, 1.0), "int8": (0.95, 1.0), "nf4": (0.7, 1.0)}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for precision in ["none", "int8"] + (["nf4"] if importlib.util.find_spec("bitsandbytes") else []):
            real = quantize.module_bytes(load_t5_encoder(folder, dtype, precision, "google/flan-t5-xl"))
            low, high = bounds[precision]
            assert low <= estimate.weight_bytes(precision, dtype) / real <= high, (dtype, precision)
