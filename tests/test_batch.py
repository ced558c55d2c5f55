"""`python -m scd_core batch` on the demo model: bad lines among good ones, a settings change refused, lost or
cut-off files made again, the command killed and resumed, and a real Ray local cluster (two worker actors, one
of them SIGKILLed) inside a network namespace with only loopback, byte for byte against the in-process run."""

from __future__ import annotations

import json
import os
import signal
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from ray_sandbox import run_sandboxed

from scd_core import ModelOutputError, SamplerConfig, generate, load_model
from scd_core.frontends.batch_job import MANIFEST, RAY_EXTRA, RUN_FILE, Job, Renderer, png_bytes, png_in_place
from scd_core.frontends.cli import main

REPO = Path(__file__).resolve().parents[1]
SETTINGS = ("--model", "demo", "--device", "cpu", "--window", "16", "--slots", "2")
# 7 images: three and five at seeds 0, 1, 2 (--seeds), seven at its own seed
JOBS = [{"id": "three", "prompt": "3"}, {"id": "seven", "prompt": "7", "seed": 11}, {"id": "five", "prompt": "5"}]
SEEDS = ("--seeds", "0,1,2")
IMAGES = {f"three-s{s}.png" for s in (0, 1, 2)} | {f"five-s{s}.png" for s in (0, 1, 2)} | {"seven-s11.png"}
WAIT_S = 300


def write_jobs(path: Path, lines: list) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def batch(capsys: pytest.CaptureFixture, jobs: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    code = main(["batch", str(jobs), *SETTINGS, "--out", str(out), *extra])
    printed, errors = capsys.readouterr()
    return code, printed, errors


def manifest(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / MANIFEST).read_text().splitlines()]


def images(out: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in out.glob("*.png")}


def assert_each_image_once(out: Path) -> None:
    entries = manifest(out)
    assert sorted(entry["file"] for entry in entries) == sorted(IMAGES)
    assert all(entry["status"] == "ok" and entry["nfe"] > 0 for entry in entries)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The images of JOBS made in one in-process run, nothing in the way."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    jobs = write_jobs(folder / "jobs.jsonl", JOBS)
    code = main(["batch", str(jobs), *SETTINGS, *SEEDS, "--out", str(folder / "out")])
    assert code == 0
    assert_each_image_once(folder / "out")
    return images(folder / "out")


def encode_error(model: Any, prompt: str) -> str:
    with pytest.raises(ValueError) as error:
        model.encode(prompt)
    return str(error.value)


def test_bad_lines_are_reported_and_every_other_image_is_made(tmp_path, capsys):
    jobs = write_jobs(tmp_path / "jobs.jsonl", [
        {"id": "four", "prompt": "4", "seed": 5},
        {"id": "twelve", "prompt": "12", "seed": 0},     # the demo's classes are 0..9
        {"id": "blank", "prompt": "  ", "seed": 0},
        {"id": "word", "prompt": "seven", "seed": 0},    # a class model cannot encode a word
        '{"id": "cut", "prompt": "1"',
        {"id": "one", "prompt": "1", "seed": 2},
        {"id": "Four", "prompt": "4", "seed": 5},        # the same file twice where case is ignored
        {"id": "../up", "prompt": "1", "seed": 0},       # not a file name
    ])
    code, printed, errors = batch(capsys, jobs, tmp_path / "out")
    assert code == 1, errors
    entries = {entry["line"]: entry for entry in manifest(tmp_path / "out")}
    assert sorted(entries) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [entries[line]["status"] for line in (1, 6)] == ["ok", "ok"]
    model = load_model("demo", "cpu")
    expected_errors = {2: f"ValueError: {encode_error(model, '12')}", 3: "prompt must be a non-empty string",
                       4: f"ValueError: {encode_error(model, 'seven')}", 5: "not JSON", 7: "is line 1 already",
                       8: "id must be letters"}
    for line, error in expected_errors.items():
        assert entries[line]["status"] == "failed" and entries[line]["file"] is None
        assert error in entries[line]["error"]
        assert f"failed: line {line}" in printed
    assert "2 images made, 0 already in place, 6 failed" in printed
    # where no progress bar draws (here: stderr is captured, as in a log) each image says it arrived
    logged = [line for line in errors.splitlines() if line.startswith("batch: ")]
    assert len(logged) == 8 and logged[-1].endswith("(8 of 8)")
    assert any(re.fullmatch(r"batch: four-s5\.png: \d+ model calls, [\d.]+ s \(\d of 8\)", line) for line in logged)
    assert any(line.startswith("batch: line 2 failed: ValueError") for line in logged)
    in_folder = sorted(path.name for path in (tmp_path / "out").iterdir())
    assert in_folder == sorted([MANIFEST, "four-s5.png", "one-s2.png", RUN_FILE])  # no partial file left

    # each image is what generate samples with its seed
    result = generate(model, model.encode("1"), SamplerConfig(window=16, seed=2))
    assert (tmp_path / "out" / "one-s2.png").read_bytes() == png_bytes(model, result.tokens)
    assert entries[6]["nfe"] == result.nfe
    assert "ray" not in sys.modules  # only --ray imports it


