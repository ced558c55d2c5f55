"""The device check for a GPU machine as it comes: its own python (no package registry), at most LIMIT_S seconds.

    python -m scd_core.bench device-run --out DIR                     # a GPU machine
    python -m scd_core.bench device-run --out DIR --device cpu --tiny  # the dry run: tiny shapes, seconds

Each part runs in a process of its own under a time limit (its own cap, or what is left of the whole run's),
and writes its table to DIR (`N-part.md`, `N-part.json`) as soon as it is measured: a run cut short keeps what
it measured, and `parts.md` says how each part ended.  In order of value, on the smallest Janus-Pro shape
(random weights, `device_check.build`):

  1. floor: per-call time against the weight-read floor, eager, CUDA graphs and compiled layers
     (`device_compiled.compiled_phase`);
  2. compiled: one whole image with compile=True against eager (`device_check.whole_generate`), and kept CUDA
     graphs against graphs captured anew (`kept_rows`: the second image replays the first's graphs; the tokens
     must equal a fresh capture's);
  3. async: part 2's kept graphs in a process under PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (ComfyUI's
     default on NVIDIA): as the library decides (not kept), and kept anyway, with the allocator's warnings
     counted, which tells whether keeping them could be allowed there;
  4. bits: whether a position's logits are bit-identical when its call is 1, 8 or 32 wide (the same prefix
     cached), in bfloat16 under today's calls and the window-invariant calls (scd_core.compiled.invariant) in
     tiles of 32, 64 and 128 rows, and in float32 with TF32 off, through transformers' layers and through the
     static row attention of compiled models (run eagerly), with each setting's time per call at widths 1-64:
     which tile a GPU wants;
  5. norms: what the bits part cannot see at one shape: RMSNorm (transformers' LlamaRMSNorm) over anchor rows in
     calls of 1 to 256 rows, rows whose float32 variance and bfloat16 output differ from the 128-row call's, as the
     norm comes and in the window-invariant tiles; and top-p's row sums (`sampling.to_probs`) at vocabularies of
     16k to 131k, a position alone against among 32;
  6. int8: one int8 layer's kernels (`device_check.int8_kernel_rows`);
  7-13. linear, attention, model, compiled_bits, cost, rehash, auto: one kernel's tiles alone, the model level,
     compiled widths, what the tiles cost, a second process's hashes and the automatic window against pinned
     ones (`device_parts`, which says what each answers).

The dry run runs dynamo's "eager" backend (graphs traced, no code generated: inductor takes minutes per width
on a CPU); the header says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch

from ..windows import auto_window
from ..compiled import compiled_regions, cuda_graphs, invariant
from ..decoding.config import SamplerConfig
from ..decoding.engine import generate
from ..models.weights.memory import release_memory
from . import device_kernels, device_parts
from .device_model import invariant_calls
from .tables import markdown

LIMIT_S = 540  # the whole run: 9 minutes
ASYNC_ALLOCATOR_CONF = "backend:cudaMallocAsync"
KEPT_CONFIGS = (("A seed 0 (captures)", SamplerConfig(seed=0, coupler="maximal", window=16)),
                ("B seed 5, T 0.9 (kept graphs)", SamplerConfig(seed=5, coupler="maximal", window=16,
                                                                 temperature=0.9)),
                ("B again (captured anew)", SamplerConfig(seed=5, coupler="maximal", window=16, temperature=0.9)))
BIT_WIDTHS = (1, 8, 32)
BIT_SPAN = 32  # positions compared, after the prompt and BIT_CACHED image tokens
BIT_CACHED = 288
COMPILE_WIDTHS = (1, 32)
COMPILE_BUDGET_S = 45.0


def _setting(device: str, tiny: bool) -> tuple[torch.device, torch.dtype, Any]:
    """The device, the compute dtype and the Janus-Pro shape a part runs at."""
    from .device_check import SHAPES, TINY_SHAPES

    shape = next(s for s in (TINY_SHAPES if tiny else SHAPES) if s.family == "llama")
    torch_device = torch.device(device)
    return torch_device, torch.float32 if tiny else torch.bfloat16, shape


def floor_part(device: torch.device, dtype: torch.dtype, shape: Any, tiny: bool) -> Iterator[tuple[str, Any]]:
    from .device_check import build
    from .device_compiled import TINY_WIDTHS, compiled_phase

    result = compiled_phase([shape], build, device, dtype, tiny, TINY_WIDTHS[:1] if tiny else COMPILE_WIDTHS,
                            COMPILE_BUDGET_S)
    yield result.pop("table"), result


def kept_rows(device: torch.device, dtype: torch.dtype, shape: Any, tiny: bool) -> list[dict[str, Any]]:
    """Three compiled images: the first captures its graphs, the second replays them (`took_kept`), the third,
    the second's settings after `forget`, captures anew; the kept replay's tokens must be the fresh capture's."""
    from .device_check import ShapeModel, build

    model, head = build(shape, device, dtype, tiny)
    compiled = ShapeModel(shape, model, head, compile=True)
    holder = cuda_graphs.kept_graphs(compiled)
    rows, tokens = [], {}
    for step, config in KEPT_CONFIGS:
        if step.startswith("B again"):
            holder.forget()
        before = holder.kept
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            started = time.perf_counter()
            result = generate(compiled, None, config)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - started
        tokens[step] = result.tokens
        rows.append(dict(step=step, seconds=seconds, calls=result.nfe, ms_per_call=1000 * seconds / result.nfe,
                         took_kept=before is not None and holder.kept is before,
                         kept_mib=holder.kept_bytes() / 2**20,
                         allocated_mib=torch.cuda.memory_allocated(device) / 2**20 if device.type == "cuda" else "-",
                         allocator_warnings=sum("free" in str(w.message) for w in caught),
                         eager_fallbacks="; ".join(result.eager_fallbacks)[:160] or "-"))
    for row in rows:
        row["tokens_vs_captured_anew"] = int((tokens[row["step"]] != tokens[KEPT_CONFIGS[-1][0]]).sum())
    holder.forget()
    return rows


