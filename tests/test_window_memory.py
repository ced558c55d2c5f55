"""The automatic window's costs saved for the next process (scd_core.window_memory): a new model object (as in a
new process) starts from the saved costs without timing calls; a corrupt file is ignored with one warning and
replaced, a foreign one ignored with one warning and left alone; "off" reads and writes nothing; under
ComfyUI the file goes to the folder the nodes set.  Every file here is under tmp_path."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from scd_core import SamplerConfig, auto_window, generate, window_memory
from scd_core.bench.synthetic import GridModel

COSTS = {1: 0.010, 2: 0.011, 4: 0.012, 8: 0.015, 16: 0.02, 32: 0.03}


@pytest.fixture
def costs_file(tmp_path, monkeypatch) -> Path:
    """A file of this test's own, and the module's per-process state reset."""
    path = tmp_path / "cache" / window_memory.FILE_NAME
    monkeypatch.setenv(window_memory.ENV, str(path))
    monkeypatch.setattr(window_memory, "_tracked", {})
    monkeypatch.setattr(window_memory, "_warned", set())
    monkeypatch.setattr(window_memory, "_folder", None)
    return path


def grid() -> GridModel:
    return GridModel(rows=6, cols=8, vocab_size=64, sharpness=0.5)


def timings(monkeypatch) -> list:
    """Record the timed passes; each measures COSTS."""
    measured: list = []
    monkeypatch.setattr(auto_window, "measure_costs", lambda call, widths: measured.append(widths) or
                        {w: COSTS[w] for w in widths})
    return measured


def test_a_new_process_starts_from_the_saved_costs(costs_file, monkeypatch):
    measured = timings(monkeypatch)
    first = grid()
    for seed in range(3):
        generate(first, None, SamplerConfig(window="auto", seed=seed))
    window_memory.save()  # as at the process's exit
    learned = auto_window._COSTS[first][auto_window.cost_key(first, 1)]
    saved = json.loads(costs_file.read_text())
    assert saved["format"] == window_memory.FORMAT and len(saved["models"]) == 1
    assert len(measured) == 1

    later = grid()  # another object of the same model: what a new process holds
    recalled = auto_window.recalled_costs(later, auto_window.cost_key(later, 1))
    assert recalled.estimates() == pytest.approx(learned.estimates(), rel=1e-12)
    assert recalled.compared == learned.compared and recalled.hazard == learned.hazard
    generate(later, None, SamplerConfig(window="auto", seed=0))
    assert len(measured) == 1  # no timed pass: the saved costs seeded it
    other = GridModel(rows=6, cols=6, vocab_size=64)  # another image size: costs of its own
    assert auto_window.recalled_costs(other, auto_window.cost_key(other, 1)) is None
    assert auto_window.recalled_costs(later, auto_window.cost_key(later, 2)) is None  # another batch


def test_fixed_profiles_are_not_saved(costs_file):
    model = grid()
    auto_window.remember_costs(model, 1, COSTS)
    generate(model, None, SamplerConfig(window="auto", seed=1))
    window_memory.save()
    assert not costs_file.exists()


def saved_warnings(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if "saved costs" in record.getMessage()]


def test_a_corrupt_file_is_ignored_with_one_warning_and_replaced(costs_file, monkeypatch, caplog):
    measured = timings(monkeypatch)
    costs_file.parent.mkdir(parents=True)
    costs_file.write_text('{"format": "comfyui-scd window co')  # cut off
    with caplog.at_level(logging.WARNING):
        generate(grid(), None, SamplerConfig(window="auto", seed=0))
        assert len(measured) == 1  # timed: nothing was recalled
        assert len(json.loads(costs_file.read_text())["models"]) == 1  # replaced by what the run learned
        generate(grid(), None, SamplerConfig(window="auto", seed=1))
    assert len(measured) == 1  # the next model recalled it
    assert len(saved_warnings(caplog)) == 1 and "unreadable" in saved_warnings(caplog)[0]


@pytest.mark.parametrize("content", [
    {"format": "another tool's costs", "version": 1, "models": {}},
    {"format": window_memory.FORMAT, "version": window_memory.VERSION + 1, "models": {}},
    [1, 2, 3],
])
def test_a_foreign_file_is_ignored_with_one_warning_and_left_alone(costs_file, monkeypatch, caplog, content):
    measured = timings(monkeypatch)
    costs_file.parent.mkdir(parents=True)
    costs_file.write_text(json.dumps(content))
    with caplog.at_level(logging.WARNING):
        for seed in range(2):
            generate(grid(), None, SamplerConfig(window="auto", seed=seed))
        window_memory.save()
    assert len(measured) == 2
    assert len(saved_warnings(caplog)) == 1 and "left alone" in saved_warnings(caplog)[0]
    assert json.loads(costs_file.read_text()) == content


@pytest.mark.parametrize("entry", [
    {"costs": {"1": -0.01}, "compared": [], "hazard": 0.2},
    {"costs": {"1": 0.01}, "compared": [4], "hazard": 0.2},
    {"costs": {"1": 0.01}, "compared": [], "hazard": 7},
    {"costs": {"one": 0.01}, "compared": [], "hazard": None},
    {"costs": {"1": 0.01}},
])
def test_a_malformed_entry_is_ignored_with_one_warning(costs_file, caplog, entry):
    model = grid()
    key = auto_window.cost_key(model, 1)
    costs_file.parent.mkdir(parents=True)
    name = f"{window_memory.model_identity(model)} {json.dumps(list(key))}"
    costs_file.write_text(json.dumps({"format": window_memory.FORMAT, "version": window_memory.VERSION,
                                      "models": {name: entry}}))
    with caplog.at_level(logging.WARNING):
        assert auto_window.recalled_costs(model, key) is None
        assert auto_window.recalled_costs(model, key) is None
    assert len(saved_warnings(caplog)) == 1 and "malformed entry" in saved_warnings(caplog)[0]


def test_where_the_file_goes(costs_file, tmp_path, monkeypatch):
    monkeypatch.setenv(window_memory.ENV, "off")
    model = grid()
    generate(model, None, SamplerConfig(window="auto", seed=1))
    assert window_memory.costs_file() is None and not window_memory._tracked
    monkeypatch.delenv(window_memory.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert window_memory.costs_file() == tmp_path / "xdg" / "comfyui-scd" / window_memory.FILE_NAME
    window_memory.set_folder(tmp_path / "comfy_user" / "comfyui-scd")  # as nodes/ does under ComfyUI
    assert window_memory.costs_file() == tmp_path / "comfy_user" / "comfyui-scd" / window_memory.FILE_NAME
