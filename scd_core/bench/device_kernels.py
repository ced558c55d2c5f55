"""The device run's kernel parts: one window-invariant tile of a linear layer or of attention, alone.

- `linear_rows`: `invariant.tiled_linear` at every layer shape of Janus-Pro-1B / 7B and Emu3-8B, one anchor row
  at tile positions ANCHOR_POSITIONS among other rows: the tile promises the anchor the same bits wherever it sits
  and whatever its neighbours hold; with torch's default flags and with reduced-precision reductions off.
- `attention_rows`: `invariant.tiled_attention` at Emu3's attention shape (8 KV heads, 4 query heads each, so a
  width-32 call is one 128-row tile) with each SDPA backend forced: an anchor query row's output over the same
  visible keys when the keys move by SHIFTS slots, when masked keys trail them (a key-length bucket) and when the
  call holds 8 rows of the batch instead of 2.
- `sdpa_kernels`: which backend a masked tile really runs as the flags come (the profiler's op and kernel names).
- `kernel_hashes` / `main`: both parts' outputs hashed, so that a second process can compare them.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
from typing import Any, Iterator, Optional

import torch
import torch.nn.functional as F

from ..compiled import invariant
from .device_compiled import _median_seconds

TILE = invariant.TILE_ROWS["cuda"]  # CUDA's tile: the anchor positions below need all of its rows
ANCHOR_POSITIONS = (0, 1, 63, 64, 127)
LINEAR_MODELS = ("Janus-Pro-1B", "Janus-Pro-7B", "Emu3-8B")
FLAGS = ("default", "reduced-precision reductions off")
# Emu3-8B's attention: 8 KV heads of 128, 4 query heads each folded into a KV head's rows (row_attention)
ATTENTION = dict(heads=8, head_dim=128, queries=4 * 32)
TINY_ATTENTION = dict(heads=2, head_dim=16, queries=4 * 8)
KEY_LENGTHS, TINY_KEY_LENGTHS = (640, 2400, 8254), (48, 80)
SHIFTS, TINY_SHIFTS = (1, 7, 64, 512), (1, 8)
TRAILING, TINY_TRAILING = (64, 1024), (8, 32)
BATCHES = (2, 8)
BACKENDS = ("MATH", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "CUDNN_ATTENTION")


def digest(tensors: list[torch.Tensor]) -> str:
    """A short hash of the tensors' values (bit for bit)."""
    hashed = hashlib.sha256()
    for tensor in tensors:
        hashed.update(tensor.detach().float().cpu().numpy().tobytes())
    return hashed.hexdigest()[:16]


def layer_shapes(tiny: bool) -> list[tuple[str, str, int, int]]:
    """(model, layers, out, in) of every distinct linear layer shape of LINEAR_MODELS (tiny: one tiny model)."""
    from .device_check import SHAPES, TINY_SHAPES

    shapes = TINY_SHAPES[:1] if tiny else [s for s in SHAPES if s.name in LINEAR_MODELS]
    out = []
    for shape in shapes:
        c = shape.config
        hidden, inner = c["hidden_size"], c["intermediate_size"]
        kv = hidden * c["num_key_value_heads"] // c["num_attention_heads"]
        layers: dict[tuple[int, int], list[str]] = {}
        for name, size in (("q, o", (hidden, hidden)), ("k, v", (kv, hidden)), ("gate, up", (inner, hidden)),
                           ("down", (hidden, inner)), ("image head", (shape.codes, hidden))):
            layers.setdefault(size, []).append(name)
        out += [(shape.name, ", ".join(names), *size) for size, names in layers.items()]
    return out


@contextlib.contextmanager
def matmul_flags(flags: str) -> Iterator[None]:
    """torch's default flags, or bfloat16 / float16 reduced-precision reductions off (CUDA's GEMMs read them)."""
    matmul, names = torch.backends.cuda.matmul, ("allow_bf16_reduced_precision_reduction",
                                                 "allow_fp16_reduced_precision_reduction")
    saved = [getattr(matmul, name) for name in names]
    for name in names:
        setattr(matmul, name, flags == FLAGS[0])
    try:
        yield
    finally:
        for name, value in zip(names, saved):
            setattr(matmul, name, value)


def linear_rows(device: torch.device, tiny: bool) -> list[dict[str, Any]]:
    """Per layer shape and flags: the anchor's output row at each tile position (other rows random each time)
    against position 0's, a 1-row call against the tile, the off flags against the default, a tile's time."""
    rows = []
    for index, (model, layers, out_features, in_features) in enumerate(layer_shapes(tiny)):
        generator = torch.Generator(device).manual_seed(index)
        weight = torch.randn(out_features, in_features, generator=generator, device=device).bfloat16() * 0.02
        tiles = torch.randn(len(ANCHOR_POSITIONS), TILE, in_features, generator=generator, device=device).bfloat16()
        for at, position in enumerate(ANCHOR_POSITIONS):
            tiles[at, position] = tiles[0, 0]
        default: Optional[torch.Tensor] = None
        for flags in FLAGS:
            with matmul_flags(flags):
                outputs = torch.stack([invariant.tiled_linear(tile, weight, rows=TILE)[position]
                                       for tile, position in zip(tiles, ANCHOR_POSITIONS)])
                alone = F.linear(tiles[0, :1], weight)[0]
                seconds = _median_seconds(lambda: invariant.tiled_linear(tiles[0], weight, rows=TILE), device)
            default = outputs if default is None else default
            same = [p for p, row in zip(ANCHOR_POSITIONS, outputs) if torch.equal(row, outputs[0])]
            rows.append(dict(model=model, layers=layers, shape=f"{out_features}x{in_features}", flags=flags,
                             positions_bit_equal=f"{len(same)}/{len(ANCHOR_POSITIONS)}",
                             differ_at=" ".join(str(p) for p in ANCHOR_POSITIONS if p not in same) or "-",
                             one_row_call_equal=bool(torch.equal(alone, outputs[0])),
                             equal_to_default=bool(torch.equal(outputs, default)), tile_ms=1000 * seconds,
                             hash=digest([outputs])))
    return rows