def compiled_part(device: torch.device, dtype: torch.dtype, shape: Any, tiny: bool) -> Iterator[tuple[str, Any]]:
    from .device_check import generate_table, whole_generate

    whole = whole_generate(shape, device, dtype, tiny)
    yield generate_table(whole), dict(whole_generate=whole)
    rows = kept_rows(device, dtype, shape, tiny)
    yield (generate_table(whole) + "\n\nKept CUDA graphs against graphs captured anew (compile=True, window 16, "
            "maximal): `took_kept` the image replayed the last one's graphs; `tokens_vs_captured_anew` must be 0 "
            "in every B row\n\n" + markdown(rows, list(rows[0]))), dict(whole_generate=whole, kept=rows)


def async_part(device: torch.device, dtype: torch.dtype, shape: Any, tiny: bool) -> Iterator[tuple[str, Any]]:
    backend, rows = cuda_graphs.allocator_backend(), []
    decided = cuda_graphs.allocator_backend
    # as the library decides, then kept anyway (the native allocator reported): what keeping them there would do
    for graphs, reported in (("as decided", decided), ("kept anyway", lambda: "native")):
        cuda_graphs.allocator_backend = reported
        try:
            rows += [dict(graphs=graphs, **row) for row in kept_rows(device, dtype, shape, tiny)]
        finally:
            cuda_graphs.allocator_backend = decided
        yield async_table(rows, backend), dict(backend=backend, rows=rows)


def async_table(rows: list[dict[str, Any]], backend: Optional[str]) -> str:
    return (f"Kept CUDA graphs under {os.environ.get('PYTORCH_CUDA_ALLOC_CONF', 'the default allocator')} (torch "
            f"reports the {backend} allocator): as the library decides (not kept under cudaMallocAsync), then kept "
            "anyway; `allocator_warnings`: torch's warnings about frees of graph memory during the image\n\n"
            + markdown(rows, list(rows[0])))


# the calls a bits row runs: today's (each at its own shape), and window-invariant tiles of 32 rows (the CPU's)
# to 128 (CUDA's, unmeasured: weight-bound calls re-read the weights once per tile)
BIT_CALLS = (("today's", None), ("tiles of 32", 32), ("tiles of 64", 64), ("tiles of 128", 128))
TIMED_WIDTHS = (1, 8, 32, 64)


