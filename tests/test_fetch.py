"""Fetching a published model (scd_core/models/fetch.py, `python -m scd_core fetch`, the loader's download option)
against a stand-in hub on 127.0.0.1 (tests/hub_server.py) in the hub's URL layout.

Every case that talks to a server runs in tests/fetch_cases.py inside `unshare --net` with only loopback up, the
stand-in hub and, for the node, a ComfyUI server of its own started in that same namespace: the session's
comfy_server fixture runs outside any namespace (on the host's loopback, where an outside address would be
reachable), so it is not used here; a server in the namespace costs one more start but nothing it or the hub
client does can leave the machine.  The real hub is never asked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fetch_cases import LEFT_OUT, WEIGHTS

REPO_ROOT = Path(__file__).resolve().parents[1]
SANDBOX = ["unshare", "--net"]
HUB_PORT = 8765  # the namespace has a port space of its own


def run_case(case: str, source: Path, work: Path, endpoint: bool = True, timeout: float = 600) -> dict[str, Any]:
    """One case of fetch_cases.py in a loopback-only network namespace; its JSON report."""
    probe = subprocess.run([*SANDBOX, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.fail(f"the fetch tests must run under `{' '.join(SANDBOX)}`, which fails here (it needs root): "
                    f"{probe.stderr.strip()}")
    env = {**os.environ, "HF_HOME": str(work / "hf_home"), "HF_HUB_DISABLE_TELEMETRY": "1",
           "HUB_PORT": str(HUB_PORT), "HF_ENDPOINT": f"http://127.0.0.1:{HUB_PORT}"}
    if not endpoint:
        del env["HF_ENDPOINT"]
    script = 'ip link set lo up && exec "$0" "$@"'
    done = subprocess.run([*SANDBOX, "sh", "-c", script, sys.executable, str(REPO_ROOT / "tests" / "fetch_cases.py"),
                           case, str(source), str(work)], capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, f"case {case} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_fetch_arrives_whole_without_code_or_pickles_and_loads(tiny_janus_dir: Path, tmp_path: Path) -> None:
    seen = run_case("full", tiny_janus_dir, tmp_path)
    assert set(LEFT_OUT) <= set(seen["served"])
    assert seen["entries"] == ["Janus-Pro-1B"]  # no partial folder left beside it
    assert seen["files"] == sorted(name for name in seen["served"] if name not in LEFT_OUT)
    assert seen["family"] == "janus" and seen["num_tokens"] > 0
    done, total = seen["last"]
    assert done == total == sum((tiny_janus_dir / name).stat().st_size for name in seen["files"])
    assert seen["again_same"] and seen["requests_after_again"] == seen["requests"]  # there: the hub not asked


def test_a_dropped_connection_is_resumed_not_restarted(tiny_janus_dir: Path, tmp_path: Path) -> None:
    seen = run_case("resumed", tiny_janus_dir, tmp_path)
    first, resumed = seen["gets"]
    assert first["range"] is None and 0 < first["sent"] < seen["size"]
    # the client keeps what it wrote (whole 10 MiB chunks; the tiny Janus's weights are 14 MB) and asks for the rest
    kept = int(resumed["range"].removeprefix("bytes=").removesuffix("-"))
    assert 0 < kept <= first["sent"] and resumed["sent"] == seen["size"] - kept
    assert seen["entries"] == ["Janus-Pro-1B"] and WEIGHTS in seen["files"]


def test_an_interrupted_fetch_leaves_no_model_folder_and_the_next_one_takes_up_from_there(
        tiny_janus_dir: Path, tmp_path: Path) -> None:
    """The files that arrived are kept and not downloaded again; the file cut short is resumed from its kept part
    by huggingface_hub < 2, which keeps it as .incomplete, and downloaded afresh by huggingface_hub >= 2, which
    deletes a download that fails for good (it resumes within a download only: the test above)."""
    seen = run_case("interrupted", tiny_janus_dir, tmp_path)
    assert "stopped at model.safetensors" in seen["first_error"] and "fetch again to resume" in seen["first_error"]
    assert "\n" not in seen["first_error"]
    assert seen["after_first"]["entries"] == [".Janus-Pro-1B.partial"]  # hidden from the loader's list
    assert seen["arrived"] == ["config.json", "generation_config.json"]  # listed before the weights
    second = [entry for entry in seen["gets"] if entry["file"] not in seen["arrived"]]
    assert [entry["file"] for entry in seen["gets"]] == [entry["file"] for entry in second]
    (weights,) = [entry for entry in second if entry["file"] == WEIGHTS]
    if int(seen["hub_client"].split(".")[0]) < 2:
        assert seen["kept"] > 0 and weights["range"] == f"bytes={seen['kept']}-"
    else:
        assert seen["kept"] == 0 and weights["range"] is None
    assert seen["entries"] == ["Janus-Pro-1B"] and seen["num_tokens"] > 0


def test_a_corrupted_file_is_refused_and_nothing_is_left_as_complete(tiny_janus_dir: Path, tmp_path: Path) -> None:
    seen = run_case("corrupt", tiny_janus_dir, tmp_path)
    assert seen["error"].startswith("model.safetensors does not match the hub's sha256")
    assert seen["entries"] == []


def test_a_broken_safetensors_header_is_refused(tmp_path: Path) -> None:
    """A file the hub lists without a hash (not in LFS) but whose header does not parse."""
    from scd_core.models.fetch import FetchError, RepoFile, check_arrived

    broken = b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}"
    (tmp_path / WEIGHTS).write_bytes(broken)
    with pytest.raises(FetchError, match="model.safetensors is not a readable safetensors file"):
        check_arrived(tmp_path, [RepoFile(WEIGHTS, len(broken), None)])
    with pytest.raises(FetchError, match="has 25 bytes, the hub lists 26"):
        check_arrived(tmp_path, [RepoFile(WEIGHTS, 26, None)])


def test_no_network_is_one_clear_line(tiny_janus_dir: Path, tmp_path: Path) -> None:
    seen = run_case("offline", tiny_janus_dir, tmp_path, endpoint=False)
    assert seen["error"].startswith("cannot reach the Hugging Face hub at https://huggingface.co to fetch "
                                    "deepseek-community/Janus-Pro-1B (offline?")
    assert seen["cli_code"] == 2
    assert seen["cli_stderr"].strip().splitlines()[-1] == f"error: {seen['error']}"
    assert seen["entries"] == []


def test_the_command_line_fetches(tiny_janus_dir: Path, tmp_path: Path) -> None:
    seen = run_case("cli", tiny_janus_dir, tmp_path)
    assert seen["code"] == 0, seen["stderr"]
    assert seen["stdout"].strip().endswith(f"into {tmp_path / 'models' / 'Janus-Pro-1B'}")
    assert seen["stderr"].strip().splitlines()[-1].startswith("Janus-Pro-1B: 100%|")  # the bar, in bytes
    assert seen["files"] == sorted(name for name in seen["served"] if name not in LEFT_OUT)


def test_a_refused_repository_says_what_to_download_instead(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    from scd_core.frontends.cli import main
    from scd_core.models.fetch import FetchError, check_repo

    assert main(["fetch", "BAAI/Emu3.5-Image", "--to", str(tmp_path)]) == 2  # before anything is asked of the hub
    assert capsys.readouterr().err.startswith("error: BAAI/Emu3.5-Image is not fetched: the loader needs BAAI/Emu3.5")
    assert list(tmp_path.iterdir()) == []

    with pytest.raises(FetchError, match="needs the Hugging Face repository Alpha-VLLM/Lumina-mGPT-2.0 plus "
                                         "MoVQGAN's movqgan_270M.ckpt; download those by hand"):
        check_repo("Alpha-VLLM/Lumina-mGPT-2.0")
    with pytest.raises(FetchError, match="not a published model fetch knows; it takes deepseek-community/Janus"):
        check_repo("someone/else")


def test_the_loader_node_fetches_with_progress_then_runs(tiny_janus_dir: Path, tmp_path: Path) -> None:
    seen = run_case("comfy", tiny_janus_dir, tmp_path)
    assert seen["status"] == "success", seen["errors"]
    progress = seen["loader_progress"]
    assert progress and progress[-1]["value"] == progress[-1]["max"] > 1  # bytes, on the loader node
    assert seen["download_texts"] and seen["download_texts"][-1].startswith(
        "downloading deepseek-community/Janus-Pro-1B: ")
    assert seen["sampler_events"] > 0 and seen["images"] == 1
    assert seen["models"] == ["Janus-Pro-1B"]
