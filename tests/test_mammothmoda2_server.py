"""The shipped MammothModa2 workflow in a real ComfyUI server, on the tiny Preview folder in the published layout."""

from __future__ import annotations

import json
from pathlib import Path

from comfy_server import REPO_ROOT, ComfyServer
from mammothmoda2_fixture import tiny_preview_dir  # noqa: F401  (fixture)
from test_server import output_images

WIDTH, HEIGHT = 96, 64  # one code per 32 px: a 2 x 3 grid, 2 rows of 3 codes and a row end


def test_shipped_mammothmoda2_workflow_runs_on_the_tiny_folder(comfy_server: ComfyServer,
                                                               tiny_preview_dir: Path) -> None:  # noqa: F811
    """Its API twin with the model and size swapped: the tokens sampled, then the DiT (50 steps) and the VAE give
    the image at the requested size; the progress events count every token."""
    graph = json.loads((REPO_ROOT / "workflows" / "api" / "scd_mammothmoda2_api.json").read_text())
    graph["1"]["inputs"]["model"] = comfy_server.add_model("tiny-mammothmoda2", tiny_preview_dir)
    graph["2"]["inputs"] |= {"width": WIDTH, "height": HEIGHT}
    graph["3"]["inputs"]["window"] = 4
    run = comfy_server.run(graph, timeout=900)  # the first decode imports diffusers and reads the decoder
    assert run.status == "success", run.events[-3:]
    assert [image.size for image in output_images(comfy_server, run, ["5"])] == [(WIDTH, HEIGHT)]
    events = [data for data in run.of_type("scd.progress") if data["node"] == "3"]
    assert sum(e["committed"] for e in events) == events[-1]["num_tokens"] == 2 * (3 + 1)