def bit_rows(device: torch.device, dtype: torch.dtype, shape: Any, tiny: bool, calls: str,
             rows: Optional[int]) -> list[dict[str, Any]]:
    """Logits of BIT_SPAN positions computed in calls of each BIT_WIDTHS width (and width 8 again), compared
    position by position, and the time of one call of each TIMED_WIDTHS width (CFG: twice its rows), under
    `calls` (`invariant_calls(rows)`)."""
    from .device_check import ShapeModel, build

    model, head = build(shape, device, dtype, tiny)
    cached = 0 if tiny else BIT_CACHED
    ids = torch.randint(shape.codes, (1, cached + BIT_SPAN + max(TIMED_WIDTHS)),
                        generator=torch.Generator().manual_seed(0)).to(device)
    out = []
    for static in (False, True):
        network = ShapeModel(shape, model, head, num_tokens=ids.shape[1])
        network.compiled, network.compiled_layer = static, None  # the static row attention, run eagerly
        with invariant_calls(rows):
            logits, seconds = _widths_measured(network, ids, cached)
        for a, b in ((1, 8), (1, 32), (8, 32), (8, "8 again")):
            same = sum(bool(torch.equal(logits[a][:, :, p], logits[b][:, :, p])) for p in range(BIT_SPAN))
            timed = {f"ms_width_{width}": 1000 * s for width, s in seconds.items()} if (a, b) == (1, 8) else {}
            out.append(dict(dtype=str(dtype).replace("torch.", ""), calls=calls,
                            backbone="static row attention" if static else "transformers layers",
                            widths=f"{a} vs {b}", positions_bit_equal=f"{same}/{BIT_SPAN}",
                            max_abs_diff=float((logits[a] - logits[b]).abs().max()), **timed))
    del model, head
    release_memory()
    return out


def _widths_measured(network: Any, ids: torch.Tensor, cached: int
                     ) -> tuple[dict[Any, torch.Tensor], dict[int, float]]:
    """Over one session with `cached` of `ids` cached: the logits (cond/uncond, 1, BIT_SPAN, V) of the next
    BIT_SPAN positions by the width of the calls computing them, and the seconds of one call of each TIMED_WIDTHS
    width (`auto_window.measure_costs`)."""
    session = network.start(None, 1)
    session.prefill()
    if cached:
        session.forward(ids[:, :cached])
    logits = {}
    for width in (*BIT_WIDTHS, "8 again"):
        step = 8 if width == "8 again" else width
        chunks = [session.forward(ids[:, cached + at:cached + at + step]) for at in range(0, BIT_SPAN, step)]
        session.rewind(BIT_SPAN)
        logits[width] = torch.cat([torch.stack(call) for call in chunks], dim=2).float()

    def call(width: int) -> torch.Tensor:
        result = session.forward(ids[:, cached:cached + width])[0]
        session.rewind(width)
        return result

    return logits, auto_window.measure_costs(call, TIMED_WIDTHS)


def bits_part(device: torch.device, dtype: torch.dtype, shape: Any, tiny: bool) -> Iterator[tuple[str, Any]]:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows: list[dict[str, Any]] = []
    for calls, tile in BIT_CALLS:
        rows += bit_rows(device, torch.bfloat16, shape, tiny, calls, tile)
        yield bits_table(rows, shape), rows
    rows += bit_rows(device, torch.float32, shape, tiny, "today's", None)
    yield bits_table(rows, shape), rows


def bits_table(rows: list[dict[str, Any]], shape: Any) -> str:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    return (f"A position's logits computed in calls of width {', '.join(map(str, BIT_WIDTHS))} after the same "
            f"cached prefix ({shape.name}, random weights, TF32 off), under today's calls and the window-invariant "
            "calls in tiles of 32 (the default), 64 and 128 rows: positions whose logits are bit-identical, the "
            "largest difference, and the median time of one call of each width (CFG: twice its rows)\n\n"
            + markdown(rows, columns))


NORM_HIDDEN = (2048, 4096)
NORM_ANCHORS = 4096
NORM_CALL_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOP_P_VOCABULARIES = (16384, 65536, 131072)


def _by_calls(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, rows: int, tiled: bool) -> torch.Tensor:
    """`fn` over `x` in calls of `rows` rows, as they come or inside the window-invariant calls."""
    with invariant.fixed_shape_calls(tiled, x.device):
        return torch.cat([fn(chunk) for chunk in x.split(rows)])


