"""The pack inside a real ComfyUI server (started by the comfy_server fixture): HTTP, websocket, workflows."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path
from typing import Any, Optional

import pytest
import requests
from PIL import Image
from scd_core.windows import window_policies
from scd_core.decoding.config import COUPLERS

from comfy_server import REPO_ROOT, ComfyServer, PromptRejected
from lumina_fixture import RESOLUTION_1, tiny_lumina2_dir, tiny_lumina_dir  # noqa: F401  (fixtures)

WORKFLOWS = REPO_ROOT / "workflows" / "api"
NODE_IDS = ("SCDModelLoader", "SCDPromptEncode", "SCDSampler", "SCDVQDecode", "SCDStats")


def pipeline(model: str, prompt: str, seed: int, window: int = 4, batch_size: int = 1,
             **sampler: Any) -> dict[str, Any]:
    """Loader -> encode -> sampler -> decode -> PreviewImage, plus Stats -> PreviewAny (summary) and PreviewImage."""
    return {
        "1": {"class_type": "SCDModelLoader", "inputs": {"model": model, "device": "auto", "dtype": "auto"}},
        "2": {"class_type": "SCDPromptEncode", "inputs": {"model": ["1", 0], "prompt": prompt}},
        "3": {"class_type": "SCDSampler", "inputs": {
            "model": ["1", 0], "conditioning": ["2", 0], "coupler": "maximal", "window": window, "cfg_scale": -1.0,
            "seed": seed, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "draft_init": "above",
            "batch_size": batch_size} | sampler},
        "4": {"class_type": "SCDVQDecode", "inputs": {"model": ["1", 0], "tokens": ["3", 0]}},
        "5": {"class_type": "PreviewImage", "inputs": {"images": ["4", 0]}},
        "6": {"class_type": "SCDStats", "inputs": {"stats": ["3", 1]}},
        "7": {"class_type": "PreviewAny", "inputs": {"source": ["6", 1]}},
        "8": {"class_type": "PreviewImage", "inputs": {"images": ["6", 0]}},
    }


@pytest.fixture(scope="module")
def tiny_janus(comfy_server: ComfyServer, tiny_janus_dir: Path) -> str:
    return comfy_server.add_model("tiny-janus", tiny_janus_dir)


@pytest.fixture(scope="module")
def demo_image_size() -> tuple[int, int]:
    """(width, height) of a demo image, from the demo model itself."""
    import torch
    from scd_core import load_model

    model = load_model("demo", device="cpu", dtype="float32")
    with torch.inference_mode():
        image = model.decode(torch.zeros(1, model.num_tokens, dtype=torch.long))
    return image.shape[2], image.shape[1]


def output_images(server: ComfyServer, run: Any, node_ids: Optional[list[str]] = None) -> list[Image.Image]:
    """The images of the run's output nodes (all, or those in `node_ids`)."""
    outputs = run.history()["outputs"]
    return [Image.open(io.BytesIO(server.view(entry)))
            for node_id, output in outputs.items() if node_ids is None or node_id in node_ids
            for entry in output.get("images", [])]


def run_shipped_workflow(server: ComfyServer, name: str, folder: Path, size: tuple[int, int],
                         window: int) -> tuple[list[Image.Image], list[dict]]:
    """The shipped text-to-image workflow `name`'s API twin (loader 1, prompt 2, sampler 3, saved image 5) with
    `folder` as its model, its size and window swapped, run to success: the saved images and the sampler's
    progress events."""
    graph = json.loads((WORKFLOWS / f"{name}_api.json").read_text())
    graph["1"]["inputs"]["model"] = server.add_model(f"tiny-{name}", folder)
    graph["2"]["inputs"] |= {"width": size[0], "height": size[1]}
    graph["3"]["inputs"]["window"] = window
    run = server.run(graph, timeout=900)  # a first decode may import diffusers and read a DiT
    assert run.status == "success", run.events[-3:]
    return output_images(server, run, ["5"]), [data for data in run.of_type("scd.progress") if data["node"] == "3"]


def summary_text(run: Any) -> str:
    texts = [t for output in run.history()["outputs"].values() for t in output.get("text", [])]
    assert len(texts) == 1, texts
    return texts[0]


def assert_serving(server: ComfyServer) -> None:
    assert server.is_alive()
    assert requests.get(f"{server.url}/system_stats", timeout=10).ok


