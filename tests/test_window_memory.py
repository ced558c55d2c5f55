"""The automatic window's costs saved for the next process (scd_core.windows.window_memory): a run saves what it learned
when it finishes; a new process (a subprocess, or a new model object in this one) starts from the saved costs
without timing calls, its first call at the width they make best; writers merge; a corrupt file is ignored with
one warning and replaced, a foreign or unreadable one ignored with one warning and left alone; "off" reads and
writes nothing; under ComfyUI the file goes to the folder the nodes set (tests/test_nodes.py).  Every file here
is under tmp_path."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scd_core import SamplerConfig, generate, generate_many
from scd_core.windows import auto_window, window_memory
from scd_core.bench.synthetic import GridModel

COSTS = {1: 0.010, 2: 0.011, 4: 0.012, 8: 0.015, 16: 0.02, 32: 0.03}


@pytest.fixture
def costs_file(tmp_path, monkeypatch) -> Path:
    """A file of this test's own, and the module's per-process state reset."""
    path = tmp_path / "cache" / window_memory.FILE_NAME
    monkeypatch.setenv(window_memory.ENV, str(path))
    monkeypatch.setattr(window_memory, "_tracked", {})
    monkeypatch.setattr(window_memory, "_written", {})
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
        generate(first, None, SamplerConfig(window="auto", seed=seed))  # each saves when it finishes
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


@pytest.mark.parametrize("content", [b'{"format": "comfyui-scd window co', b"\xff\xfe\x00garbage"])  # cut off; not text
def test_a_corrupt_file_is_ignored_with_one_warning_and_replaced(costs_file, monkeypatch, caplog, content):
    measured = timings(monkeypatch)
    costs_file.parent.mkdir(parents=True)
    costs_file.write_bytes(content)
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
    name = window_memory.entry_name(model, key)
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


def test_an_unreadable_file_is_ignored_with_one_warning_and_left_alone(costs_file, monkeypatch, caplog):
    measured = timings(monkeypatch)
    costs_file.mkdir(parents=True)  # what cannot be read as a file (root reads any file, whatever its mode)
    with caplog.at_level(logging.WARNING):
        results = [generate(grid(), None, SamplerConfig(window="auto", seed=seed)) for seed in range(2)]
        window_memory.save()
    assert all(result.tokens.shape == (1, 48) for result in results) and len(measured) == 2
    assert len(saved_warnings(caplog)) == 1 and "cannot be read" in saved_warnings(caplog)[0]
    assert costs_file.is_dir() and not any(costs_file.iterdir())


def test_writers_merge_and_the_newest_learning_of_an_entry_wins(costs_file, monkeypatch):
    timings(monkeypatch)
    model = grid()
    key = auto_window.cost_key(model, 1)
    other_process = {"costs": {"1": 0.5, "2": 0.6}, "compared": [1], "hazard": 0.25, "saved": 1.0}
    stale_own = {**other_process, "hazard": 0.75}
    costs_file.parent.mkdir(parents=True)
    costs_file.write_text(json.dumps({"format": window_memory.FORMAT, "version": window_memory.VERSION,
                                      "models": {"another model's entry": other_process,
                                                 window_memory.entry_name(model, key): stale_own}}))
    generate(model, None, SamplerConfig(window="auto", seed=0))
    saved = json.loads(costs_file.read_text())["models"]
    assert saved["another model's entry"] == other_process  # kept as the other process wrote it
    assert saved[window_memory.entry_name(model, key)]["hazard"] == auto_window._COSTS[model][key].hazard != 0.75


def test_an_entry_learned_nothing_new_for_is_not_written_over_another_process_s(costs_file, monkeypatch):
    timings(monkeypatch)
    model = grid()
    generate(model, None, SamplerConfig(window="auto", seed=0))
    data = json.loads(costs_file.read_text())
    (name,) = data["models"]
    data["models"][name]["hazard"] = 0.125  # another process learned since
    costs_file.write_text(json.dumps(data))
    window_memory.save()  # as at exit, nothing learned since the run's save
    assert json.loads(costs_file.read_text())["models"][name]["hazard"] == 0.125
    generate(model, None, SamplerConfig(window="auto", seed=1))  # learns: its entry is the newest learning
    assert json.loads(costs_file.read_text())["models"][name]["hazard"] != 0.125


# A process of its own: a grid model whose calls take PROFILE[width] x 4 ms on the automatic window's clock (a
# clock of its own that only the calls move, so that what the process learns is the profile's whatever else runs
# here) makes `images` automatic images; it prints the number of timed passes, each image's first width, and the
# first width the costs it recalled make best (None: it recalled none).
PROCESS = textwrap.dedent('''
    import json, sys
    from scd_core import SamplerConfig, generate
    from scd_core.windows import auto_window
    from scd_core.bench.auto_persist import ProfileClock
    from scd_core.bench.synthetic import GridModel

    PROFILE = {1: 1.0, 2: 1.3, 4: 1.7, 8: 2.5, 16: 4.0, 32: 7.0}  # a steep profile: cold (S = 1), 32 looks best

    rows, cols, images = map(int, sys.argv[1:])
    model = GridModel(rows=rows, cols=cols, vocab_size=64, sharpness=0.5)
    ProfileClock(PROFILE, unit=0.004).install(model)
    key = auto_window.cost_key(model, 1)
    recalled = auto_window.recalled_costs(model, key)
    expected = None
    if recalled is not None:  # the width a fresh chooser on the recalled costs picks first (its clock at 1)
        widths = auto_window.candidate_widths(model.num_tokens)
        expected = auto_window.WindowChooser(recalled, widths, 1).choose(model.num_tokens - 1)
    timed = []
    measure = auto_window.measure_costs
    auto_window.measure_costs = lambda call, widths: timed.append(widths) or measure(call, widths)
    first = [generate(model, None, SamplerConfig(window="auto", seed=seed)).windows[1] for seed in range(images)]
    print(json.dumps({"timed": len(timed), "first": first, "expected": expected}))
''')


def process(path: Path, rows: int, cols: int, images: int) -> subprocess.Popen:
    """PROCESS in a fresh interpreter, its saved costs in `path`."""
    env = {**os.environ, window_memory.ENV: str(path)}
    root = Path(__file__).resolve().parents[1]
    return subprocess.Popen([sys.executable, "-c", PROCESS, str(rows), str(cols), str(images)], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(running: subprocess.Popen) -> dict:
    out, err = running.communicate(timeout=300)
    assert running.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_a_new_process_starts_at_the_width_the_last_one_learned_is_best(costs_file):
    cold = finished(process(costs_file, 6, 8, 4))
    assert cold["timed"] == 1 and cold["expected"] is None
    assert cold["first"][0] == 32  # cold (no counts yet, S = 1), the widest the steep profile still favours
    warm = finished(process(costs_file, 6, 8, 2))
    assert warm["timed"] == 0  # no timed pass: it recalled the costs
    assert warm["first"][0] == warm["expected"] < 32  # the learned best, not the cold start's width


def test_two_processes_writing_at_once_keep_both_entries(costs_file):
    runs = [process(costs_file, 6, 8, 6), process(costs_file, 6, 6, 6)]  # two models, one file, at the same time
    assert all(finished(run)["timed"] == 1 for run in runs)
    names = list(json.loads(costs_file.read_text())["models"])
    assert len(names) == 2 and sum(" 48 (6, 8) " in name for name in names) == 1
    assert not list(costs_file.parent.glob("*.partial"))


def test_a_stream_of_jobs_saves_when_it_finishes(costs_file, monkeypatch):
    timings(monkeypatch)
    model = grid()
    jobs = [(None, seed) for seed in range(3)]
    done = list(generate_many(model, jobs, SamplerConfig(window="auto", coupler="faithful"), slots=2))
    assert len(done) == 3
    saved = json.loads(costs_file.read_text())["models"]  # the stream's calls are of 2 rows
    assert list(saved) == [window_memory.entry_name(model, auto_window.cost_key(model, 2))]


def test_the_persistence_benchmark_warms_up_uncounted_and_takes_each_window_s_median_round(costs_file, monkeypatch):
    """`bench auto-persist`'s process on the profile clock: an uncounted pinned image first (so the first automatic
    image still times the widths), each seed's rounds reduced to their median, the first image its first round."""
    from scd_core.bench.auto import PINNED
    from scd_core.bench.auto_persist import one_process

    monkeypatch.setattr(auto_window, "time", auto_window.time)  # the profile clock replaces it
    monkeypatch.setattr(auto_window, "measure_costs", auto_window.measure_costs)  # counted by one_process
    run = one_process(2, True, True, 3)  # the burst on the profile clock: no busy loop
    assert run["timed"] == 1 and len(run["used"]) == 2 * 3
    assert all(len(run["seconds"][w]) == len(run["calls"][w]) == 2 for w in run["seconds"])
    # a pinned window makes the same calls in every round (faithful), so its rounds cost the same on the profile clock
    for window in PINNED:
        seconds, calls = run["seconds"][str(window)][0], run["calls"][str(window)][0]
        assert run["first"][str(window)] == pytest.approx((seconds, calls))
    # the first automatic image paid the timed pass; the median of its seed's rounds did not
    assert run["first"]["auto"][0] > run["seconds"]["auto"][0]
    assert run["first"]["auto"][1] == len(run["used"][0])