def norm_rows(device: torch.device, tiny: bool) -> list[dict[str, Any]]:
    """Per hidden size and rows per call: the share of anchor rows whose RMSNorm variance (float32) and output
    (bfloat16) differ from the 128-row call's, untiled and tiled."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    generator, out = torch.Generator().manual_seed(0), []
    for hidden in (64,) if tiny else NORM_HIDDEN:
        x = torch.randn(64 if tiny else NORM_ANCHORS, hidden, generator=generator)
        x[:, :8] *= 20  # a few outlier channels, as real activations have
        x = x.bfloat16().to(device)
        norm = LlamaRMSNorm(hidden).to(device, torch.bfloat16)
        norm.weight.data = (1 + 0.1 * torch.randn(hidden, generator=generator)).bfloat16().to(device)
        variance = lambda rows: rows.float().pow(2).mean(-1)
        for tiled in (False, True):
            reference = [_by_calls(f, x, 128, tiled) for f in (variance, norm)]
            for rows in NORM_CALL_ROWS:
                measured = [_by_calls(f, x, rows, tiled) for f in (variance, norm)]
                differ = [float((m != r).reshape(x.shape[0], -1).any(-1).float().mean()) * 100
                          for m, r in zip(measured, reference)]
                out.append(dict(hidden=hidden, calls="tiles" if tiled else "as they come", rows_per_call=rows,
                                variance_rows_differ_pct=differ[0], output_rows_differ_pct=differ[1]))
    return out


def top_p_rows(device: torch.device, tiny: bool) -> list[dict[str, Any]]:
    """Top-p (0.9) probabilities of 32 positions, each alone against among all 32, by vocabulary."""
    from ..decoding.guidance import ScaleGuidance
    from ..decoding.sampling import Sampling

    out = []
    for vocabulary in (4096,) if tiny else TOP_P_VOCABULARIES:
        logits = torch.randn(1, 32, vocabulary, generator=torch.Generator().manual_seed(1)).bfloat16().to(device)
        for policy in ("off", "on"):
            with invariant_calls(None if policy == "off" else 128 if device.type == "cuda" else 32):
                guidance = ScaleGuidance(Sampling(top_p=0.9), device)
                probs = lambda rows: guidance.probs((rows, None), lambda: torch.zeros(1, rows.shape[1]).long())
                alone = torch.cat([probs(logits[:, i:i + 1]) for i in range(32)], dim=1)
                together = probs(logits)
            same = sum(torch.equal(alone[0, p], together[0, p]) for p in range(32))
            out.append(dict(vocabulary=vocabulary, calls="tiles" if policy == "on" else "as they come",
                            positions_bit_equal=f"{same}/32"))
    return out


def norms_part(device: torch.device, dtype: torch.dtype, shape: Any, tiny: bool) -> Iterator[tuple[str, Any]]:
    norms = norm_rows(device, tiny)
    text = ("RMSNorm (LlamaRMSNorm, bfloat16) over anchor rows in calls of 1-256 rows: the share of rows whose "
            "float32 variance and bfloat16 output differ from the 128-row call's, as the norm comes and in the "
            "window-invariant tiles (which must give 0 everywhere)\n\n" + markdown(norms, list(norms[0])))
    yield text, dict(norms=norms)
    sums = top_p_rows(device, tiny)
    yield (text + "\n\nTop-p 0.9 (`to_probs` through the run's guidance): 32 positions alone against among 32, "
           "positions whose probabilities are bit-identical\n\n" + markdown(sums, list(sums[0]))), dict(
        norms=norms, top_p=sums)


def int8_part(device: torch.device, dtype: torch.dtype, shape: Any, tiny: bool) -> Iterator[tuple[str, Any]]:
    from .device_check import int8_kernel_rows

    rows = int8_kernel_rows(device, dtype, tiny)
    yield ("int8 kernels: one int8 layer, the cast against torch's fused `_weight_int8pack_mm` and the float "
            "matmul (`fused_rows_apart`: each row alone gives the same bits)\n\n" + markdown(rows, list(rows[0]))), rows


# name: (cap in seconds on a GPU, the part: its table and data, again each time it has measured more, extra
# environment); the caps add up to at most LIMIT_S, so that every part gets its own (a process's start included)
PARTS: dict[str, tuple[float, Callable[..., Iterator[tuple[str, Any]]], dict[str, str]]] = {
    "floor": (75, floor_part, {}),
    "compiled": (70, compiled_part, {}),
    "async": (45, async_part, {"PYTORCH_CUDA_ALLOC_CONF": ASYNC_ALLOCATOR_CONF}),
    "bits": (45, bits_part, {}),
    "norms": (20, norms_part, {}),
    "int8": (15, int8_part, {}),
    "linear": (20, device_parts.linear_part, {}),
    "attention": (30, device_parts.attention_part, {}),
    "model": (55, device_parts.model_part, {}),
    "compiled_bits": (60, device_parts.compiled_bits_part, {}),
    "cost": (35, device_parts.cost_part, {}),
    "rehash": (30, device_parts.rehash_part, {}),
    "auto": (40, device_parts.auto_part, {}),
}


def environment(device: str, tiny: bool = False) -> str:
    """What the machine runs: python, torch, transformers, the accelerator and its allocator."""
    import transformers

    lines = [f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
             f"transformers {transformers.__version__}, compile=True from torch "
             f"{'.'.join(map(str, compiled_regions.OLDEST_TESTED_TORCH))}: "
             f"{'yes' if compiled_regions.torch_tested(torch.__version__) else 'no, runs eagerly'}"]
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(torch.device(device))
        lines.append(f"{properties.name}, {properties.total_memory / 2**30:.0f} GiB, "
                     f"{properties.multi_processor_count} SMs, allocator {cuda_graphs.allocator_backend()}, "
                     f"cuBLAS {torch._C._cuda_getCompiledVersion()}, cuDNN {torch.backends.cudnn.version()}, "
                     f"MIG: {'yes' if 'MIG' in properties.name else 'no'}")
    lines.append(f"CPU capability {torch.backends.cpu.get_cpu_capability()}; numerics switches (held at these "
                 "defaults inside the window-invariant calls): "
                 + ", ".join(f"{switch.name} {switch.read()}" for switch in invariant.PINNED))
    lines.append("SDPA in a masked attention tile, as the flags come (the profiler's op and kernel names): "
                 + device_kernels.sdpa_kernels(torch.device(device), tiny))
    return "\n".join(f"- {line}" for line in lines)


def run_part(name: str, out: Path, device: str, tiny: bool) -> None:
    """One part, in this process: its table and data written to `out` as soon as each piece is measured."""
    torch.set_grad_enabled(False)
    if tiny:
        compiled_regions.BACKEND = "eager"
    torch_device, dtype, shape = _setting(device, tiny)
    started = time.perf_counter()
    index = list(PARTS).index(name) + 1
    for table, data in PARTS[name][1](torch_device, dtype, shape, tiny):
        header = (f"## {index}. {name} ({time.perf_counter() - started:.0f} s, {torch_device}, "
                  f"{str(dtype).replace('torch.', '')}{', tiny shapes, dynamo eager backend' if tiny else ''})")
        (out / f"{index}-{name}.md").write_text(f"{header}\n\n{table}\n")
        (out / f"{index}-{name}.json").write_text(json.dumps(data, indent=1, default=str))


def _capped(command: list[str], env: dict[str, str], timeout: float) -> str:
    """How `command` ended within `timeout` seconds; cut there with every process it started (compile workers,
    the rehash part's second process), so that none holds the device during the next part."""
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stderr = process.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return "cut at its time limit"
    return "done" if process.returncode == 0 else f"failed ({process.returncode}): {' '.join(stderr.split()[-40:])}"


def run(out: Path, device: Optional[str] = None, tiny: bool = False, limit_s: float = LIMIT_S) -> str:
    """Every part in turn, each in a process of its own under its cap (tiny: the whole limit) and what is left
    of `limit_s`; returns the tables written."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    out.mkdir(parents=True, exist_ok=True)
    (out / "0-environment.md").write_text(f"## Environment\n\n{environment(device, tiny)}\n")
    started, ended = time.perf_counter(), []
    root = str(Path(__file__).resolve().parents[2])
    for name, (cap, _, extra) in PARTS.items():
        left = limit_s - (time.perf_counter() - started)
        if left < 5:
            ended.append(dict(part=name, seconds=0, ended="not run: the time was spent"))
            continue
        env = {**os.environ, **extra, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
               "SCD_WINDOW_COSTS": "off"}
        command = [sys.executable, "-m", "scd_core.bench.device_run", name, str(out), device] + (["--tiny"] * tiny)
        part_started = time.perf_counter()
        ended.append(dict(part=name, ended=_capped(command, env, min(left, limit_s if tiny else cap)),
                          seconds=time.perf_counter() - part_started))
        (out / "parts.md").write_text("## Parts\n\n" + markdown(ended, ["part", "seconds", "ended"]) + "\n")
        print(f"{name}: {ended[-1]['ended'][:200]} ({ended[-1]['seconds']:.0f} s)", flush=True)
    return "\n\n".join(path.read_text() for path in sorted(out.glob("*.md")))


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="one part of the device run, in this process (`run`)")
    parser.add_argument("part", choices=list(PARTS))
    parser.add_argument("out", type=Path)
    parser.add_argument("device")
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    run_part(args.part, args.out, args.device, args.tiny)


if __name__ == "__main__":
    main()