def test_object_info_lists_the_nodes(comfy_server: ComfyServer, tiny_janus: str) -> None:
    info = comfy_server.get_json("/object_info")
    assert set(NODE_IDS) <= set(info)
    assert info["SCDModelLoader"]["display_name"] == "SCD Model Loader"
    models = info["SCDModelLoader"]["input"]["required"]["model"][1]["options"]
    assert models[0] == "demo" and tiny_janus in models
    sampler = info["SCDSampler"]["input"]["required"]
    assert sampler["window"][1]["min"] == window_policies.NODE_MIN  # the policies' values lie below 1
    assert sampler["window"][1]["default"] == 0  # 0 = automatic window
    assert sampler["coupler"][1]["options"] == list(COUPLERS)
    assert info["SCDSampler"]["output"] == ["SCD_TOKENS", "SCD_STATS"]
    assert info["SCDStats"]["output"] == ["IMAGE", "STRING"]


def test_web_extension_is_served_once(comfy_server: ComfyServer) -> None:
    scripts = [url for url in comfy_server.get_json("/extensions") if url.endswith("/scd_widget.js")]
    assert len(scripts) == 1, f"the widget would register {len(scripts)} times: {scripts}"


def test_tiny_janus_runs_with_progress_events_that_agree(comfy_server: ComfyServer, tiny_janus: str) -> None:
    run = comfy_server.run(pipeline(tiny_janus, "a green field", seed=101, batch_size=2))
    assert run.status == "success", run.events[-3:]
    images = output_images(comfy_server, run)
    assert len(images) == 3  # two samples and the stats chart
    assert sorted(im.size for im in images) == [(64, 64), (64, 64), (480, 300)]

    nfe = int(re.search(r"in (\d+) model calls", summary_text(run)).group(1))
    events = [data for data in run.of_type("scd.progress") if data["node"] == "3"]
    assert len(events) == nfe
    assert [e["iteration"] for e in events] == list(range(nfe))
    assert sum(e["committed"] for e in events) == 16 == events[-1]["total"] == events[-1]["num_tokens"]
    # the status line: "5 calls, 12 / 16 tokens", once per call, as the events count them
    assert [t for t in run.texts if re.fullmatch(r"\d+ calls?, \d+ / 16 tokens", t)] == [
        f"{e['nfe']} call{'s' if e['nfe'] != 1 else ''}, {e['total']} / 16 tokens" for e in events]
    # ComfyUI's log names the model it moves, not an internal class
    assert f"Requested to load SCD {tiny_janus}" in comfy_server.log_path.read_text(errors="replace")
    assert run.previews >= 1
    progress = [p for p in run.of_type("progress") if p["node"] == "3"]
    assert len(progress) == nfe and progress[-1]["value"] == progress[-1]["max"] == 16


def test_tiny_janus_runs_with_int8_weights(comfy_server: ComfyServer, tiny_janus: str) -> None:
    graph = pipeline(tiny_janus, "a green field", seed=101)
    graph["1"]["inputs"]["quantize"] = "int8"
    run = comfy_server.run(graph)
    assert run.status == "success", run.events[-3:]
    assert [im.size for im in output_images(comfy_server, run, ["5"])] == [(64, 64)]
    (note,) = [t for t in run.texts if "weights int8" in t]  # the loader's memory estimate, on the node
    assert note.startswith("janus, weights int8: ") and "KV cache" in note


def test_tiny_lumina_runs_in_the_server(comfy_server: ComfyServer, tiny_lumina_dir: Path) -> None:
    # the repository's name carries the resolution, so the folder keeps it under models/scd/
    name = comfy_server.add_model(tiny_lumina_dir.name, tiny_lumina_dir)
    run = comfy_server.run(pipeline(name, "a green field", seed=7, window=6))
    assert run.status == "success", run.events[-3:]
    images = output_images(comfy_server, run, ["5"])
    assert [im.size for im in images] == [(RESOLUTION_1, RESOLUTION_1)]
    events = [data for data in run.of_type("scd.progress") if data["node"] == "3"]
    assert sum(e["committed"] for e in events) == events[-1]["num_tokens"] == 21  # 4 rows of 4 codes + row-end, EOI


def test_tiny_lumina2_runs_wide_in_the_server(comfy_server: ComfyServer, tiny_lumina2_dir: Path) -> None:
    """Prompt Encode's width / height reach Lumina-mGPT 2.0: 64 x 32 px, 4 rows of 8 codes."""
    name = comfy_server.add_model(tiny_lumina2_dir.name, tiny_lumina2_dir)
    graph = pipeline(name, "a green field", seed=7, window=6, cfg_scale=7.5)
    graph["2"]["inputs"] |= {"width": 64, "height": 32}
    run = comfy_server.run(graph)
    assert run.status == "success", run.events[-3:]
    assert [im.size for im in output_images(comfy_server, run, ["5"])] == [(64, 32)]
    events = [data for data in run.of_type("scd.progress") if data["node"] == "3"]
    assert sum(e["committed"] for e in events) == events[-1]["num_tokens"] == 4 * 9 + 1


