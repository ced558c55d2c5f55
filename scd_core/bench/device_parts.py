"""The device run's parts after int8 (`device_run.PARTS`): each yields (its table, its data), again each time it
has measured more.  What each answers is in the tables' first lines and in scd_core/bench/README.md, "Device run
(GPU)"; the measuring is in device_kernels, device_model and device_cost."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import Any, Iterator

import torch

from ..models.weights.memory import release_memory
from . import device_cost, device_kernels, device_model
from .tables import markdown

Part = Iterator[tuple[str, Any]]


def _table(rows: list[dict[str, Any]]) -> str:
    return markdown(rows, list(dict.fromkeys(key for row in rows for key in row)))


def linear_part(device: torch.device, dtype: torch.dtype, shape: Any, tiny: bool) -> Part:
    rows = device_kernels.linear_rows(device, tiny)
    yield (f"`tiled_linear` (bfloat16, tiles of {device_kernels.TILE} rows) at every layer shape of "
           f"{', '.join(device_kernels.LINEAR_MODELS)}: one anchor row at tile positions "
           f"{' / '.join(map(str, device_kernels.ANCHOR_POSITIONS))} among other random rows, with torch's default "
           "flags and with reduced-precision reductions off. `positions_bit_equal` must be all of them; "
           "`one_row_call_equal`: a plain 1-row `F.linear` gives the anchor the tile's bits (what the tiles spare "
           "when it does not); `equal_to_default`: the flags change no bits\n\n" + _table(rows)), rows


def attention_part(device: torch.device, dtype: torch.dtype, shape: Any, tiny: bool) -> Part:
    rows: list[dict[str, Any]] = []
    lengths = device_kernels.TINY_KEY_LENGTHS if tiny else device_kernels.KEY_LENGTHS
    for length in lengths:  # a table after each key length: the longest is the slowest
        rows += device_kernels.attention_rows(device, tiny, (length,))
        yield ("`tiled_attention` (bfloat16, Emu3-8B's attention: a width-32 call's query rows in one tile) with "
               "each SDPA backend forced: one anchor query row over the same visible keys, against the keys at "
               "slot 0 in a batch of 2: `shift_N` the keys N slots later, `trailing_N` N more masked keys after "
               f"them (a key-length bucket), `batch_{device_kernels.BATCHES[-1]}` a call of "
               f"{device_kernels.BATCHES[-1]} batch rows; `same` is bit for bit; a backend this device lacks says "
               f"so in `runs`\n\n{_table(rows)}"), rows


def model_part(device: torch.device, dtype: torch.dtype, shape: Any, tiny: bool) -> Part:
    from .device_check import ShapeModel, build

    model, head = build(shape, device, torch.bfloat16, tiny)
    span = device_model.TINY_MODEL_SPAN if tiny else device_model.MODEL_SPAN
    ids = torch.randint(shape.codes, (1, span), generator=torch.Generator().manual_seed(0)).to(device)
    network = ShapeModel(shape, model, head, num_tokens=span)
    other = ShapeModel(dataclasses.replace(shape, prefix=device_model.OTHER_PROMPT), model, head, span)
    text = (f"{shape.name} (bfloat16, random weights): {span} positions after the prompt, their logits in calls "
            f"of width {' / '.join(map(str, device_model.MODEL_WIDTHS))}, in a batch of {device_model.BATCH} "
            "against 1, and jobs admitted beside a longer and a shorter prompt against each alone, under today's "
            "calls and the window-invariant tiles (which must give every position); `first_module_apart`: forward "
            "hooks on every module, the first whose output at the first differing position differs")
    rows = device_model.model_rows(network, ids, device)
    yield f"{text}\n\n{_table(rows)}", dict(positions=rows)
    rows += device_model.admit_rows(network, other, ids, device)
    yield f"{text}\n\n{_table(rows)}", dict(positions=rows)
    grid = shape.grid if tiny else device_model.FLIP_GRID
    flips = device_model.flip_rows(ShapeModel(dataclasses.replace(shape, grid=grid), model, head), device)
    yield (f"{text}\n\n{_table(rows)}\n\nThe faithful coupler's image (seed 0) at windows "
           f"{' / '.join(map(str, device_model.FLIP_WINDOWS))} against window 1's: tokens flipped (the tiles "
           f"must flip none)\n\n{_table(flips)}"), dict(positions=rows, flips=flips)


def compiled_bits_part(device: torch.device, dtype: torch.dtype, shape: Any, tiny: bool) -> Part:
    from .device_check import build

    model, head = build(shape, device, torch.bfloat16, tiny)
    for rows in device_model.compiled_rows(shape, model, head, device, torch.bfloat16):
        yield ("Compiled calls (bfloat16, one compiled layer over the static cache, as compile=True runs them) "
               f"at widths {' / '.join(map(str, device_model.MODEL_WIDTHS))}: the positions a width shares with "
               "a narrower one, bit for bit, and CUDA graph replay against the same compiled call without a graph "
               f"(each width one compilation)\n\n{_table(rows)}"), rows


def cost_part(device: torch.device, dtype: torch.dtype, shape: Any, tiny: bool) -> Part:
    from .device_check import build

    model, head = build(shape, device, torch.bfloat16, tiny)
    calls = device_cost.call_cost_rows(shape, model, head, device, torch.bfloat16)
    text = (f"What the window-invariant tiles cost (bfloat16, {shape.name}, the static row attention over the whole "
            f"pre-sized cache): one call per width, today's calls and the tiles, eager and as CUDA graphs\n\n"
            f"{_table(calls)}")
    yield text, dict(calls=calls)
    attention = device_cost.attention_cost_rows(device, tiny)
    text += ("\n\nOne masked attention call of a width-32 window (Emu3-8B's shape, CFG rows) against the key "
             f"length, tiled and as it comes\n\n{_table(attention)}")
    yield text, dict(calls=calls, attention=attention)
    prefill = device_cost.prefill_rows(shape, model, head, device, tiny)
    yield (f"{text}\n\nA long prompt's prefill, today's calls and the tiles\n\n{_table(prefill)}"), dict(
        calls=calls, attention=attention, prefill=prefill)


def rehash_part(device: torch.device, dtype: torch.dtype, shape: Any, tiny: bool) -> Part:
    command = [sys.executable, "-m", "scd_core.bench.device_kernels", str(device)] + ["--tiny"] * tiny
    # the second process runs while this one does: the part's cap holds one process's time, not two
    second = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    here = device_kernels.kernel_hashes(device, tiny)
    release_memory()
    stdout, stderr = second.communicate()
    if second.returncode:
        raise RuntimeError(f"the second process failed: {' '.join(stderr.split()[-40:])}")
    there = json.loads(stdout.strip().splitlines()[-1])
    rows = [dict(check=name, this_process=value, second_process=there.get(name, "-"),
                 same=value == there.get(name)) for name, value in here.items()]
    same = sum(row["same"] for row in rows)
    yield (f"The linear and attention parts again, in this process and in a second one: {same} of {len(rows)} "
           f"hashes equal (all must be)\n\n{_table(rows)}"), rows


def auto_part(device: torch.device, dtype: torch.dtype, shape: Any, tiny: bool) -> Part:
    for rows in device_cost.auto_rows(device, tiny):
        yield ("`window=\"auto\"` against pinned windows (issue 62): the first automatic image times the widths; "
               "then per round one image at each window, seed for seed; mean seconds per image, calls, and the "
               f"time over the fastest pinned window's\n\n{_table(rows)}"), rows
