"""The shipped GLM-Image workflow in a real ComfyUI server, on the tiny folder in the published layout."""

from __future__ import annotations

from pathlib import Path

from comfy_server import ComfyServer
from glm_image_fixture import HEIGHT, WIDTH, tiny_glm_image_dir  # noqa: F401  (fixture)
from test_server import run_shipped_workflow


def test_shipped_glm_image_workflow_runs_on_the_tiny_folder(comfy_server: ComfyServer,
                                                            tiny_glm_image_dir: Path) -> None:
    """Its API twin with the model and size swapped: both grids sampled (18 x 13 preview, 4 x 3 large), the
    DiT and VAE decode the image at the requested size, the progress events count every token."""
    images, events = run_shipped_workflow(comfy_server, "scd_glm_image", tiny_glm_image_dir, (WIDTH, HEIGHT), 8)
    assert [image.size for image in images] == [(WIDTH, HEIGHT)]
    assert sum(e["committed"] for e in events) == events[-1]["num_tokens"] == 18 * 13 + 4 * 3