USER_FILE_NODES = ("LoadVideo", "LoadImage")  # inputs a shipped workflow leaves for the user to pick


@pytest.mark.parametrize("workflow", sorted(WORKFLOWS.glob("*.json")), ids=lambda p: p.stem)
def test_shipped_demo_workflows_run(comfy_server: ComfyServer, workflow: Path,
                                    demo_image_size: tuple[int, int]) -> None:
    graph = json.loads(workflow.read_text())
    loaders = [node for node in graph.values() if node["class_type"] == "SCDModelLoader"]
    if any(node["inputs"]["model"] != "demo" for node in loaders):
        # needs real weights (and, for a video workflow, the user's clip): the server must refuse the graph for
        # those missing things alone
        response = comfy_server.submit(graph)
        assert response.status_code == 400
        errors = response.json()["node_errors"]
        assert errors
        for node_id, error in errors.items():
            kind = graph[node_id]["class_type"]
            messages = " ".join(e["message"] + " " + str(e.get("details", "")) for e in error["errors"])
            if kind == "SCDModelLoader":
                assert "not found" in messages, messages
            else:
                assert kind in USER_FILE_NODES and all(e["extra_info"]["input_name"] in ("file", "image")
                                                        for e in error["errors"]), (kind, messages)
        return
    run = comfy_server.run(graph)
    assert run.status == "success", run.events[-3:]
    # image outputs fed straight by a decoder show the demo's size; stitched ones are at least that big
    direct = [node_id for node_id, node in graph.items() if node["class_type"] in ("SaveImage", "PreviewImage")
              and graph[node["inputs"]["images"][0]]["class_type"] == "SCDVQDecode"]
    assert {im.size for im in output_images(comfy_server, run, direct)} <= {demo_image_size}
    sizes = [im.size for im in output_images(comfy_server, run)]
    assert sizes and all(w >= demo_image_size[0] and h >= demo_image_size[1] for w, h in sizes)


def test_demo_continuation_keeps_the_top_half_and_samples_the_rest(comfy_server: ComfyServer) -> None:
    """The shipped continuation workflow end to end: the server's images are the core's, run here with the same
    settings, whose lower half alone was sampled: the top 8 token rows are the digit's codes, unchanged.  The
    image prompt says what it kept; the kept tokens reach the chart as forced, not as sampled."""
    import numpy as np
    import torch
    from scd_core import SamplerConfig, generate, load_model
    from scd_core.images.image_prompt import add_image

    graph = json.loads((WORKFLOWS / "scd_demo_continuation_api.json").read_text())
    graph["3"]["inputs"]["seed"], graph["11"]["inputs"]["seed"] = 4242, 611  # not a cached run's
    run = comfy_server.run(graph)
    assert run.status == "success", run.events[-3:]
    assert "kept the top 8 of 16 token rows, sampling the 8 below" in run.texts
    events = [data for data in run.of_type("scd.progress") if data["node"] == "11"]
    assert sum(e["forced"] for e in events) == 128 and events[-1]["total"] == 256

    model = load_model("demo", device="cpu", dtype="float32")
    with torch.inference_mode():
        cond = model.encode("7")
        digit = model.decode(generate(model, cond, SamplerConfig(coupler="faithful", window=32, seed=4242)).tokens)
        given = add_image(model, cond, digit, keep_top=0.5).cond
        completed = generate(model, given, SamplerConfig(coupler="faithful", window=32, seed=611), batch_size=4)
    codes = model.encode_image(digit)
    assert torch.equal(completed.tokens[:, :128], codes.expand(4, -1)[:, :128])  # the kept half, unchanged
    assert (completed.tokens[:, 128:] != codes[:, 128:]).any(dim=1).all()  # each lower half sampled anew

    def pixels(images: torch.Tensor) -> list[np.ndarray]:  # as SaveImage / PreviewImage write them
        return [np.clip(255.0 * image.numpy(), 0, 255).astype(np.uint8) for image in images]

    for node_id, expected in (("5", pixels(digit)), ("13", pixels(model.decode(completed.tokens)))):
        served = [np.asarray(image.convert("RGB")) for image in output_images(comfy_server, run, [node_id])]
        assert len(served) == len(expected)
        for got, want in zip(served, expected):
            assert np.abs(got.astype(int) - want.astype(int)).max() <= 1, node_id


