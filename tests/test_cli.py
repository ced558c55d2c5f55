"""The command line, run in-process through `main(argv)` on the tiny Janus folder and the demo model."""

from __future__ import annotations

import io
import re
import statistics
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from janus_fixture import IMAGE_SIZE
from scd_core import SamplerConfig, generate, load_model
from scd_core.config import MAX_SEED
from scd_core.cli import CAPTION_SIZE, LINE_HEIGHT, MIN_PANEL, PADDING, SHOWN_SEEDS, commit_histogram, main

TINY_TOKENS = 16  # the tiny Janus grid is 4 x 4
COMPARE_LABELS = ("AR", "SCD-faithful", "SJD", "SCD-maximal", "SCD-gumbel")


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


class TerminalStream(io.StringIO):
    """stderr as a terminal: the progress bar draws itself only there."""

    def isatty(self) -> bool:
        return True


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

    nfe = int(re.search(r"(\d+) model calls for 16 tokens", out).group(1))
    assert nfe == result.nfe
    assert f"{TINY_TOKENS / nfe:.2f}x fewer calls" in out
    assert histogram_total(out) == nfe
    assert re.search(r"prefill [\d.]+ s, forward [\d.]+ s, sampling [\d.]+ s, decode [\d.]+ s", out)
    assert f"{TINY_TOKENS}/{TINY_TOKENS}" not in err  # no progress bar where stderr is not a terminal (a log)


def test_progress_bar_draws_on_a_terminal(tiny_janus_dir, tmp_path, monkeypatch, capsys):
    terminal = TerminalStream()
    monkeypatch.setattr(sys, "stderr", terminal)
    code = main(["generate", "--model", str(tiny_janus_dir), "--prompt", "a red cube", "--window", "4",
                 "--device", "cpu", "-o", str(tmp_path / "out.png")])
    assert code == 0, terminal.getvalue()
    nfe = int(re.search(r"(\d+) model calls for 16 tokens", capsys.readouterr().out).group(1))
    last = terminal.getvalue().split("\r")[-1]  # tqdm redraws one line in place
    assert f"{TINY_TOKENS}/{TINY_TOKENS}" in last and f"{nfe} calls" in last and "100%" in last


def compare_rows(out: str) -> dict[str, list[str]]:
    assert out.splitlines()[0].split() == ["mode", "window", "calls", "sd", "range", "speedup", "acceptance",
                                           "wall", "s"]
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:] if line.split()[0] in COMPARE_LABELS}
    assert set(rows) == set(COMPARE_LABELS)
    return rows


def sheet_height(title_lines: int, seeds: int, batch: int = 1) -> int:
    """--compare's picture: title and a two-line caption over each seed's batch (enlarged to MIN_PANEL),
    the seeds PADDING apart."""
    return 2 * PADDING + LINE_HEIGHT * (title_lines + 2) + seeds * batch * MIN_PANEL + (seeds - 1) * PADDING


def test_quantize_int8_generates_what_the_library_does(tiny_janus_dir, tmp_path, capsys):
    output = tmp_path / "int8.png"
    code, out, err = run_cli(capsys, "generate", "--model", tiny_janus_dir, "--prompt", "a red cube", "--window", 4,
                             "--seed", 3, "--device", "cpu", "--dtype", "float32", "--quantize", "int8", "-o", output)
    assert code == 0, err
    model = load_model(tiny_janus_dir, "cpu", "float32", quantize="int8")
    result = generate(model, model.encode("a red cube"), SamplerConfig(window=4, seed=3))
    expected = (model.decode(result.tokens).clamp(0, 1) * 255).round().byte().numpy()
    assert np.array_equal(np.asarray(Image.open(output)), expected[0])


def test_compare_writes_one_panel_per_mode_and_a_table(tiny_janus_dir, tmp_path, capsys):
    output = tmp_path / "compare.png"
    code, out, err = run_cli(capsys, "generate", "--model", tiny_janus_dir, "--prompt", "a red cube",
                             "--window", 6, "--batch-size", 2, "--compare", "-o", output)
    assert code == 0, err
    width, height = Image.open(output).size
    assert height == sheet_height(1, 1, batch=2)  # the batch stacked under each caption
    assert width >= len(COMPARE_LABELS) * MIN_PANEL

    rows = compare_rows(out)
    assert rows["AR"][1:6] == ["1", str(TINY_TOKENS), "-", "-", "1.00x"]
    assert rows["AR"][6] == "-"  # AR verifies no drafts
    for label in COMPARE_LABELS[1:]:
        window, nfe, speedup = int(rows[label][1]), int(rows[label][2]), rows[label][5]
        assert window == 6 and 1 <= nfe <= TINY_TOKENS and speedup == f"{TINY_TOKENS / nfe:.2f}x"
        assert rows[label][6].endswith("%")


