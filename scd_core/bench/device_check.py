"""One prepared device check: what a window costs on this accelerator, and what that makes of an image.

    python -m scd_core.bench device-check --out DIR               # one GPU, the published shapes
    python -m scd_core.bench device-check --out DIR --device cpu --tiny   # the same code path, tiny shapes

No weights are read or downloaded: each family's language model is built by transformers from a config with
the published layer sizes and random weights (one family at a time, freed before the next).  For each it
measures, with the prompt and half the image already in the KV cache and the CFG double batch:

  - cost(L) / cost(1) of one call for L = 1, 2, 4, ..., 64 as the engine makes it: the family's own session
    (`ShapeModel`: the CFG rows over the engine's RowCache, the image head), timed like the automatic window
    times them (scd_core.windows.auto_window.measure_costs);
  - the sampling and verification time per call (the engine on a synthetic grid model with the family's
    vocabulary of codes, whose own call is nearly free) and its share of a call;
  - peak memory;
  - AR time per token: this pack's call at width 1 plus sampling, against transformers' own `generate`;
  - the wall time per image predicted from those costs and the calls the engine measurably makes on a
    synthetic grid model of the family's token layout (medium entropy) at windows 16, 32, 64 and auto (the
    automatic window chooses by the family's measured costs, not the synthetic model's).

Then the compiled phase (scd_core.bench.device_compiled): the floor (weights and the static KV cache read at the
bandwidth of a large device copy), and eager vs CUDA graphs vs graphs of compiled layers per window width on the
Janus-Pro shapes, each against eager in a column of its own; its compile time is bounded by `--compile-widths`
(default COMPILE_WIDTHS) and `--compile-budget` (seconds), and it prints an estimate once one width has
compiled.  Then one whole image through `generate` with compile=True against eager on the smallest Janus-Pro shape
(equal tokens and calls, seconds; the table says when compile=True is unavailable or failed); and the precision
phase: per precision (none / int8 / nf4 where bitsandbytes runs on the device) the weight bytes, peak memory of
the calls and cost per call at widths 1 / 16 / 64 on the Janus-Pro-1B shape (and -7B on a GPU), measured by
`shapes.quantized_cost_rows` (`--shape 1B --quantize none int8 nf4`), and one int8 layer's kernels: the cast the
int8 layer makes against torch's fused int8 matmul (speed, rows kept apart), which tells whether the layer should
use the fused kernel on this device (it does on the CPU in bfloat16).  Low-VRAM streaming of weights is
ComfyUI's (its casting layers) and is not measured here; the output says so.  The whole generate's status names
what ran eagerly and why (a failed compile or CUDA graph capture: `GenerationResult.eager_fallbacks`).

It writes device_check.md (seven tables) and device_check.json to DIR.
"""

from __future__ import annotations

import importlib.util
import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from ..windows import auto_window
from ..compiled import cuda_graphs
from ..compiled.compilable import Compilable
from .device_compiled import COMPILE_BUDGET_S, COMPILE_WIDTHS, TINY_WIDTHS, compiled_phase
from .tables import markdown
from .shapes import peak_memory_mb, quantized_cost_rows
from ..decoding.config import SamplerConfig
from ..decoding.engine import generate
from ..models.loading import pick_device, pick_dtype
from ..models.sessions.cfg_session import CFGSession
from ..models.families.janus import RowBackbone
from ..models.weights.memory import release_memory
from ..models.sessions.row_attention import RowAttentionBackbone, attention_layer
from ..models.sessions.row_cache import RowCache
from .synthetic import GridModel

WIDTHS = auto_window.CANDIDATES
SCD_WINDOWS = (16, 32, 64, "auto")
# SCD with maximal coupling, as the table's columns have always been (candidates need a coupler that takes them)
SCD_RUNS = {f"SCD {w}": dict(coupler="maximal", window=w) for w in SCD_WINDOWS} | {
    "SCD 32 cand2": dict(coupler="maximal", window=32, candidates=2)}
MEDIUM_SHARPNESS = 1.5  # the synthetic grid model's medium-entropy setting (scd_core.bench)
GENERATE_TOKENS = 32    # new tokens timed in transformers' generate
COST_ROUNDS = 3


@dataclass(frozen=True)
class Shape:
    name: str
    family: str            # "llama" (Janus-Pro's language model), "chameleon" (Lumina-mGPT), "emu3"
    config: dict[str, Any]  # the transformers text-config fields that set the size
    codes: int             # image codes: the rows of the output head a call computes
    grid: tuple[int, int]  # token rows x columns (a row-end column included) of one image
    prefix: int            # prompt tokens before the image


