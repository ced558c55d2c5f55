"""The shipped GLM-Image workflow in a real ComfyUI server, on the tiny folder in the published layout."""

from __future__ import annotations

import json
from pathlib import Path

from comfy_server import REPO_ROOT, ComfyServer
from glm_image_fixture import HEIGHT, WIDTH, tiny_glm_image_dir  # noqa: F401  (fixture)
from test_server import output_images


def test_shipped_glm_image_workflow_runs_on_the_tiny_folder(comfy_server: ComfyServer,
                                                            tiny_glm_image_dir: Path) -> None:
    """Its API twin with the model and size swapped: both grids sampled (18 x 13 preview, 4 x 3 large), the
    DiT and VAE decode the image at the requested size, the progress events count every token."""
    graph = json.loads((REPO_ROOT / "workflows" / "api" / "scd_glm_image_api.json").read_text())
    graph["1"]["inputs"]["model"] = comfy_server.add_model("tiny-glm-image", tiny_glm_image_dir)
    graph["2"]["inputs"] |= {"width": WIDTH, "height": HEIGHT}
    graph["3"]["inputs"]["window"] = 8
    run = comfy_server.run(graph, timeout=900)  # the first decode imports diffusers and builds the pipeline
    assert run.status == "success", run.events[-3:]
    assert [image.size for image in output_images(comfy_server, run, ["5"])] == [(WIDTH, HEIGHT)]
    events = [data for data in run.of_type("scd.progress") if data["node"] == "3"]
    assert sum(e["committed"] for e in events) == events[-1]["num_tokens"] == 18 * 13 + 4 * 3