def test_compare_over_seeds_reports_the_mean_and_spread_of_each_method(tiny_janus_dir, tmp_path, capsys):
    output = tmp_path / "compare.png"
    code, out, err = run_cli(capsys, "generate", "--model", tiny_janus_dir, "--prompt", "a red cube",
                             "--window", 4, "--seed", 5, "--seeds", 3, "--compare", "-o", output)
    assert code == 0, err
    model = load_model(tiny_janus_dir, "cpu")
    cond = model.encode("a red cube")
    rows = compare_rows(out)
    for label, coupler, window in (("SJD", "independent", 4), ("SCD-maximal", "maximal", 4),
                                   ("SCD-gumbel", "gumbel", 4), ("AR", "faithful", 1), ("SCD-faithful", "faithful", 4)):
        calls = [generate(model, cond, SamplerConfig(coupler=coupler, window=window, seed=seed)).nfe
                 for seed in (5, 6, 7)]
        mean = statistics.fmean(calls)
        assert rows[label][1:6] == [str(window), f"{mean:.1f}", f"{statistics.stdev(calls):.1f}",
                                    f"{min(calls)}-{max(calls)}", f"{TINY_TOKENS / mean:.2f}x"], label
    assert f"Same image from AR and SCD-faithful on 3 of 3 seeds: 16.0 against {rows['SCD-faithful'][2]} calls" in out
    # one image per shown seed, under a two-line title (what is averaged, which seeds are shown)
    assert Image.open(output).size[1] == sheet_height(2, SHOWN_SEEDS)


def test_compare_sheet_leaves_room_for_its_captions(tmp_path, capsys):
    """The demo's 64 px digits are enlarged, and each caption's text stays inside its own column."""
    output = tmp_path / "compare.png"
    code, out, err = run_cli(capsys, "generate", "--model", "demo", "--prompt", "7", "--window", 32,
                             "--seeds", 2, "--compare", "-o", output)
    assert code == 0, err
    sheet = np.asarray(Image.open(output).convert("L"))
    assert sheet.shape[1] >= len(COMPARE_LABELS) * (MIN_PANEL + 2 * PADDING)
    caption = sheet[PADDING + 2 * LINE_HEIGHT:PADDING + 4 * LINE_HEIGHT]
    ink = (caption < 128).any(axis=0)
    column = sheet.shape[1] // len(COMPARE_LABELS)
    for i in range(1, len(COMPARE_LABELS)):  # blank between the columns' captions
        assert not ink[i * column - 2:i * column + 2].any()
    rows = np.nonzero((caption < 128).any(axis=1))[0]
    assert rows.max() - rows.min() + 1 >= CAPTION_SIZE  # two lines of text, each readable


def test_demo_model_decodes_in_fewer_calls_than_ar(tmp_path, capsys):
    from scd_core.bench.train_demo import IMAGE_SIZE as DEMO_SIZE

    output = tmp_path / "demo.png"
    code, out, err = run_cli(capsys, "generate", "--model", "demo", "--prompt", "7", "--coupler", "maximal",
                             "--window", 16, "--seed", 0, "-o", output)
    assert code == 0, err
    assert Image.open(output).size == (DEMO_SIZE, DEMO_SIZE)
    nfe = int(re.search(r"(\d+) model calls for 256 tokens", out).group(1))
    assert nfe < 256 and histogram_total(out) == nfe


@pytest.mark.parametrize("window", ["auto", "0"])  # 0 is auto, as in the sampler node
def test_window_auto_reports_the_widths_it_chose(window, tmp_path, capsys):
    code, out, err = run_cli(capsys, "generate", "--model", "demo", "--prompt", "2", "--window", window,
                             "-o", tmp_path / "auto.png")
    assert code == 0, err
    widths = re.search(r"window auto \(([^)]*)\)", out).group(1)  # "40 calls at width 64, 5 at width 8"
    parts = [re.fullmatch(r"(\d+)(?: calls)? at width (\d+)", part) for part in widths.split(", ")]
    assert all(parts) and widths.split(", ")[0].split()[1] == "calls"
    nfe = int(re.search(r"(\d+) model calls for 256 tokens", out).group(1))
    assert sum(int(part.group(1)) for part in parts) == nfe - 1  # every call but the prefill


def test_a_window_wider_than_the_image_is_reported_as_the_width_used(tiny_janus_dir, tmp_path, capsys):
    code, out, err = run_cli(capsys, "generate", "--model", tiny_janus_dir, "--prompt", "a red cube",
                             "--window", 64, "-o", tmp_path / "wide.png")
    assert code == 0, err
    model = load_model(tiny_janus_dir, "cpu")
    used = max(generate(model, model.encode("a red cube"), SamplerConfig(window=64)).windows)
    assert used <= TINY_TOKENS and f"window {used} (set to 64: wider than the image)" in out