# Published sizes: DeepSeek-LLM 1.5B / 7B under Janus-Pro, Chameleon-7B under Lumina-mGPT (768 px: 48 rows of
# 48 codes + row end), Emu3-Gen (720 px: 90 rows of 90 codes + row end).
SHAPES = (
    Shape("Janus-Pro-1B", "llama", dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=16,
                                        num_key_value_heads=16, intermediate_size=5632, vocab_size=102400),
          16384, (24, 24), 64),
    Shape("Janus-Pro-7B", "llama", dict(hidden_size=4096, num_hidden_layers=30, num_attention_heads=32,
                                        num_key_value_heads=32, intermediate_size=11008, vocab_size=102400),
          16384, (24, 24), 64),
    Shape("Lumina-mGPT-7B", "chameleon", dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                                              num_key_value_heads=32, intermediate_size=11008, vocab_size=65536),
          8192, (48, 49), 64),
    Shape("Emu3-8B", "emu3", dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                                  num_key_value_heads=8, intermediate_size=14336, vocab_size=184622),
          32768, (90, 91), 64),
)
TINY_CONFIG = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                   intermediate_size=128, vocab_size=512)
TINY_SHAPES = tuple(Shape(f"{s.name} (tiny)", s.family, TINY_CONFIG, 256, (6, 7), 8) for s in SHAPES[1:])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(shape: Shape, device: torch.device, dtype: torch.dtype, tiny: bool) -> tuple[Any, torch.nn.Module]:
    """(transformers causal LM with random weights, image head over the codes) at `shape`'s sizes."""
    import transformers

    from ..models.weights.hf_folders import dtype_keyword

    if shape.family == "llama":
        cls, config = transformers.LlamaForCausalLM, transformers.LlamaConfig(**shape.config)
    elif shape.family == "chameleon":
        # the VQ tokenizer is part of the model class; tiny shapes get a tiny one
        vq = dict(embed_dim=8, num_embeddings=32, base_channels=32, channel_multiplier=[1, 1], num_res_blocks=1,
                  resolution=32, latent_channels=8) if tiny else None
        cls = transformers.ChameleonForConditionalGeneration
        config = transformers.ChameleonConfig(**shape.config, vocabulary_map={"<image>": 8711}, vq_config=vq)
    elif shape.family == "emu3":
        cls, config = transformers.Emu3ForCausalLM, transformers.Emu3TextConfig(**shape.config, pad_token_id=0)
    else:
        raise ValueError(f"unknown family {shape.family!r}")
    hidden = shape.config["hidden_size"]
    with torch.device(device):
        model = cls._from_config(config, **{dtype_keyword(): dtype}).eval()
        if shape.family == "llama":  # Janus-Pro's generation head: an MLP from the hidden state to the codes
            head = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.GELU(),
                                       torch.nn.Linear(hidden, shape.codes))
        else:  # the rows of the LM head that belong to image codes
            head = torch.nn.Linear(hidden, shape.codes, bias=False)
    return model, head.to(dtype).eval()


class ShapeModel(Compilable):
    """A TokenModel over `build`'s random-weight model whose sessions run as the family's own do (models.janus,
    lumina, emu3): the CFG rows over the engine's RowCache, transformers' layers (Emu3: the row attention),
    and with `compile` the row attention through one compiled layer over the static cache."""

    layer_step = staticmethod(attention_layer)

    def __init__(self, shape: Shape, module: torch.nn.Module, head: torch.nn.Module,
                 num_tokens: Optional[int] = None, compile: bool = False) -> None:
        """`num_tokens`: the image positions a session has room for (default: the shape's image)."""
        self.module, self.head, self.family, self.grid = module, head, shape.family, shape.grid
        self.num_tokens = num_tokens or shape.grid[0] * shape.grid[1]
        self.vocab_size = shape.codes
        generator = torch.Generator().manual_seed(2)
        self.prompt = torch.randint(shape.config["vocab_size"], (shape.prefix,), generator=generator)
        if compile:
            self.enable_compile()

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def start(self, cond: Any, batch_size: int) -> CFGSession:
        """`cond` is unused: every row's prompt is the same random ids (what a call costs does not depend on them)."""
        prefix = self.prompt.to(self.device).repeat(2 * batch_size, 1)
        embed = self.module.get_input_embeddings()
        return CFGSession(prefix, torch.ones_like(prefix), self.num_tokens, backbone=self._backbone,
                          embed_prefix=embed, embed_image=embed, head=self.head, static_shapes=self.compiled)

    def _backbone(self, cache: RowCache) -> Any:
        """The backbone over `cache` as the family's session builds it: the row attention when compiled (and
        always for Emu3), else transformers' layers."""
        if self.compiled or self.family == "emu3":
            return RowAttentionBackbone(self.module.model, cache, self.compiled_layer)
        return RowBackbone(self.module.model, cache)