def attention_case(device: torch.device, tiny: bool, length: int, batch: int = 2, shift: int = 0,
                   trailing: int = 0) -> tuple[torch.Tensor, ...]:
    """(query, key, value, mask) of one masked tile: the anchor (batch row 0, query row 0) and its visible keys
    are the same in every case; the visible keys sit at slots [shift, shift + visible) of `length + trailing`."""
    size = TINY_ATTENTION if tiny else ATTENTION
    visible = length - max(TINY_SHIFTS if tiny else SHIFTS)
    generator = torch.Generator(device).manual_seed(7)
    shape = (BATCHES[-1], size["heads"], length + max(TINY_TRAILING if tiny else TRAILING), size["head_dim"])
    keys, values = (torch.randn(shape, generator=generator, device=device).bfloat16() for _ in range(2))
    query = torch.randn(BATCHES[-1], size["heads"], size["queries"], size["head_dim"], generator=generator,
                        device=device).bfloat16()
    noise = torch.Generator(device).manual_seed(8 + shift + 3 * trailing + 5 * batch)  # what the anchor must not see
    slots = length + trailing
    key, value = (torch.randn(batch, *t.shape[1:-2], slots, t.shape[-1], generator=noise, device=device).bfloat16()
                  for t in (keys, values))
    key[..., shift:shift + visible, :], value[..., shift:shift + visible, :] = (
        keys[:batch, :, :visible], values[:batch, :, :visible])
    mask = torch.zeros(batch, 1, size["queries"], slots, dtype=torch.bool, device=device)
    mask[..., shift:shift + visible] = True
    return query[:batch], key, value, mask


def _anchor(backend: str, case: tuple[torch.Tensor, ...]) -> torch.Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([getattr(SDPBackend, backend)]):
        return invariant.tiled_attention(*case, rows=TILE)[0, :, 0]


def attention_rows(device: torch.device, tiny: bool, lengths: Optional[tuple[int, ...]] = None
                   ) -> list[dict[str, Any]]:
    """Per backend and key length: the anchor's output with moved keys, trailing masked keys and batch 8 against
    batch 2 with the keys at slot 0; a backend this device lacks is a row that says so."""
    rows = []
    for backend in BACKENDS:
        for length in lengths or (TINY_KEY_LENGTHS if tiny else KEY_LENGTHS):
            row: dict[str, Any] = dict(backend=backend.lower(), keys=length)
            reference_case = attention_case(device, tiny, length)
            try:
                reference = _anchor(backend, reference_case)
            except (RuntimeError, AttributeError) as err:  # not on this device, torch or shape
                rows.append(dict(row, runs=f"not here: {' '.join(str(err).split())[:90]}"))
                continue
            cases = {**{f"shift_{s}": dict(shift=s) for s in (TINY_SHIFTS if tiny else SHIFTS)},
                     **{f"trailing_{t}": dict(trailing=t) for t in (TINY_TRAILING if tiny else TRAILING)},
                     f"batch_{BATCHES[-1]}": dict(batch=BATCHES[-1])}
            outputs = {name: _anchor(backend, attention_case(device, tiny, length, **case))
                       for name, case in cases.items()}
            row["runs"] = "yes"
            row.update({name: "same" if torch.equal(out, reference) else
                        f"differs {float((out.float() - reference.float()).abs().max()):.1e}"
                        for name, out in outputs.items()})
            row["tile_ms"] = 1000 * _median_seconds(lambda: _anchor(backend, reference_case), device)
            row["hash"] = digest([reference, *outputs.values()])
            rows.append(row)
    return rows


def sdpa_kernels(device: torch.device, tiny: bool) -> str:
    """The SDPA ops and device kernels one masked tile runs with the backend flags as they are (the profiler's
    names): which backend really ran."""
    from torch.profiler import ProfilerActivity, profile

    case = attention_case(device, tiny, (TINY_KEY_LENGTHS if tiny else KEY_LENGTHS)[0])
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiled:
        invariant.tiled_attention(*case, rows=TILE)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    words = ("scaled_dot_product", "attention", "fmha", "flash", "cudnn", "softmax")
    names = dict.fromkeys(event.key for event in profiled.key_averages()
                          if any(word in event.key.lower() for word in words))
    return "; ".join(name[:90] for name in names) or "no attention op recorded"


def kernel_hashes(device: torch.device, tiny: bool) -> dict[str, str]:
    """Every linear and attention row's hash, by its name."""
    hashes = {f"linear {r['model']} {r['shape']} {r['flags']}": r["hash"] for r in linear_rows(device, tiny)}
    hashes.update({f"attention {r['backend']} {r['keys']} keys": r.get("hash", r["runs"])
                   for r in attention_rows(device, tiny)})
    return hashes


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="print the linear and attention parts' hashes (JSON)")
    parser.add_argument("device")
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    print(json.dumps(kernel_hashes(torch.device(args.device), args.tiny)))


if __name__ == "__main__":
    main()
