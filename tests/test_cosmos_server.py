"""The tiny Cosmos model through the pack's nodes in a real ComfyUI server: clip -> continuation -> video file."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import torch

from comfy_server import REPO_ROOT, ComfyServer
from cosmos_fixture import FRAME_SIZE, context_frames, write_cosmos

WORKFLOW = REPO_ROOT / "workflows" / "api" / "scd_cosmos_continuation_api.json"
CLIP = "scd_test_clip.webm"
FRAMES_OUT = 25  # 2 context latent frames + 2 generated, decoded: 1 + 3 * 8 frames


@pytest.fixture(scope="module")
def tiny_cosmos(comfy_server: ComfyServer) -> str:
    """A tiny Cosmos-4B folder and its sibling tokenizer folder under BASE/models/Cosmos/; the loader's label."""
    folder = write_cosmos(comfy_server.base_dir / "models" / "Cosmos", "4B")
    return f"Cosmos/{folder.name}"


@pytest.fixture(scope="module")
def clip(comfy_server: ComfyServer) -> str:
    """A 12-frame clip at the tiny model's frame size in ComfyUI's input folder."""
    import av

    path = comfy_server.base_dir / "input" / CLIP
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libvpx-vp9", rate=Fraction(8))
        stream.height, stream.width = FRAME_SIZE
        stream.pix_fmt = "yuv420p"
        for frame in context_frames(12):
            image = (frame * 255).round().to(torch.uint8).numpy()
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        container.mux(stream.encode())
    return CLIP


def saved_videos(server: ComfyServer) -> list[Path]:
    return sorted((server.base_dir / "output" / "video").glob("scd_cosmos*"))


def frame_count(path: Path) -> int:
    import av

    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(video=0))


def test_loader_lists_cosmos_but_not_its_tokenizer_folder(comfy_server: ComfyServer, tiny_cosmos: str) -> None:
    options = comfy_server.object_info("SCDModelLoader")["input"]["required"]["model"][1]["options"]
    assert tiny_cosmos in options
    assert not [name for name in options if "Tokenizer" in name]
    info = comfy_server.object_info("SCDVideoContext")
    assert {"model", "frames"} <= set(info["input"]["required"]) and "prompt" in info["input"]["optional"]


def test_shipped_workflow_turns_a_clip_into_a_saved_continuation(comfy_server: ComfyServer, tiny_cosmos: str,
                                                                 clip: str) -> None:
    graph: dict[str, Any] = json.loads(WORKFLOW.read_text())
    graph["1"]["inputs"]["model"] = tiny_cosmos
    graph["2"]["inputs"]["file"] = clip
    graph["6"]["inputs"]["window"] = 4
    before = saved_videos(comfy_server)
    run = comfy_server.run(graph)
    assert run.status == "success", run.events[-3:]
    events = [e["data"] for e in run.events if e["type"] == "scd.progress"]
    assert sum(e["committed"] for e in events) == events[-1]["num_tokens"] == 12
    new = [path for path in saved_videos(comfy_server) if path not in before]
    assert len(new) == 1 and frame_count(new[0]) == FRAMES_OUT


def _context_graph(model: str, frames: int) -> dict[str, Any]:
    height, width = FRAME_SIZE
    return {
        "1": {"class_type": "SCDModelLoader", "inputs": {"model": model, "device": "auto", "dtype": "auto"}},
        "2": {"class_type": "EmptyImage", "inputs": {"width": width, "height": height, "batch_size": frames,
                                                     "color": 0x3366CC}},
        "3": {"class_type": "SCDVideoContext", "inputs": {"model": ["1", 0], "frames": ["2", 0], "prompt": ""}},
        "4": {"class_type": "SCDSampler", "inputs": {
            "model": ["1", 0], "conditioning": ["3", 0], "coupler": "maximal", "window": 8, "cfg_scale": -1.0,
            "seed": 3, "temperature": 1.0, "top_k": 0, "top_p": 0.8, "draft_init": "auto", "batch_size": 1}},
        "5": {"class_type": "SCDVQDecode", "inputs": {"model": ["1", 0], "tokens": ["4", 0]}},
        "6": {"class_type": "PreviewImage", "inputs": {"images": ["5", 0]}},
    }


def test_one_frame_context_and_continuation_only_decode(comfy_server: ComfyServer, tiny_cosmos: str) -> None:
    run = comfy_server.run(_context_graph(tiny_cosmos, 1))
    assert run.status == "success", run.events[-3:]
    images = run.history()["outputs"]["6"]["images"]
    assert len(images) == 17  # every free latent frame (3 of the tiny model's 4) alone: 1 + 2 * 8 frames


def test_wrong_frame_count_is_a_clear_error(comfy_server: ComfyServer, tiny_cosmos: str) -> None:
    run = comfy_server.run(_context_graph(tiny_cosmos, 5))
    assert run.status == "error"
    error = run.of_type("execution_error")[0]
    assert error["node_id"] == "3" and "1 or 9 context frames, got 5" in error["exception_message"]
