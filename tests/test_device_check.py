"""The prepared device check, on the CPU with tiny shapes: the same code path as on a GPU."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from row_count_kernels import RowCountKernels
from scd_core.bench import cli as bench
from scd_core.bench import device_kernels, device_model, device_parts, device_run
from scd_core.bench.device_check import INT8_ROWS, PRECISION_WIDTHS, SHAPES, TINY_SHAPES, WIDTHS
from scd_core.bench.device_compiled import TINY_WIDTHS, table


def test_device_check_writes_a_table_and_json(tmp_path, capsys):
    bench.main(["device-check", "--out", str(tmp_path), "--device", "cpu", "--tiny"])
    data = json.loads((tmp_path / "device_check.json").read_text())
    names = [r["name"] for r in data["results"]]
    assert names == [s.name for s in TINY_SHAPES] and {s.family for s in TINY_SHAPES} == {s.family for s in SHAPES}
    for result in data["results"]:
        assert [int(w) for w in result["ratios"]] == list(WIDTHS) and result["ratios"]["1"] == 1.0
        assert all(ratio >= 1.0 for ratio in result["ratios"].values())  # a wider call is never cheaper
        assert result["transformers_generate_ms_per_token"] > 0 and result["ar_ms_per_token"] > 0
        runs = result["runs"]
        assert runs["AR"]["nfe"] == result["tokens"]
        assert all(runs[f"SCD {w}"]["nfe"] < result["tokens"] for w in (16, 32, 64, "auto"))
        assert all(run["predicted_s"] > 0 for run in runs.values())
    compiled = data["compiled"]
    assert compiled["bandwidth_gb_s"] > 0
    (result,) = compiled["results"]  # the Llama-family (Janus-Pro) shape
    assert [r["width"] for r in result["rows"]] == list(TINY_WIDTHS) and result["compile_error"] is None
    for row in result["rows"]:
        assert row["graphs_ms"] == row["graphs_vs_eager"] == "not available on cpu"
        assert row["eager_ms"] > 0 and row["compiled_ms"] > 0
        assert row["compiled_vs_eager"]["same_tokens"] and row["compiled_vs_eager"]["max_logit_diff"] < 1e-4
    assert result["tree_ms"] > 0 and result["kv_cache_mb"] > 0
    # the floor reads the weights and the whole static cache
    assert result["floor_ms"] * compiled["bandwidth_gb_s"] * 1e6 == pytest.approx(
        (result["weight_mb"] + result["kv_cache_mb"]) * 2**20)
    whole = data["whole_generate"]
    assert whole["status"] == "compiled, no CUDA graphs on cpu" and whole["same_tokens"]
    assert whole["graphs_kept"] == "none kept"  # (graphs and what they read are kept only where captured)
    assert whole["eager_calls"] == whole["compiled_calls"] < TINY_SHAPES[0].grid[0] * TINY_SHAPES[0].grid[1]
    assert all(whole[f"{name}_s"] > 0 for name in ("eager", "compiled_first", "compiled"))
    precision = data["precision"]
    offered = ["none", "int8"] + (["nf4"] if importlib.util.find_spec("bitsandbytes") else [])  # NF4 runs on CPUs
    rows = {(r["quantize"], r["window"]): r for r in precision["rows"]}
    assert set(rows) == {(p, w) for p in offered for w in PRECISION_WIDTHS}
    assert [line.split(":")[0] for line in precision["skipped"]] == [p for p in ("nf4",) if p not in offered]
    for width in PRECISION_WIDTHS:  # the same backbone in fewer bytes, most precise first; every call timed
        sizes = [rows[p, width]["weight_gb"] for p in offered]
        assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == len(sizes)
        assert all(rows[p, width]["seconds"] > 0 and rows[p, width]["peak_mem_gb"] > 0 for p in offered)
    assert rows["none", 1]["vs_full_w1"] == 1.0
    assert any("low-VRAM streaming" in note and "not measured" in note for note in precision["notes"])
    kernels = precision["int8_kernels"]  # the float32 CPU: the layer casts, the kernel runs its scalar loop
    assert [row["rows"] for row in kernels] == list(INT8_ROWS) and not any(r["layer_uses_fused"] for r in kernels)
    assert all(row["fused_rows_apart"] and row["fused_vs_cast"] < 1e-5 for row in kernels)
    assert all(row[f"{name}_ms"] > 0 for row in kernels for name in ("cast", "fused", "float"))
    table = (tmp_path / "device_check.md").read_text()
    assert "| size | quantize | window | weight_gb | peak_mem_gb | seconds |" in table and "low-VRAM streaming" in table
    assert ("| model | width | floor_ms | eager_ms | graphs_ms | graphs_vs_eager | compiled_ms | compiled_vs_eager |"
            in table)
    assert ("| window | status | same_tokens | eager_calls | compiled_calls | eager_s | compiled_first_s | "
            "compiled_s | graphs_kept |") in table
    assert "| rows | layer | layer_uses_fused | cast_ms | float_ms | fused_ms | fused_rows_apart |" in table
    assert table.startswith(data["header"]) and "cpu" in data["header"]
    assert "| model | params_b | context | ms_at_1 | x2 |" in table and "| ar_s | scd16_s |" in table
    assert table.strip() in capsys.readouterr().out


def test_a_failed_compile_shows_in_the_table():
    row = dict(model="m", width=1, floor_ms=1.0, eager_ms=2.0, graphs_ms=1.5,
               graphs_vs_eager=dict(same_tokens=True, max_logit_diff=0.0), compiled_ms=2.0,
               compiled_vs_eager=dict(same_tokens=True, max_logit_diff=0.0))
    result = dict(name="m", floor_ms=1.0, rows=[row], tree_ms=3.0, tree="3 chains at width 32",
                  compile_error="BackendCompilerFailed: no C++ compiler")
    text = table([result], 100.0)
    assert "| m | 1 | 1 | 2 | 1.5 | bit-equal | compile failed (ran eagerly): BackendCompilerFailed: no C++" in text


def test_device_run_dry_run_writes_each_table_as_it_goes(tmp_path):
    """The device run for a GPU machine as it comes, on the CPU with tiny shapes: every part ends, in its own
    process, and writes its table as soon as it is measured (each file before the next part's)."""
    # the 540 s are a GPU's budget: thirteen tiny parts on a shared 2-core CPU take 8-10 minutes
    text = device_run.run(tmp_path, "cpu", tiny=True, limit_s=1800)
    names = [f"{index}-{name}.md" for index, name in enumerate(device_run.PARTS, start=1)]
    written = [tmp_path / name for name in ["0-environment.md", *names]]
    assert all(path.exists() for path in written)
    times = [path.stat().st_mtime for path in written]
    assert times == sorted(times) and len(set(times)) == len(times)
    parts = (tmp_path / "parts.md").read_text()
    assert all(f"| {name} | " in parts and "done" in parts.split(f"| {name} | ")[1].split("\n")[0]
               for name in device_run.PARTS)
    assert "transformers" in text and "compile=True from torch" in text
    kept = json.loads((tmp_path / "2-compiled.json").read_text())
    assert kept["whole_generate"]["same_tokens"]
    assert [row["tokens_vs_captured_anew"] for row in kept["kept"]][1:] == [0, 0]
    bits = json.loads((tmp_path / "4-bits.json").read_text())
    pairs = ("1 vs 8", "1 vs 32", "8 vs 32", "8 vs 8 again")
    settings = [("bfloat16", calls) for calls, _ in device_run.BIT_CALLS] + [("float32", "today's")]
    assert sorted((row["dtype"], row["calls"], row["backbone"], row["widths"]) for row in bits) == sorted(
        (*setting, backbone, pair) for setting in settings for backbone in ("transformers layers",
                                                                             "static row attention") for pair in pairs)
    assert all(row["positions_bit_equal"] == "32/32" for row in bits
               if row["widths"] == "8 vs 8 again" or row["calls"].startswith("tiles"))
    assert all(row[f"ms_width_{width}"] > 0 for row in bits if row["widths"] == "1 vs 8"
               for width in device_run.TIMED_WIDTHS)
    asynchronous = json.loads((tmp_path / "3-async.json").read_text())
    assert [row["graphs"] for row in asynchronous["rows"]] == ["as decided"] * 3 + ["kept anyway"] * 3
    for path in written[1:]:
        assert "|---|" in path.read_text()  # a table in each
    assert "SDPA in a masked attention tile" in written[0].read_text()
    read = lambda name: json.loads((tmp_path / f"{list(device_run.PARTS).index(name) + 1}-{name}.json").read_text())
    assert all(row["positions_bit_equal"] == "5/5" for row in read("linear"))
    math = [row for row in read("attention") if row["backend"] == "math"]
    assert len(math) == 2 and all(row["runs"] == "yes" and "hash" in row for row in math)
    model = read("model")
    assert all(row["positions_bit_equal"] == "64/64" for row in model["positions"] if row["calls"] == "tiles")
    assert sum("admitted" in row["compared"] for row in model["positions"]) == 4
    assert all(row["flipped"] == 0 for row in model["flips"] if row["calls"] == "tiles")
    compiled = read("compiled_bits")
    assert [row["width"] for row in compiled] == [1, 1, 8, 8, 32, 32]
    assert all(row["runs"] == "skipped: no CUDA graphs on cpu" for row in compiled[1::2])
    assert all(row["runs"] == "yes" and row.get("vs_width_1", "1/1 bit-equal") == "1/1 bit-equal"
               for row in compiled[::2])
    cost = read("cost")
    assert [row["width"] for row in cost["calls"]] == list(device_model.MODEL_WIDTHS)
    assert len(cost["attention"]) == 3 and [row["calls"] for row in cost["prefill"]] == ["today's", "tiles"]
    assert all(row["same"] for row in read("rehash"))
    assert [(row["model"], row["window"]) for row in read("auto")] == [
        (model, window) for model in ("demo", "Janus-Pro-1B stand-in") for window in ("auto", "16")]


CPU = torch.device("cpu")


def test_the_device_runs_linear_part_sees_a_kernel_that_rounds_by_row_count():
    """Under kernels that round a call of many rows apart from a call of one (as cuBLAS does), the linear part
    still finds the anchor's bits at every tile position, and its one-row column shows what the tiles spare."""
    with RowCountKernels():
        rows = device_kernels.linear_rows(CPU, tiny=True)
    assert {row["flags"] for row in rows} == set(device_kernels.FLAGS)
    assert all(row["positions_bit_equal"] == "5/5" and row["equal_to_default"] for row in rows)
    assert not any(row["one_row_call_equal"] for row in rows)


def test_the_device_runs_attention_part_sees_moved_keys():
    """Under a kernel that reduces keys in blocks from slot 0 (split-KV kernels), keys moved by 8 slots give the
    anchor other bits (the stand-in's nudge for 1 slot is under a bfloat16 step) and the table says so; trailing
    masked keys and a wider batch do not."""
    with RowCountKernels():
        rows = device_kernels.attention_rows(CPU, tiny=True, lengths=(48,))
    math = next(row for row in rows if row["backend"] == "math")
    assert math["runs"] == "yes" and math["shift_8"].startswith("differs")
    assert [math[f"trailing_{n}"] for n in device_kernels.TINY_TRAILING] == ["same", "same"]
    assert math[f"batch_{device_kernels.BATCHES[-1]}"] == "same"
    assert {row["backend"] for row in rows} == {backend.lower() for backend in device_kernels.BACKENDS}


def test_the_device_runs_model_part_names_the_first_module_apart():
    """Under kernels that round by row count, today's calls give width 1 and width 8 other logits, and forward
    hooks name the first module whose output differs; the window-invariant tiles give every position."""
    from scd_core.bench.device_check import ShapeModel, build

    shape = next(s for s in TINY_SHAPES if s.family == "llama")
    model, head = build(shape, CPU, torch.bfloat16, tiny=True)
    ids = torch.randint(shape.codes, (1, 16), generator=torch.Generator().manual_seed(0))
    with RowCountKernels(), torch.no_grad():
        rows = device_model.model_rows(ShapeModel(shape, model, head, num_tokens=16), ids, CPU)
    today = {row["compared"]: row for row in rows if row["calls"] == "today's"}
    assert today["1 vs 8"]["positions_bit_equal"] != "16/16"
    assert today["1 vs 8"]["first_module_apart"].startswith("model.layers.0.")
    assert all(row["positions_bit_equal"] == "16/16" for row in rows if row["calls"] == "tiles")


def test_the_device_runs_second_process_sees_other_bits():
    """The rehash part compares this process's hashes with a second process's: bits that this process alone
    computes otherwise (here under kernels that round by row count) show as unequal rows."""
    with RowCountKernels(), torch.no_grad():
        table, rows = next(device_parts.rehash_part(CPU, torch.float32, None, tiny=True))
    linear = [row for row in rows if row["check"].startswith("linear")]
    assert linear and not any(row["same"] for row in linear)
    assert f"of {len(rows)} hashes equal" in table


def test_a_part_cut_at_its_cap_takes_the_processes_it_started_with_it(tmp_path):
    """A part cut at its time limit ends with every process it started (a second process, compile workers),
    so that none holds the device during the next part."""
    import sys
    import time

    child = tmp_path / "child.pid"
    script = ("import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', 'import time; "
              f"time.sleep(120)']); open({str(child)!r}, 'w').write(str(child.pid)); time.sleep(120)")
    started = time.perf_counter()
    assert device_run._capped([sys.executable, "-c", script], {}, 3) == "cut at its time limit"
    assert time.perf_counter() - started < 60  # not held until the child's own end (its output pipe closing)
    state = lambda: next((line.split()[1] for line in open(f"/proc/{child.read_text()}/status")
                          if line.startswith("State:")), "gone")
    for _ in range(50):  # gone, or a zombie that nothing reaps in a container
        try:
            if state() in ("Z", "X"):
                break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the part's own process {child.read_text()} still runs")
    assert device_run._capped([sys.executable, "-c", "import sys; sys.exit(3)"], {}, 30).startswith("failed (3)")
