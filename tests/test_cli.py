"""The command line, run in-process through `main(argv)` on the tiny Janus folder and the demo model."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from janus_fixture import IMAGE_SIZE
from scd_core import SamplerConfig, generate, load_model
from scd_core.cli import LABEL_HEIGHT, commit_histogram, main

TINY_TOKENS = 16  # the tiny Janus grid is 4 x 4
COMPARE_LABELS = ("AR", "SJD", "SCD-maximal", "SCD-gumbel")


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def histogram_total(out: str) -> int:
    """Iterations counted by the commit histogram lines ('  2-3 tokens | ### 5')."""
    return sum(int(m) for m in re.findall(r"tokens \| #+ (\d+)$", out, flags=re.MULTILINE))


def test_generate_writes_the_sampled_batch_side_by_side(tiny_janus_dir, tmp_path, capsys):
    output = tmp_path / "out.png"
    code, out, err = run_cli(capsys, "generate", "--model", tiny_janus_dir, "--prompt", "a red cube",
                             "--window", 4, "--seed", 3, "--batch-size", 2, "--device", "cpu", "-o", output)
    assert code == 0, err
    image = np.asarray(Image.open(output))
    assert image.shape == (IMAGE_SIZE, 2 * IMAGE_SIZE, 3)

    model = load_model(tiny_janus_dir, "cpu")
    result = generate(model, model.encode("a red cube"), SamplerConfig(window=4, seed=3), batch_size=2)
    expected = (model.decode(result.tokens).clamp(0, 1) * 255).round().byte().numpy()
    assert np.array_equal(image, np.concatenate(list(expected), axis=1))

    nfe = int(re.search(r"NFE (\d+) for 16 tokens", out).group(1))
    assert nfe == result.nfe
    assert f"speedup {TINY_TOKENS / nfe:.2f}x" in out
    assert histogram_total(out) == nfe
    assert re.search(r"prefill [\d.]+ s, forward [\d.]+ s, sampling [\d.]+ s, decode [\d.]+ s", out)
    assert f"[{'#' * 30}] {TINY_TOKENS}/{TINY_TOKENS} tokens" in err  # the progress bar reached the end


def test_compare_writes_one_panel_per_mode_and_a_table(tiny_janus_dir, tmp_path, capsys):
    output = tmp_path / "compare.png"
    code, out, err = run_cli(capsys, "generate", "--model", tiny_janus_dir, "--prompt", "a red cube",
                             "--window", 6, "--batch-size", 2, "--compare", "-o", output)
    assert code == 0, err
    width, height = Image.open(output).size
    assert height == LABEL_HEIGHT + 2 * IMAGE_SIZE  # the batch stacked under each label
    assert width >= len(COMPARE_LABELS) * IMAGE_SIZE

    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:] if line.split()[0] in COMPARE_LABELS}
    assert out.splitlines()[0].split()[:3] == ["mode", "window", "NFE"]
    assert set(rows) == set(COMPARE_LABELS)
    assert rows["AR"][1:5] == ["1", str(TINY_TOKENS), "1.00x", "1.00"]
    assert rows["AR"][5] == "-"  # AR verifies no drafts
    for label in COMPARE_LABELS[1:]:
        window, nfe, speedup = int(rows[label][1]), int(rows[label][2]), rows[label][3]
        assert window == 6 and 1 <= nfe <= TINY_TOKENS and speedup == f"{TINY_TOKENS / nfe:.2f}x"
        assert rows[label][5].endswith("%")


def test_demo_model_decodes_in_fewer_calls_than_ar(tmp_path, capsys):
    from scd_core.bench.train_demo import IMAGE_SIZE as DEMO_SIZE

    output = tmp_path / "demo.png"
    code, out, err = run_cli(capsys, "generate", "--model", "demo", "--prompt", "7", "--coupler", "maximal",
                             "--window", 16, "--seed", 0, "-o", output)
    assert code == 0, err
    assert Image.open(output).size == (DEMO_SIZE, DEMO_SIZE)
    nfe = int(re.search(r"NFE (\d+) for 256 tokens", out).group(1))
    assert nfe < 256 and histogram_total(out) == nfe


def test_window_auto_reports_the_widths_it_chose(tmp_path, capsys):
    code, out, err = run_cli(capsys, "generate", "--model", "demo", "--prompt", "2", "--window", "auto",
                             "-o", tmp_path / "auto.png")
    assert code == 0, err
    widths = re.search(r"window auto \(([^)]*)\)", out).group(1)
    nfe = int(re.search(r"NFE (\d+) for 256 tokens", out).group(1))
    assert sum(int(part.split(" x ")[1]) for part in widths.split(", ")) == nfe - 1  # every call but the prefill


def test_commit_histogram_buckets_by_powers_of_two():
    lines = commit_histogram([1, 1, 2, 3, 5, 4, 17, 1]).splitlines()
    counts = [(line.split("tokens")[0].strip(), int(line.split()[-1])) for line in lines]
    assert counts == [("1", 3), ("2-3", 2), ("4-7", 2), ("8-15", 0), ("16-31", 1)]
    bars = [line.count("#") for line in lines]
    assert bars[0] == max(bars) and bars[3] == 0 and 0 < bars[4] < bars[1]


@pytest.mark.parametrize("argv,message", [
    (["--model", "{missing}"], "not found"),
    (["--model", "{empty}"], "is not a model folder"),
    (["--window", "0"], "window must be 'auto' or an integer in 1..1024"),
    (["--window", "two"], "--window: must be 'auto' or an integer"),
    (["--model", "demo", "--prompt", "3", "--width", "64", "--height", "64"], "one image size only"),
    (["--width", "64"], "give both --width and --height"),
    (["--width", "-8", "--height", "8"], "--width: must be a pixel count"),
    (["--coupler", "greedy"], "--coupler: invalid choice"),
    (["--top-p", "1.5"], "top_p must be"),
    (["--cfg", "-2"], "cfg_scale must be"),
    (["--batch-size", "0"], "--batch-size"),
    (["--dtype", "int3"], "dtype must be one of"),
    (["--device", "nonsense"], "--device"),
    (["-o", "{tmp}/out.jpg"], "must be a .png file"),
    (["-o", "{tmp}/no/such/folder/out.png"], "does not exist"),
])
def test_bad_input_exits_2_with_one_clear_line(argv, message, tiny_janus_dir, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    defaults = {"--model": str(tiny_janus_dir), "--prompt": "a cat", "-o": str(tmp_path / "out.png")}
    defaults.update(zip(argv[::2], argv[1::2]))
    args = [part.format(missing=tmp_path / "missing", empty=tmp_path / "empty", tmp=tmp_path)
            for pair in defaults.items() for part in pair]
    code, out, err = run_cli(capsys, "generate", *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err
    assert not list(tmp_path.glob("**/*.png")) and not list(tmp_path.glob("**/*.jpg"))


def test_missing_required_option_is_named(capsys):
    code, _, err = run_cli(capsys, "generate", "--model", "demo", "-o", "x.png")
    assert code == 2 and "--prompt" in err and len(err.strip().splitlines()) == 1


def test_no_arguments_show_usage(capsys):
    code, out, err = run_cli(capsys)
    assert code == 2 and "usage:" in err and "generate" in err
    code, out, err = run_cli(capsys, "generate", "--help")
    assert code == 0 and "--coupler" in out and "--compare" in out


def test_module_entry_point_runs_main():
    done = subprocess.run([sys.executable, "-m", "scd_core", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "generate" in done.stdout


def test_compile_flag_loads_the_model_compiled(tmp_path, capsys):
    """--compile reaches load_model: the compiled demo then refuses a tree of candidates, before any call."""
    code, out, err = run_cli(capsys, "generate", "--model", "demo", "--prompt", "3", "--compile", "--candidates", 2,
                             "-o", tmp_path / "compiled.png")
    assert code == 2 and "not available with a compiled model" in err and "Traceback" not in err
    assert not (tmp_path / "compiled.png").exists()