def test_settings_far_from_the_model_s_warn_but_run(tiny_janus_dir, tmp_path, capsys):
    code, out, err = run_cli(capsys, "generate", "--model", tiny_janus_dir, "--prompt", "a red cube",
                             "--cfg", 20, "--temperature", 2.5, "-o", tmp_path / "far.png")
    assert code == 0, err
    assert "warning: CFG 20 is far above this model's 5" in err  # Janus-Pro's CFG 5, times 3 at most
    assert "warning: temperature 2.5 is far above this model's 1" in err
    code, out, err = run_cli(capsys, "generate", "--model", tiny_janus_dir, "--prompt", "a red cube",
                             "--cfg", 15, "--temperature", 2, "-o", tmp_path / "near.png")
    assert code == 0 and "warning" not in err


def test_commit_histogram_buckets_by_powers_of_two():
    lines = commit_histogram([1, 1, 2, 3, 5, 4, 17, 1]).splitlines()
    counts = [(line.split("tokens")[0].strip(), int(line.split()[-1])) for line in lines]
    assert counts == [("1", 3), ("2-3", 2), ("4-7", 2), ("8-15", 0), ("16-31", 1)]
    bars = [line.count("#") for line in lines]
    assert bars[0] == max(bars) and bars[3] == 0 and 0 < bars[4] < bars[1]


@pytest.mark.parametrize("argv,message", [
    (["--model", "{missing}"], "not found"),
    (["--model", "{empty}"], "is not a model folder"),
    (["--model", "{tmp}/Janus-Pro-1B"], "download the Hugging Face repository deepseek-community/Janus-Pro-1B"),
    (["--window", "-1"], "window must be 'auto' or an integer in 1..1024"),
    (["--window", "two"], "--window: must be 'auto' (or 0) or an integer"),
    (["--seeds", "4"], "--seeds goes with --compare"),
    (["--compare", "", "--seeds", "2", "--seed", "{max_seed}"], "seed must be an integer in 0.."),
    (["--model", "demo", "--prompt", "cat"], "takes one of its classes (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)"),
    (["--model", "demo", "--prompt", "3", "--width", "64", "--height", "64"], "one image size only"),
    (["--width", "64"], "give both --width and --height"),
    (["--width", "-8", "--height", "8"], "--width: must be a pixel count"),
    (["--coupler", "greedy"], "--coupler: invalid choice"),
    (["--top-p", "1.5"], "top_p must be"),
    (["--cfg", "-2"], "cfg_scale must be"),
    (["--batch-size", "0"], "--batch-size"),
    (["--dtype", "int3"], "dtype must be one of"),
    (["--quantize", "int4"], "--quantize: invalid choice"),
    (["--device", "nonsense"], "--device"),
    (["-o", "{tmp}/out.jpg"], "must be a .png file"),
    (["-o", "{tmp}/no/such/folder/out.png"], "does not exist"),
])
def test_bad_input_exits_2_with_one_clear_line(argv, message, tiny_janus_dir, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    defaults = {"--model": str(tiny_janus_dir), "--prompt": "a cat", "-o": str(tmp_path / "out.png")}
    defaults.update(zip(argv[::2], argv[1::2]))
    args = [part.format(missing=tmp_path / "missing", empty=tmp_path / "empty", tmp=tmp_path, max_seed=MAX_SEED)
            for pair in defaults.items() for part in pair if part]
    code, out, err = run_cli(capsys, "generate", *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err
    assert "ImageNet" not in err
    assert not list(tmp_path.glob("**/*.png")) and not list(tmp_path.glob("**/*.jpg"))


def test_missing_required_option_is_named(capsys):
    code, _, err = run_cli(capsys, "generate", "--model", "demo", "-o", "x.png")
    assert code == 2 and "--prompt" in err and len(err.strip().splitlines()) == 1


def test_no_arguments_show_usage(capsys):
    code, out, err = run_cli(capsys)
    assert code == 2 and "usage:" in err and "generate" in err
    code, out, err = run_cli(capsys, "generate", "--help")
    assert code == 0 and "--coupler" in out and "--compare" in out
    help_text = " ".join(out.split())  # argparse wraps lines
    for shown in ("(default: faithful)", "(default: 32)", "(default: 1.0)", "(default: 0)", "(default: token)"):
        assert shown in help_text
    assert "(default: None)" not in help_text and "(default: False)" not in help_text


def test_module_entry_point_runs_main():
    done = subprocess.run([sys.executable, "-m", "scd_core", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "generate" in done.stdout


def test_compile_flag_loads_the_model_compiled(tmp_path, capsys):
    """--compile reaches load_model: the compiled demo then refuses a tree of candidates, before any call."""
    code, out, err = run_cli(capsys, "generate", "--model", "demo", "--prompt", "3", "--compile", "--coupler",
                             "maximal", "--candidates", 2, "-o", tmp_path / "compiled.png")
    assert code == 2 and "not available with a compiled model" in err and "Traceback" not in err
    assert not (tmp_path / "compiled.png").exists()