def window_costs(model: ShapeModel, context: int) -> dict[int, float]:
    """Seconds of one call per width as the engine makes it (the family's session: CFG rows over the RowCache,
    the image head), `context` tokens already cached."""
    session = model.start(None, 1)
    session.prefill()
    cached = context - session.prefix
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(model.vocab_size, (1, cached + max(WIDTHS)), generator=generator)
    session.forward(ids[:, :cached])

    def call(width: int) -> torch.Tensor:
        logits = session.forward(ids[:, cached:cached + width])[0]
        session.rewind(width)
        return logits

    return auto_window.measure_costs(call, WIDTHS, rounds=COST_ROUNDS)


def generate_ms_per_token(model: Any, shape: Shape, context: int, device: torch.device) -> float:
    """transformers' own sampling loop: ms per new token after a `context`-token prompt, two rows."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(shape.config["vocab_size"], (2, context), generator=generator).to(device)

    def seconds(new: int) -> float:
        _sync(device)
        started = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                       min_new_tokens=new, do_sample=True, pad_token_id=0)
        _sync(device)
        return time.perf_counter() - started

    seconds(2)  # warm-up
    return 1000 * (seconds(GENERATE_TOKENS + 1) - seconds(1)) / GENERATE_TOKENS


def image_runs(shape: Shape, costs: dict[int, float], device: torch.device) -> dict[str, dict[str, Any]]:
    """Calls the engine makes on a synthetic grid model of the family's layout, and the predicted seconds."""
    rows, cols = shape.grid
    runs = {}
    ar_probe = generate(GridModel(rows=4, cols=4, vocab_size=shape.codes, sharpness=MEDIUM_SHARPNESS,
                                  device=str(device)), None, SamplerConfig(window=1), sync_timing=True)
    ar_sample = ar_probe.sample_s / ar_probe.nfe
    runs["AR"] = dict(window=1, nfe=rows * cols, sample_ms=1000 * ar_sample, widths={1: rows * cols},
                      predicted_s=rows * cols * (costs[1] + ar_sample))
    for name, settings in SCD_RUNS.items():
        grid = GridModel(rows=rows, cols=cols, vocab_size=shape.codes, sharpness=MEDIUM_SHARPNESS,
                         device=str(device))
        auto_window.remember_costs(grid, 1, costs)  # the chooser sees the family's costs, not the toy's
        result = generate(grid, None, SamplerConfig(seed=0, **settings), sync_timing=True)
        # a call costs what a call of the tokens it fed costs (a tree of candidates feeds more than its width)
        model_s = sum(auto_window.cost_of_width(costs, fed) for fed in result.fed)
        widths: dict[int, int] = {}
        for w in result.windows[1:]:
            widths[w] = widths.get(w, 0) + 1
        runs[name] = dict(window=settings["window"], nfe=result.nfe, sample_ms=1000 * result.sample_s / result.nfe,
                          widths=widths, predicted_s=model_s + result.sample_s)
    return runs