class BreaksOnClass:
    """The demo model, whose sampling breaks for one class (as a NaN in its logits would): a job that fails
    after generate_many has taken it."""

    def __init__(self, model: Any, broken: int) -> None:
        self.model, self.broken = model, broken

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def start(self, cond: Any, batch_size: int) -> Any:
        if cond.index == self.broken:
            raise ModelOutputError(f"class {self.broken} breaks")
        return self.model.start(cond, batch_size)


def test_a_job_that_breaks_the_stream_fails_alone():
    model = load_model("demo", "cpu")
    config = SamplerConfig(window=16)
    jobs = [Job(1, "a", 0, "3"), Job(2, "b", 0, "4"), Job(3, "c", 0, "x"), Job(4, "d", 1, "5"),
            Job(5, "e", 2, "4")]
    rendered = list(Renderer(BreaksOnClass(model, 4), config, 2).render(jobs))
    assert sorted(file for file, _, _ in rendered) == sorted(job.file for job in jobs)  # each job once
    results = {file: (entry, png) for file, entry, png in rendered}
    assert {file: entry["status"] for file, (entry, _) in results.items()} == {
        "a-s0.png": "ok", "b-s0.png": "failed", "c-s0.png": "failed", "d-s1.png": "ok", "e-s2.png": "failed"}
    assert results["b-s0.png"][0]["error"] == "ModelOutputError: class 4 breaks"
    assert results["c-s0.png"][0]["error"] == f"ValueError: {encode_error(model, 'x')}"
    for job in (jobs[0], jobs[3]):  # the others are generate's images with their seeds
        tokens = generate(model, model.encode(job.prompt), SamplerConfig(window=16, seed=job.seed)).tokens
        assert results[job.file][1] == png_bytes(model, tokens)


def test_a_run_with_other_settings_is_refused(tmp_path, capsys):
    jobs = write_jobs(tmp_path / "jobs.jsonl", JOBS[1:2])
    out = tmp_path / "out"
    assert batch(capsys, jobs, out)[0] == 0
    before = {path.name: path.read_bytes() for path in out.iterdir()}

    code, _, errors = batch(capsys, jobs, out, "--window", "8", "--cfg", "3")
    assert code == 2
    assert "holds images made with other settings" in errors
    assert "sampler.window 16 there, 8 now" in errors and "sampler.cfg_scale None there, 3.0 now" in errors
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before

    code, printed, errors = batch(capsys, jobs, out, "--slots", "5")  # slots do not change an image
    assert code == 0, errors
    assert "0 images made, 1 already in place" in printed


