"""The prepared device check, on the CPU with tiny shapes: the same code path as on a GPU."""

from __future__ import annotations

import json

from scd_core.bench import cli as bench
from scd_core.bench.device_check import SHAPES, TINY_SHAPES, WIDTHS


def test_device_check_writes_a_table_and_json(tmp_path, capsys):
    bench.main(["--device-check", "--out", str(tmp_path), "--device", "cpu", "--tiny"])
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
    table = (tmp_path / "device_check.md").read_text()
    assert table.startswith(data["header"]) and "cpu" in data["header"]
    assert "| model | params_b | context | ms_at_1 | x2 |" in table and "| ar_s | scd16_s |" in table
    assert table.strip() in capsys.readouterr().out