def check_shape(shape: Shape, device: torch.device, dtype: torch.dtype, tiny: bool) -> dict[str, Any]:
    started = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model, head = build(shape, device, dtype, tiny)
    tokens = shape.grid[0] * shape.grid[1]
    context = shape.prefix + tokens // 2  # mid-image: the cache a typical call attends to
    with torch.no_grad():
        # room for the widest call after `context` (a tiny image is shorter than that)
        costs = window_costs(ShapeModel(shape, model, head, max(tokens, tokens // 2 + max(WIDTHS))), context)
        peak_mb = (torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda"
                   else peak_memory_mb(device))
        hf_ms = generate_ms_per_token(model, shape, context, device)
    del model, head
    release_memory()
    with torch.no_grad():
        runs = image_runs(shape, costs, device)
    parameters = _parameter_count(shape)
    return dict(name=shape.name, family=shape.family, parameters_b=parameters / 1e9, codes=shape.codes,
                tokens=tokens, context=context, costs_s=costs, ratios={w: c / costs[1] for w, c in costs.items()},
                peak_mem_mb=peak_mb, ar_ms_per_token=1000 * costs[1] + runs["AR"]["sample_ms"],
                transformers_generate_ms_per_token=hf_ms, runs=runs, seconds=time.perf_counter() - started)


def _parameter_count(shape: Shape) -> int:
    c = shape.config
    hidden, inner, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    kv = hidden * c["num_key_value_heads"] // c["num_attention_heads"]
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inner
    return layers * per_layer + 2 * c["vocab_size"] * hidden


def tables(results: list[dict[str, Any]], header: str) -> str:
    cost_rows, image_rows = [], []
    for r in results:
        cost_rows.append(dict(model=r["name"], params_b=round(r["parameters_b"], 1), context=r["context"],
                              ms_at_1=1000 * r["costs_s"][1],
                              **{f"x{w}": r["ratios"][w] for w in WIDTHS[1:]},
                              sample_ms_32=r["runs"]["SCD 32"]["sample_ms"],
                              sample_share_32=r["runs"]["SCD 32"]["sample_ms"]
                              / (r["runs"]["SCD 32"]["sample_ms"] + 1000 * r["costs_s"][32]),
                              peak_gb=r["peak_mem_mb"] / 1024))
        runs = r["runs"]
        auto = runs["SCD auto"]
        common = sorted(auto["widths"].items(), key=lambda item: -item[1])[:2]
        image_rows.append(dict(model=r["name"], tokens=r["tokens"], ar_ms_token=r["ar_ms_per_token"],
                               hf_generate_ms_token=r["transformers_generate_ms_per_token"],
                               ar_s=runs["AR"]["predicted_s"],
                               **{f"scd{w}_s": runs[f"SCD {w}"]["predicted_s"] for w in (16, 32, 64)},
                               scd32_cand2_s=runs["SCD 32 cand2"]["predicted_s"],
                               auto_s=auto["predicted_s"], auto_widths=" ".join(f"{w}x{n}" for w, n in common),
                               speedup=runs["AR"]["predicted_s"] / auto["predicted_s"]))
    return (f"{header}\n\nCost of one call by window width (ratio to width 1), sampling per call, peak memory\n\n"
            + markdown(cost_rows, list(cost_rows[0]))
            + "\n\nAR per token (this pack; transformers' generate) and predicted seconds per image "
              "(calls measured on a synthetic grid of the model's layout, medium entropy)\n\n"
            + markdown(image_rows, list(image_rows[0])))


GENERATE_WINDOW = 16  # the whole compiled generate's window: one width compiled


def whole_generate(shape: Shape, device: torch.device, dtype: torch.dtype, tiny: bool) -> dict[str, Any]:
    """One image through generate with compile=True against eager (the same seed and window): tokens, calls,
    seconds; the compiled model runs twice, as its first run compiles, and on CUDA its second replays the CUDA
    graphs the first captured (`graphs_kept`: whether it took them over, `cuda_graphs.KeptGraphs.keep`)."""
    model, head = build(shape, device, dtype, tiny)
    eager, compiled = ShapeModel(shape, model, head), ShapeModel(shape, model, head, compile=True)
    config = SamplerConfig(seed=0, coupler="maximal", window=GENERATE_WINDOW)
    holder = cuda_graphs.kept_graphs(compiled)
    with torch.no_grad():
        runs = dict(eager=generate(eager, None, config), compiled_first=generate(compiled, None, config))
        kept = holder.kept
        runs["compiled"] = generate(compiled, None, config)
    failures = runs["compiled_first"].eager_fallbacks + runs["compiled"].eager_fallbacks
    graphs = "CUDA graphs" if cuda_graphs.graphs_available(device) else f"no CUDA graphs on {device.type}"
    status = ("compile=True unavailable: this torch is older than the tested ones" if not compiled.compiled
              else f"ran eagerly: {failures[0][:100]}" if failures else f"compiled, {graphs}")
    graphs_kept = "none kept" if kept is None else "yes" if holder.kept is kept else "no"
    holder.forget()
    del model, head, eager, compiled, kept, holder
    release_memory()
    return dict(model=shape.name, window=GENERATE_WINDOW, status=status,
                same_tokens=all(torch.equal(runs["eager"].tokens, r.tokens) for r in runs.values()),
                **{f"{name}_calls": r.nfe for name, r in runs.items() if name != "compiled_first"},
                **{f"{name}_s": r.total_s for name, r in runs.items()}, graphs_kept=graphs_kept)


def generate_table(whole: dict[str, Any]) -> str:
    return ("One whole image, generate with compile=True against eager (SCD, maximal coupling, the same seed): "
            "equal tokens and calls, seconds (`compiled_first_s` includes compiling; `graphs_kept`: the second "
            "compiled run replayed the CUDA graphs the first captured)\n\n"
            + markdown([whole], list(whole)))


PRECISION_WIDTHS = (1, 16, 64)
PRECISION_COLUMNS = ("size", "quantize", "window", "weight_gb", "peak_mem_gb", "seconds", "ratio", "vs_full_w1",
                     "layers", "full_layers")


INT8_LAYER = (5632, 2048)  # (out, in) of Janus-Pro-1B's MLP up-projection; tiny: (128, 64)
INT8_ROWS = (2, 32, 128)   # a window call's rows with CFG at widths 1, 16, 64


def int8_kernel_rows(device: torch.device, dtype: torch.dtype, tiny: bool) -> list[dict[str, Any]]:
    """One int8 layer on the device: the cast the layer makes where it runs no fused kernel (`Int8Linear.cast`)
    against torch's fused weight-only int8 matmul (`_weight_int8pack_mm`), and the float matmul; whether the fused
    kernel keeps rows apart (each row alone gives the same bits) and how far it is from the cast.  What decides
    whether the layer should use the kernel on this device (`quantize.FUSED_INT8_DEVICES`)."""
    import torch.nn.functional as F

    from ..models.weights.quantize import Int8Linear, fused_int8_runs
    from .device_compiled import _median_seconds

    out_features, in_features = (128, 64) if tiny else INT8_LAYER
    generator = torch.Generator().manual_seed(3)
    linear = torch.nn.Linear(in_features, out_features, bias=False)
    torch.nn.init.normal_(linear.weight, std=0.02, generator=generator)
    layer = Int8Linear.from_linear(linear, dtype).to(device)
    weight = linear.weight.detach().to(device, dtype)
    scale = layer.scale.to(dtype)
    rows = []
    for count in INT8_ROWS:
        x = (torch.randn(count, in_features, generator=generator) * 0.5).to(device, dtype)
        cast = layer.cast(x)
        row: dict[str, Any] = dict(rows=count, layer=f"{out_features}x{in_features}",
                                   layer_uses_fused=fused_int8_runs(device, dtype, in_features),
                                   cast_ms=1000 * _median_seconds(lambda: layer.cast(x), device),
                                   float_ms=1000 * _median_seconds(lambda: F.linear(x, weight), device))
        try:
            fused = torch._weight_int8pack_mm(x, layer.qweight, scale)
            row["fused_ms"] = 1000 * _median_seconds(lambda: torch._weight_int8pack_mm(x, layer.qweight, scale),
                                                     device)
            alone = torch.cat([torch._weight_int8pack_mm(x[i:i + 1], layer.qweight, scale) for i in range(count)])
            row["fused_rows_apart"] = bool(torch.equal(alone, fused))
            row["fused_vs_cast"] = float((fused.float() - cast.float()).abs().max() / cast.float().abs().max())
        except (RuntimeError, NotImplementedError) as err:  # no kernel for this device or dtype
            row["fused_ms"] = f"not available: {' '.join(str(err).split())[:80]}"
        rows.append(row)
    return rows


def precision_phase(device: torch.device, dtype: torch.dtype, tiny: bool) -> dict[str, Any]:
    """Weights, peak memory and cost per call per precision on the Janus-Pro shapes (or a tiny one); a precision
    this device or installation cannot run is skipped with the reason."""
    from ..models.weights.quantize import PRECISIONS, QuantizationError, check_precision

    started = time.perf_counter()
    precisions, skipped = [], []
    for precision in PRECISIONS:
        try:
            check_precision(precision, device, dtype)
            precisions.append(precision)
        except QuantizationError as err:
            skipped.append(f"{precision}: {err}")
    sizes = ("tiny",) if tiny else ("1B", "7B") if device.type == "cuda" else ("1B",)
    rows = []
    for size in sizes:
        rows += quantized_cost_rows(size, precisions, PRECISION_WIDTHS, device, dtype, repeats=2 if tiny else 9)
        release_memory()
    notes = [f"skipped {line}" for line in skipped]
    notes.append("low-VRAM streaming (ComfyUI's casting layers): not measured, " +
                 ("this check runs scd_core alone" if importlib.util.find_spec("comfy") else
                  "ComfyUI is not importable here"))
    if device.type != "cuda":
        notes.append("peak_mem_gb on the CPU is the process's peak resident memory so far, not the calls' own")
    kernels = int8_kernel_rows(device, dtype, tiny)
    table = ("Per precision on the Janus-Pro shapes (random weights, backbone linear layers quantised, head at the "
             "compute dtype): weights, peak memory of the calls, seconds per call; `ratio`: against width 1 at "
             "the same precision, `vs_full_w1`: against full precision at width 1\n\n"
             + markdown(rows, PRECISION_COLUMNS) + "\n\n" + "\n".join(f"- {note}" for note in notes)
             + "\n\nint8 kernels: one int8 layer, the cast (what the layer runs without a fused kernel) against "
               "torch's fused `_weight_int8pack_mm` and the float matmul; `fused_rows_apart`: each row alone gives "
               "the same bits (needed for exactness), `fused_vs_cast`: largest difference over the largest "
               "output\n\n" + markdown(kernels, list(kernels[0])))
    return dict(rows=rows, skipped=skipped, notes=notes, int8_kernels=kernels, table=table,
                seconds=time.perf_counter() - started)


def run(out: Path, device: Optional[str] = None, dtype: Optional[str] = None, tiny: bool = False,
        compile_widths: Optional[Sequence[int]] = None, compile_budget_s: Optional[float] = None) -> str:
    """Run every shape, write device_check.md and device_check.json to `out`; returns the markdown.
    `compile_widths` (default COMPILE_WIDTHS; tiny: all its widths) and `compile_budget_s` (default
    COMPILE_BUDGET_S; tiny: none) bound the compiled phase's compile time."""
    import transformers

    started = time.perf_counter()
    torch_device = pick_device(device)
    torch_dtype = pick_dtype(dtype, torch_device)
    results = []
    shapes = TINY_SHAPES if tiny else SHAPES
    for shape in shapes:
        results.append(check_shape(shape, torch_device, torch_dtype, tiny))
        print(f"{shape.name}: {results[-1]['seconds']:.0f} s", flush=True)
    llama = [s for s in shapes if s.family == "llama"]
    compile_widths = compile_widths or (TINY_WIDTHS if tiny else COMPILE_WIDTHS)
    budget = compile_budget_s or (float("inf") if tiny else COMPILE_BUDGET_S)  # tiny: every column, to test them
    print(f"compiled phase: {len(llama)} shapes x widths {' '.join(map(str, compile_widths))} compiled, then one "
          f"whole generate (2 compilations); compiling stops after {budget:.0f} s (--compile-widths, "
          "--compile-budget)", flush=True)
    compiled = compiled_phase(llama, build, torch_device, torch_dtype, tiny, compile_widths, budget)
    print(f"compiled phase: {compiled['seconds']:.0f} s", flush=True)
    started_generate = time.perf_counter()
    whole = whole_generate(llama[0], torch_device, torch_dtype, tiny)  # the smallest shape: the cheapest compile
    print(f"whole generate, eager and compiled: {time.perf_counter() - started_generate:.0f} s", flush=True)
    precision = precision_phase(torch_device, torch_dtype, tiny)
    print(f"precision phase: {precision['seconds']:.0f} s", flush=True)
    name = torch.cuda.get_device_name(torch_device) if torch_device.type == "cuda" else platform.processor() or "cpu"
    header = (f"{time.strftime('%Y-%m-%d')}, {name} ({torch_device.type}), {str(torch_dtype).replace('torch.', '')}, "
              f"torch {torch.__version__}, transformers {transformers.__version__}, random weights"
              f"{', tiny shapes' if tiny else ''}; {time.perf_counter() - started:.0f} s in all")
    text = "\n\n".join((tables(results, header), compiled.pop("table"), generate_table(whole),
                         precision.pop("table")))
    out.mkdir(parents=True, exist_ok=True)
    (out / "device_check.md").write_text(text + "\n")
    (out / "device_check.json").write_text(json.dumps(dict(header=header, results=results, compiled=compiled,
                                                           whole_generate=whole, precision=precision),
                                                      indent=1, default=str))
    return text
