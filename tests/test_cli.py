"""The command line, run in-process through `main(argv)` on the tiny Janus folder and the demo model."""

from __future__ import annotations

import io
import re
import statistics
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from janus_fixture import IMAGE_SIZE
from mammothmoda2_fixture import tiny_preview_dir  # noqa: F401  (fixture)
from scd_core import SamplerConfig, generate, load_model
from scd_core.decoding.config import MAX_SEED
from scd_core.decoding.engine import GenerationResult
from scd_core.models.loading import DTYPES
from scd_core.frontends import cli
from scd_core.compiled import compiled_regions
from scd_core.decoding import couplers
from scd_core.bench import cli as bench
from scd_core.frontends.cli import (CAPTION_SIZE, LINE_HEIGHT, MIN_PANEL, PADDING, SHOWN_SEEDS, commit_histogram,
                                    compile_seconds, main)

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
    # the random tiny model may reject every draft: then the line says so instead of "1.00x fewer calls"
    assert (f"{TINY_TOKENS / nfe:.2f}x fewer calls" if nfe < TINY_TOKENS else
            "16 model calls for 16 tokens: one call per token, as plain AR sampling") in out
    assert histogram_total(out) == nfe
    assert re.search(r"prefill [\d.]+ s, forward [\d.]+ s, sampling [\d.]+ s, decode [\d.]+ s$", out,
                     flags=re.MULTILINE)  # no compile time: the model is not compiled
    assert f"{TINY_TOKENS}/{TINY_TOKENS}" not in err  # no progress bar where stderr is not a terminal (a log)
    assert re.fullmatch(rf"SCD-faithful: {nfe} model calls for 16 tokens, [\d.]+ s\n", err)  # but a line


def test_plain_ar_says_one_call_per_token_not_a_speed_up(tiny_janus_dir, tmp_path, capsys):
    code, out, err = run_cli(capsys, "generate", "--model", tiny_janus_dir, "--prompt", "a red cube",
                             "--window", 1, "--device", "cpu", "-o", tmp_path / "out.png")
    assert code == 0, err
    assert "16 model calls for 16 tokens: one call per token, as plain AR sampling\n" in out
    assert "fewer calls" not in out and "acceptance" not in out


def test_progress_bar_draws_on_a_terminal(tiny_janus_dir, tmp_path, monkeypatch, capsys):
    terminal = TerminalStream()
    monkeypatch.setattr(sys, "stderr", terminal)
    code = main(["generate", "--model", str(tiny_janus_dir), "--prompt", "a red cube", "--window", "4",
                 "--device", "cpu", "-o", str(tmp_path / "out.png")])
    assert code == 0, terminal.getvalue()
    nfe = int(re.search(r"(\d+) model calls for 16 tokens", capsys.readouterr().out).group(1))
    last = terminal.getvalue().split("\r")[-1]  # tqdm redraws one line in place
    assert f"{TINY_TOKENS}/{TINY_TOKENS}" in last and f"{nfe} calls" in last and "100%" in last
    assert "model calls for" not in terminal.getvalue()  # the bar instead of the log's line


def test_a_mammothmoda2_folder_writes_its_dit_image(tiny_preview_dir, tmp_path, capsys):
    """MammothModa2 samples its tokens, then its DiT and VAE make the PNG at the asked size."""
    code, _, err = run_cli(capsys, "generate", "--model", tiny_preview_dir, "--prompt", "a red cube", "--width", 96,
                           "--height", 64, "--device", "cpu", "-o", tmp_path / "out.png")
    assert code == 0, err
    assert Image.open(tmp_path / "out.png").size == (96, 64)


def test_the_decoder_flags_set_the_dits_steps_and_noise(tiny_preview_dir, tmp_path, capsys):
    """--decoder-steps / --decoder-seed reach the DiT (the tokens stay the sampler seed's); bad values are named by
    their flag before any weight is read, and a VQ decoder refuses them."""
    def pixels(*flags: object) -> np.ndarray:
        out = tmp_path / f"{'_'.join(map(str, flags))}.png"
        code, _, err = run_cli(capsys, "generate", "--model", tiny_preview_dir, "--prompt", "a red cube", "--width",
                               64, "--height", 64, "--device", "cpu", "-o", out, *flags)
        assert code == 0, err
        return np.asarray(Image.open(out))

    two = pixels("--decoder-steps", 2, "--decoder-seed", 5)
    assert np.array_equal(two, pixels("--decoder-steps", 2, "--decoder-seed", 5))
    assert not np.array_equal(two, pixels("--decoder-steps", 2, "--decoder-seed", 6))
    assert not np.array_equal(two, pixels("--decoder-steps", 3, "--decoder-seed", 5))
    assert not np.array_equal(two, pixels("--decoder-steps", 2, "--decoder-seed", 5, "--decoder-guidance", 1))
    code, _, err = run_cli(capsys, "generate", "--model", tiny_preview_dir, "--prompt", "x", "--decoder-steps", 0,
                           "-o", tmp_path / "bad.png")
    assert code != 0 and "--decoder-steps must be a whole number in 1..1000, got 0" in err
    code, _, err = run_cli(capsys, "generate", "--model", "demo", "--prompt", "7", "--decoder-seed", 3,
                           "-o", tmp_path / "demo.png")
    assert code != 0 and "this model's decoder is a VQ decoder, which takes no seed" in err
    assert not (tmp_path / "demo.png").exists() and not (tmp_path / "bad.png").exists()


