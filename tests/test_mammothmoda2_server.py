"""The shipped MammothModa2 workflow in a real ComfyUI server, on the tiny Preview folder in the published layout."""

from __future__ import annotations

from pathlib import Path

from comfy_server import ComfyServer
from mammothmoda2_fixture import tiny_preview_dir  # noqa: F401  (fixture)
from test_server import run_shipped_workflow

WIDTH, HEIGHT = 96, 64  # one code per 32 px: a 2 x 3 grid, 2 rows of 3 codes and a row end


def test_shipped_mammothmoda2_workflow_runs_on_the_tiny_folder(comfy_server: ComfyServer,
                                                               tiny_preview_dir: Path) -> None:  # noqa: F811
    """Its API twin with the model and size swapped: the tokens sampled, then the DiT (50 steps) and the VAE give
    the image at the requested size; the progress events count every token."""
    images, events = run_shipped_workflow(comfy_server, "scd_mammothmoda2", tiny_preview_dir, (WIDTH, HEIGHT), 4)
    assert [image.size for image in images] == [(WIDTH, HEIGHT)]
    assert sum(e["committed"] for e in events) == events[-1]["num_tokens"] == 2 * (3 + 1)