def test_a_run_that_cannot_start_leaves_no_folder(tmp_path, capsys, monkeypatch):
    jobs = write_jobs(tmp_path / "jobs.jsonl", JOBS[:1] + ["not json"])
    code = main(["batch", str(jobs), "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "out")])
    assert code == 2
    assert "model folder" in capsys.readouterr().err and not (tmp_path / "out").exists()
    code = main(["batch", str(jobs), "--model", "demo", "--out", str(tmp_path / "out"), "--workers", "2"])
    assert code == 2
    assert "--workers and --gpus-per-worker are for --ray" in capsys.readouterr().err
    code = main(["batch", str(jobs), "--model", "demo", "--out", str(tmp_path / "out"), "--window", "auto",
                 "--coupler", "maximal"])
    assert code == 2
    error = capsys.readouterr().err
    assert "needs a pinned window" in error and "faithful" in error and not (tmp_path / "out").exists()
    monkeypatch.setitem(sys.modules, "ray", None)  # as where Ray is not installed
    code = main(["batch", str(jobs), "--model", "demo", "--out", str(tmp_path / "out"), "--ray"])
    assert code == 2
    assert RAY_EXTRA in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_jobs_file_that_cannot_be_read_is_one_line_naming_it(tmp_path, capsys):
    (tmp_path / "binary.jsonl").write_bytes(b'{"id": "a", "prompt": "7"}\n\xff\xfe\n')
    for jobs, problem in ((tmp_path / "missing.jsonl", "does not exist"), (tmp_path, "cannot be read (Is a directory)"),
                          (tmp_path / "binary.jsonl", "is not UTF-8 text (byte 27)")):
        code, printed, errors = batch(capsys, jobs, tmp_path / "out")
        assert (code, printed, errors) == (2, "", f"error: jobs file {jobs} {problem}\n")
        assert not (tmp_path / "out").exists()


def test_a_cut_off_or_missing_png_is_made_again(tmp_path, capsys):
    jobs = write_jobs(tmp_path / "jobs.jsonl", JOBS[:1])
    out = tmp_path / "out"
    assert batch(capsys, jobs, out, *SEEDS)[0] == 0
    first = images(out)
    whole = out / "three-s0.png"
    untouched = whole.stat()
    data = first["three-s1.png"]
    for cut in (data[:len(data) // 2], data[:-12]):  # half the file; only the end chunk gone
        (out / "three-s1.png").write_bytes(cut)
        assert not png_in_place(out / "three-s1.png")
    (out / "three-s2.png").unlink()
    manifest_text = (out / MANIFEST).read_text()
    (out / MANIFEST).write_text(manifest_text + '{"id": "three", "seed": 2, "fi')  # a line cut by a kill

    code, printed, errors = batch(capsys, jobs, out, *SEEDS)
    assert code == 0, errors
    assert "2 images made, 1 already in place, 0 failed" in printed
    assert images(out) == first
    assert whole.stat().st_mtime_ns == untouched.st_mtime_ns and whole.stat().st_ino == untouched.st_ino
    assert sorted(entry["file"] for entry in manifest(out)) == sorted(first)


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def ok_lines(out: Path) -> int:
    path = out / MANIFEST
    return path.read_text().count('"status": "ok"') if path.is_file() else 0


def test_the_command_killed_mid_run_resumes_to_the_same_bytes(uninterrupted, tmp_path, capsys):
    jobs = write_jobs(tmp_path / "jobs.jsonl", JOBS)
    out = tmp_path / "out"
    command = subprocess.Popen([sys.executable, "-m", "scd_core", "batch", str(jobs), *SETTINGS, *SEEDS,
                                "--out", str(out)], cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: ok_lines(out) >= 1 or command.poll() is not None, "the first image")
        command.send_signal(signal.SIGKILL)
    finally:
        command.kill()
        errors = command.communicate()[1].decode()
    assert command.returncode == -signal.SIGKILL, errors
    in_place = ok_lines(out)
    assert 1 <= in_place < len(IMAGES), "the kill came after the run had finished"

    code, printed, errors = batch(capsys, jobs, out, *SEEDS)
    assert code == 0, errors
    assert f"{len(IMAGES) - in_place} images made, {in_place} already in place, 0 failed" in printed
    assert images(out) == uninterrupted
    assert_each_image_once(out)


def test_ray_local_cluster_with_a_worker_killed_makes_the_in_process_bytes(uninterrupted, tmp_path):
    """Two worker actors on a real local cluster; one is SIGKILLed after the first image, Ray restarts it."""
    jobs = write_jobs(tmp_path / "jobs.jsonl", JOBS)
    out = tmp_path / "out"
    run = run_sandboxed([sys.executable, str(REPO / "tests" / "ray_batch_kill.py"), str(out), str(jobs), *SETTINGS,
                         *SEEDS], REPO, WAIT_S)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    killed = json.loads(run.stdout.split("KILLED ", 1)[1].splitlines()[0])
    assert killed["pid"] is not None and len(killed["workers"]) == 2, run.stdout
    assert killed["manifest_lines"] < len(IMAGES), "the kill came after the run had finished"
    assert_each_image_once(out)
    assert images(out) == uninterrupted


def test_the_tested_ray_range_is_the_one_the_project_offers():
    import tomllib

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["ray"]
    tested = [line.split("#")[0].strip() for line in (REPO / "tests" / "requirements.txt").read_text().splitlines()
              if line.startswith("ray")]
    assert extra == tested
    assert f"'{extra[0]}'" in RAY_EXTRA and f"'{extra[0]}'" in (REPO / "README.md").read_text()