def test_compare_in_a_log_prints_a_line_as_each_run_ends(tiny_janus_dir, tmp_path, capsys):
    """Where no bar draws (stderr not a terminal), a long --compare says how far it is after every run."""
    code, out, err = run_cli(capsys, "generate", "--model", tiny_janus_dir, "--prompt", "a red cube",
                             "--window", 4, "--seeds", "5,9", "--compare", "-o", tmp_path / "compare.png")
    assert code == 0, err
    lines = err.splitlines()
    assert len(lines) == 2 * len(COMPARE_LABELS)
    calls: dict[str, list[int]] = {}
    for number, line in enumerate(lines, start=1):
        label, seed = COMPARE_LABELS[(number - 1) // 2], (5, 9)[(number - 1) % 2]
        found = re.fullmatch(rf"{label} seed {seed}: (\d+) model calls for 16 tokens, [\d.]+ s "
                             rf"\(run {number} of {len(lines)}\)", line)
        assert found, line
        calls.setdefault(label, []).append(int(found.group(1)))
    rows = compare_rows(out)  # the lines' calls are the table's
    assert all(rows[label][2] == f"{statistics.fmean(calls[label]):.1f}" for label in COMPARE_LABELS)


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
                             "--window", 4, "--seeds", "5-7", "--compare", "-o", output)
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
                             "--seeds", "0,1", "--compare", "-o", output)
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
    (["--window", "two"], "--window: must be 'auto' or an integer in 1..1024"),
    (["--seeds", "4"], "--seeds goes with --compare"),
    (["--compare", "", "--seeds", "0,{max_seed_plus_1}"], "--seeds: must be distinct integers in 0.."),
    (["--compare", "", "--seeds", "3-1"], "--seeds: must be seeds separated by commas, or a range"),
    (["--compare", "", "--seeds", "0-3", "--seed", "2"], "give --seed or --seeds, not both"),
    (["--seed", "-1"], "--seed must be an integer in 0.."),
    (["--model", "demo", "--prompt", "cat"], "takes one of its classes (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)"),
    (["--model", "demo", "--prompt", "3", "--width", "64", "--height", "64"], "one image size only"),
    (["--width", "64"], "give both --width and --height"),
    (["--width", "-8", "--height", "8"], "--width: must be a pixel count"),
    (["--coupler", "greedy"], "--coupler: invalid choice"),
    (["--top-p", "1.5"], "--top-p must be a number in (0, 1], got 1.5"),
    (["--cfg", "-2"], "--cfg must be a number in 0..100"),
    (["--top-k", "0"], "--top-k must be an integer >= 1"),
    (["--batch-size", "0"], "--batch-size"),
    (["--dtype", "int3"], "--dtype: invalid choice: 'int3'"),
    (["--quantize", "int4"], "--quantize: invalid choice"),
    (["--device", "nonsense"], "--device"),
    (["--device", "gpu"], "--device 'gpu' is not a torch device: use cuda (cuda:1 for a second GPU), mps or cpu"),
    (["--dtype", "int8"], "--dtype: int8 is a weight precision, not a compute dtype: use --quantize int8"),
    (["-o", "{tmp}/out.jpg"], "must be a .png file"),
    (["-o", "{tmp}/no/such/folder/out.png"], "does not exist"),
])
def test_bad_input_exits_2_with_one_clear_line(argv, message, tiny_janus_dir, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    defaults = {"--model": str(tiny_janus_dir), "--prompt": "a cat", "-o": str(tmp_path / "out.png")}
    defaults.update(zip(argv[::2], argv[1::2]))
    args = [part.format(missing=tmp_path / "missing", empty=tmp_path / "empty", tmp=tmp_path,
                        max_seed_plus_1=MAX_SEED + 1) for pair in defaults.items() for part in pair if part]
    code, out, err = run_cli(capsys, "generate", *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err
    assert err.startswith("error: ") and not err.startswith("error: argument ")  # argparse's errors as the others
    assert "None" not in err and "cfg_scale" not in err and "top_p" not in err  # the library's names, not the CLI's
    assert "ImageNet" not in err
    assert not list(tmp_path.glob("**/*.png")) and not list(tmp_path.glob("**/*.jpg"))


def test_missing_required_option_is_named(capsys):
    code, _, err = run_cli(capsys, "generate", "--model", "demo", "-o", "x.png")
    assert code == 2 and "--prompt" in err and len(err.strip().splitlines()) == 1


def help_of(capsys: pytest.CaptureFixture, command: str) -> str:
    code, out, err = run_cli(capsys, command, "--help")
    assert code == 0, err
    return out


def options_help(help_out: str) -> dict[str, str]:
    """Each option's entry of --help ("--seeds SEEDS  one image per seed ..."), its wrapped lines joined."""
    entries = re.split(r"\n  (?=-)", help_out.split("\noptions:", 1)[1])
    return {re.search(r"--[a-z-]+", entry).group(): " ".join(entry.split()) for entry in entries[1:]}


def test_no_arguments_show_usage(capsys):
    code, out, err = run_cli(capsys)
    assert code == 2 and "usage:" in err and "generate" in err
    help_text = " ".join(help_of(capsys, "generate").split())  # argparse wraps lines
    assert "--coupler" in help_text and "--compare" in help_text
    for shown in ("(default: faithful)", "(default: 32)", "(default: 0)", "(default: token)"):
        assert shown in help_text
    assert "divides the logits before sampling (default: the model's)" in help_text  # GLM-Image's 0.9
    assert "(default: None)" not in help_text and "(default: False)" not in help_text


@pytest.mark.parametrize("command", ["generate", "batch"])
def test_help_states_each_default_once(command, capsys):
    help_out = help_of(capsys, command)
    options = options_help(help_out)
    assert len(options) > 15 and "--seeds" in options and "--window" in options
    for entry in options.values():  # "(default: 0) (default: (0,))" was one
        assert len(re.findall(r"\(default:? ", entry)) <= 1, entry
    assert "None" not in help_out and "generate_many" not in help_out


@pytest.mark.parametrize("command", ["generate", "batch"])
def test_dtype_help_lists_the_names_the_parser_takes(command, capsys):
    listed = options_help(help_of(capsys, command))["--dtype"].split("(default:")[0]
    assert set(re.split(r"[\s,()]+", listed)) - {"--dtype", "DTYPE", "or", ""} == set(DTYPES)
    required = ["--prompt", "7", "-o", "x.png"] if command == "generate" else ["jobs.jsonl", "--out", "out"]
    for name in DTYPES:
        assert cli.build_parser().parse_args([command, "--model", "demo", *required, "--dtype", name]).dtype == name


def test_compile_flag_loads_the_model_compiled(tmp_path, capsys):
    """--compile reaches load_model: the compiled demo then refuses a tree of candidates, before any call."""
    code, out, err = run_cli(capsys, "generate", "--model", "demo", "--prompt", "3", "--compile", "--coupler",
                             "maximal", "--candidates", 2, "-o", tmp_path / "compiled.png")
    assert code == 2 and "not available with a compiled model" in err and "Traceback" not in err
    assert not (tmp_path / "compiled.png").exists()


def test_help_explains_each_coupler(capsys):
    coupler = options_help(help_of(capsys, "generate"))["--coupler"]
    for entry in couplers.COUPLERS:  # what each does, from the table every front end reads
        assert f"{entry.name}: {' '.join(entry.help.split())}" in coupler


def test_seeds_is_a_list_of_seeds_in_generate_and_batch(tiny_janus_dir, tmp_path, capsys):
    for command in ("generate", "batch"):
        assert "(0,1,2 or 0-7)" in options_help(help_of(capsys, command))["--seeds"]
    assert cli.seed_list("0-3,9") == (0, 1, 2, 3, 9)
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"id": "cube", "prompt": "a red cube"}\n')
    code, out, err = run_cli(capsys, "batch", jobs, "--model", tiny_janus_dir, "--window", 4, "--seeds", "2-3",
                             "--out", tmp_path / "out")
    assert code == 0, err
    assert sorted(path.name for path in (tmp_path / "out").glob("*.png")) == ["cube-s2.png", "cube-s3.png"]


def test_compile_seconds_are_the_first_call_of_each_width_beyond_a_typical_one():
    widths = [1, 8, 8, 8, 4, 8]  # the prefill, then calls at widths 8 and 4 (one call: the median of all)
    calls = [(9.0, 9.0), (5.0, 3.0), (1.0, 0.1), (1.2, 0.3), (1.0, 2.0), (1.0, 0.2)]
    forward, sampling = compile_seconds(widths, calls)
    assert forward == pytest.approx(4.0 + 0.0) and sampling == pytest.approx(2.8 + 1.7)
    assert compile_seconds([1, 8, 8], [(1.0, 1.0), (0.5, 0.5), (0.6, 0.6)]) == (0.0, 0.0)  # warm: nothing


def test_a_compiled_part_that_ran_eagerly_is_named_under_the_timing_line():
    result = GenerationResult(tokens=torch.zeros(1, 4, dtype=torch.long), nfe=2, total_s=1.0,
                              eager_fallbacks=["the sampling step: BackendCompilerFailed: no C++ compiler"])
    run = cli.Run("SCD-faithful", SamplerConfig(), result, torch.zeros(1, 8, 8, 3), 0.1, None, (0.0, 0.0))
    lines = cli.timing_line(run).split("\n")
    assert lines[0].startswith("wall 1.10 s") and "compile 0.00 s" in lines[0]
    assert lines[1:] == ["ran eagerly (--compile): the sampling step: BackendCompilerFailed: no C++ compiler"]


def test_compile_time_is_reported_apart_from_forward_and_sampling(tiny_janus_dir, tmp_path, monkeypatch, capsys):
    """--compile's first run compiles at its first call of each width: the timing line gives that call's time
    beyond a typical one as compile time, and the forward and sampling times are what is left of the engine's."""
    import torch._dynamo

    monkeypatch.setattr(compiled_regions, "BACKEND", "eager")  # dynamo's tracing without inductor's code generation
    torch._dynamo.reset()  # compiled earlier in this process: compile again
    results, calls = [], []

    def recorded(model, cond, config, *, callback, **kwargs):
        def timed(stats):
            calls.append(stats.forward_s + stats.sample_s)
            callback(stats)
        results.append(cli_generate(model, cond, config, callback=timed, **kwargs))
        return results[-1]

    cli_generate = cli.generate
    monkeypatch.setattr(cli, "generate", recorded)
    code, out, err = run_cli(capsys, "generate", "--model", tiny_janus_dir, "--prompt", "a red cube", "--compile",
                             "--window", 4, "-o", tmp_path / "compiled.png")
    assert code == 0, err
    parts = re.search(r"prefill ([\d.]+) s, forward ([\d.]+) s, sampling ([\d.]+) s, decode [\d.]+ s, "
                      r"compile ([\d.]+) s \(first call of each width", out)
    assert parts, out
    prefill, forward, sampling, compiling = map(float, parts.groups())
    result = results[0]
    assert forward + sampling + compiling == pytest.approx(result.forward_s + result.sample_s, abs=0.03)
    first, typical = calls[1], statistics.median(calls[2:])  # calls[0] is the prefill
    assert first > 3 * typical  # the first window call traced the layer and the sampling step
    assert compiling >= 0.9 * (first - typical) - 0.01


# ---------------------------------------------------------------- python -m scd_core.bench

def bench_help(capsys: pytest.CaptureFixture, *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        bench.main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_bench_help_lists_every_benchmark_with_its_line(capsys):
    out = bench_help(capsys)
    listed = re.findall(r"^    ([a-z0-9-]+)(?:\s|$)", out, flags=re.MULTILINE)
    assert listed == list(bench.COMMANDS)
    text = " ".join(out.split())
    assert all(" ".join(entry.summary.split()) in text for entry in bench.COMMANDS.values())


@pytest.mark.parametrize("name", list(bench.COMMANDS))
def test_every_bench_option_says_what_it_does_in_words_a_user_knows(name, capsys):
    assert all(settings.get("help") for _, settings in bench.COMMANDS[name].options)
    text = " ".join(bench_help(capsys, name).split()).replace("python -m scd_core.bench", "")
    assert not re.search(r"\b(None|REFINEMENT|SCD-MC|load_model|NFE)\b|scd_core\.", text), text
    assert not re.findall(r"\b[a-z]+_[a-z_]+\b(?!\.)", text)  # identifiers (but file names: device_check.md)


def test_bench_docstring_examples_parse():
    examples = [line.split("#")[0].split()[3:] for line in bench.__doc__.splitlines()
                if line.strip().startswith("python -m scd_core.bench ")]
    assert {argv[0] for argv in examples} == set(bench.COMMANDS)
    parser = bench.build_parser()
    for argv in examples:
        parser.parse_args(argv)