def test_interrupt_ends_the_run_within_a_second(comfy_server: ComfyServer) -> None:
    # plain AR on a batch of 16: hundreds of model calls, long enough to interrupt midway
    long_run = pipeline("demo", "7", seed=202, window=1, batch_size=16)
    run = comfy_server.start_prompt(long_run)
    run.wait_for(lambda e: e["type"] == "scd.progress" and e["data"]["iteration"] >= 3, timeout=120)
    asked = time.monotonic()
    comfy_server.interrupt()
    run.wait_for(lambda e: e["type"] == "execution_interrupted", timeout=10)
    assert time.monotonic() - asked < 1.0
    run.wait_done(timeout=30)
    assert run.status == "interrupted"
    assert run.of_type("scd.progress")[-1]["total"] < run.of_type("scd.progress")[-1]["num_tokens"]

    again = comfy_server.run(pipeline("demo", "7", seed=203, window=16))
    assert again.status == "success", again.events[-3:]


@pytest.mark.parametrize("change, expected", [
    ({"3": {"window": -1}}, "Value -1 smaller than min of 0"),  # 0 is "auto"
    ({"3": {"coupler": "greedy"}}, f"coupler: 'greedy' not in {list(COUPLERS)}"),
    ({"3": {"draft_init": "below"}}, "draft_init: 'below' not in"),
    ({"1": {"model": "no-such-folder"}}, "model 'no-such-folder' not found"),
    ({"1": {"device": "tpu"}}, "device: 'tpu' not in ['auto', 'cpu', 'cuda', 'mps']"),
    ({"1": {"dtype": "int8"}}, "dtype: 'int8' not in"),
    ({"1": {"quantize": "int4"}}, "quantize: 'int4' not in ['auto', 'none', 'int8', 'nf4']"),
    ({"3": {"candidates": 9}}, "Value 9 bigger than max of 8"),
])
def test_invalid_inputs_are_rejected_clearly(comfy_server: ComfyServer, change: dict[str, Any],
                                             expected: str) -> None:
    graph = pipeline("demo", "7", seed=303)
    for node_id, inputs in change.items():
        graph[node_id]["inputs"].update(inputs)
    with pytest.raises(PromptRejected) as rejected:
        comfy_server.start_prompt(graph)
    assert rejected.value.status == 400
    node_errors = rejected.value.body["node_errors"]
    assert expected in json.dumps(node_errors, ensure_ascii=False)
    # each problem against the input it concerns: the frontend marks exactly these inputs
    ((node_id, inputs),) = change.items()
    flagged = {error["extra_info"]["input_name"] for error in node_errors[node_id]["errors"]}
    assert flagged == set(inputs), f"{sorted(flagged)} flagged for a bad {sorted(inputs)}"
    assert_serving(comfy_server)


def test_a_folder_without_a_model_is_not_listed_and_refused_clearly(comfy_server: ComfyServer,
                                                                    tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a model")
    name = comfy_server.add_model("not-a-model", tmp_path)
    assert name not in comfy_server.object_info("SCDModelLoader")["input"]["required"]["model"][1]["options"]
    with pytest.raises(PromptRejected) as rejected:
        comfy_server.start_prompt(pipeline(name, "7", seed=404))
    errors = rejected.value.body["node_errors"]["1"]["errors"]
    assert {error["extra_info"]["input_name"] for error in errors} == {"model"}
    assert "is not a model folder this pack can load (found: notes.txt)" in json.dumps(errors)
    assert_serving(comfy_server)


def test_candidates_run_and_a_coupler_without_them_is_an_execution_error(comfy_server: ComfyServer) -> None:
    """`candidates` is optional (the pipelines above leave it out); set, the run feeds trees."""
    run = comfy_server.run(pipeline("demo", "7", seed=505, window=16, candidates=2))
    assert run.status == "success", run.events[-3:]
    assert "2 candidates" in summary_text(run)
    run = comfy_server.run(pipeline("demo", "7", seed=505, coupler="faithful", candidates=2))
    assert run.status == "error"
    (error,) = run.of_type("execution_error")
    assert error["node_id"] == "3" and "candidates" in error["exception_message"]
    assert_serving(comfy_server)


def test_the_sampler_reserves_memory_for_its_batch(comfy_server: ComfyServer) -> None:
    """What the sampler asks ComfyUI's model management to free before loading (its log says it: on the CPU
    nothing is freed, so the status line leaves it out) grows with the batch: batch 4 holds 4 KV caches."""
    reserved = []
    for batch_size in (1, 4):
        run = comfy_server.run(pipeline("demo", "3", seed=5, batch_size=batch_size))
        assert run.status == "success", run.events[-3:]
        log = comfy_server.log_path.read_text(errors="replace")
        pattern = rf"SCD Sampler \(model 'demo'\): reserved ([\d.]+) MiB for the KV cache and distributions of " \
                  rf"{batch_size} images?\b"
        reserved.append(float(re.findall(pattern, log)[-1]))
    assert reserved[1] == pytest.approx(4 * reserved[0], abs=0.02) and reserved[0] > 0
