"""The fetch cases of tests/test_fetch.py, each run by `python tests/fetch_cases.py CASE SOURCE WORK` inside a
network namespace that has only loopback (test_fetch.run_case), so nothing can reach an outside address.

SOURCE is a tiny model folder served by tests/hub_server.py as deepseek-community/Janus-Pro-1B, with a code file
and a pickle next to it that fetch must leave out; WORK is a scratch folder.  HF_ENDPOINT points at the stand-in
hub (set before huggingface_hub is imported, which reads it then).  Each case prints one JSON line of what it saw.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from hub_server import FakeHub  # noqa: E402

REPO_ID = "deepseek-community/Janus-Pro-1B"
WEIGHTS = "model.safetensors"
LEFT_OUT = ("modeling_janus.py", "pytorch_model.bin")  # code and a pickle: never downloaded


def served_copy(source: Path, work: Path) -> Path:
    """The tiny model folder as the stand-in hub serves it: the model plus a code file and a pickle."""
    repo = work / "served"
    shutil.copytree(source, repo)
    (repo / LEFT_OUT[0]).write_text("raise SystemExit('repository code ran')\n")
    (repo / LEFT_OUT[1]).write_bytes(b"\x80\x04not a model")
    return repo


def start_hub(source: Path, work: Path) -> FakeHub:
    return FakeHub({REPO_ID: served_copy(source, work)}, port=int(os.environ["HUB_PORT"])).start()


def attempt(call: Callable[[], Any]) -> tuple[Any, str]:
    from scd_core.models.fetch import FetchError

    try:
        return call(), ""
    except FetchError as err:
        return None, str(err)


def fetched(work: Path) -> dict[str, Any]:
    """What the models folder holds after a fetch."""
    models = work / "models"
    return {"entries": sorted(path.name for path in models.iterdir()) if models.is_dir() else [],
            "files": sorted(path.name for path in (models / "Janus-Pro-1B").glob("*"))
            if (models / "Janus-Pro-1B").is_dir() else []}


def case_full(source: Path, work: Path) -> dict[str, Any]:
    from scd_core import load_model
    from scd_core.models.fetch import fetch_model

    hub = start_hub(source, work)
    reports: list[list[Any]] = []
    folder = fetch_model(REPO_ID, work / "models", progress=lambda done, total, name: reports.append([done, total]))
    model = load_model(folder, device="cpu", dtype="float32")
    again = fetch_model(REPO_ID, work / "models")  # there already: the hub is not asked
    return {**fetched(work), "num_tokens": model.num_tokens, "family": model.family, "last": reports[-1],
            "requests": len(hub.requests), "again_same": again == folder,
            "requests_after_again": len(hub.requests),
            "served": sorted(p.name for p in (work / "served").iterdir())}


def case_resumed(source: Path, work: Path) -> dict[str, Any]:
    from scd_core.models.fetch import fetch_model

    hub = start_hub(source, work)
    hub.cut[WEIGHTS] = 1  # the first GET of the weights stops halfway
    fetch_model(REPO_ID, work / "models")
    return {**fetched(work), "gets": hub.gets(WEIGHTS), "size": (source / WEIGHTS).stat().st_size}


def case_interrupted(source: Path, work: Path) -> dict[str, Any]:
    """The network goes away during the weights; a second fetch, once it is back, takes up from there."""
    from scd_core import load_model
    from scd_core.models.fetch import fetch_model

    hub = start_hub(source, work)
    hub.halt = WEIGHTS
    _, first_error = attempt(lambda: fetch_model(REPO_ID, work / "models"))
    after_first = fetched(work)
    partial = work / "models" / ".Janus-Pro-1B.partial"
    kept = sum(path.stat().st_size for path in partial.rglob("*.incomplete"))
    arrived = sorted(path.name for path in partial.iterdir() if path.is_file())
    assert hub.stopped.wait(30), "the stand-in hub did not stop"
    hub = FakeHub({REPO_ID: work / "served"}, port=hub.port).start()  # the network is back
    folder = fetch_model(REPO_ID, work / "models")
    model = load_model(folder, device="cpu", dtype="float32")
    import huggingface_hub

    return {"first_error": first_error, "after_first": after_first, "arrived": arrived, "kept": kept,
            "gets": [entry for entry in hub.requests if entry["method"] == "GET" and "file" in entry],
            **fetched(work), "num_tokens": model.num_tokens, "hub_client": huggingface_hub.__version__}


def case_corrupt(source: Path, work: Path) -> dict[str, Any]:
    from scd_core.models.fetch import fetch_model

    hub = start_hub(source, work)
    data = bytearray((source / WEIGHTS).read_bytes())
    data[-1] ^= 0xFF  # one weight byte flipped on the way: same size, another hash
    hub.repos[REPO_ID].served[WEIGHTS] = bytes(data)
    _, error = attempt(lambda: fetch_model(REPO_ID, work / "models"))
    return {"error": error, **fetched(work)}


def case_offline(source: Path, work: Path) -> dict[str, Any]:
    """No network: HF_ENDPOINT unset, so the real hub's address, which no route out of the namespace reaches."""
    from scd_core.models.fetch import fetch_model

    _, unreachable = attempt(lambda: fetch_model(REPO_ID, work / "models"))
    cli = subprocess.run([sys.executable, "-m", "scd_core", "fetch", REPO_ID, "--to", str(work / "models")],
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    return {"error": unreachable, "cli_code": cli.returncode, "cli_stderr": cli.stderr, **fetched(work)}


def case_cli(source: Path, work: Path) -> dict[str, Any]:
    start_hub(source, work)
    cli = subprocess.run([sys.executable, "-m", "scd_core", "fetch", REPO_ID, "--to", str(work / "models")],
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    return {"code": cli.returncode, "stdout": cli.stdout, "stderr": cli.stderr[-2000:], **fetched(work),
            "served": sorted(p.name for p in (work / "served").iterdir())}


def case_comfy(source: Path, work: Path) -> dict[str, Any]:
    """The loader node's download option in a real ComfyUI server (in this namespace too), then a run."""
    from comfy_server import ComfyServer

    start_hub(source, work)
    server = ComfyServer(work / "comfy")
    server.start()
    try:
        graph = {
            "1": {"class_type": "SCDModelLoader", "inputs": {"model": "demo", "device": "auto", "dtype": "auto",
                                                            "download": REPO_ID}},
            "2": {"class_type": "SCDPromptEncode", "inputs": {"model": ["1", 0], "prompt": "a red square"}},
            "3": {"class_type": "SCDSampler", "inputs": {
                "model": ["1", 0], "conditioning": ["2", 0], "coupler": "maximal", "window": 4, "cfg_scale": -1.0,
                "seed": 0, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "draft_init": "above", "batch_size": 1}},
            "4": {"class_type": "SCDVQDecode", "inputs": {"model": ["1", 0], "tokens": ["3", 0]}},
            "5": {"class_type": "PreviewImage", "inputs": {"images": ["4", 0]}},
        }
        run = server.run(graph, timeout=600)
        listed = server.object_info("SCDModelLoader")["input"]["required"]["model"]
        return {"status": run.status, "errors": run.of_type("execution_error"),
                "loader_progress": [p for p in run.of_type("progress") if p["node"] == "1"],
                "download_texts": [t for t in run.texts if t.startswith("downloading")],
                "sampler_events": len([e for e in run.of_type("scd.progress") if e["node"] == "3"]),
                "images": len(run.history()["outputs"].get("5", {}).get("images", [])),
                "listed": json.dumps(listed), "models": sorted(p.name for p in server.models_dir.iterdir())}
    finally:
        server.stop()


CASES = {"full": case_full, "resumed": case_resumed, "interrupted": case_interrupted, "corrupt": case_corrupt,
         "offline": case_offline, "cli": case_cli,
         "comfy": case_comfy}

if __name__ == "__main__":
    case, source, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    print(json.dumps(CASES[case](source, work)))
