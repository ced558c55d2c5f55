"""The shipped Emu3.5-Image workflow in a real ComfyUI server, on the tiny folder in the published layout: as
shipped (text to image), and with an SCD Image Prompt (task x2i) holding a reference image; the shipped story
workflow on the tiny base copy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
import torch
from PIL import Image

from comfy_server import REPO_ROOT, ComfyServer
from emu3p5_fixture import tiny_emu3p5_base_dir, tiny_emu3p5_dir  # noqa: F401  (fixtures)
from test_server import output_images

from scd_core import SamplerConfig, generate, load_model
from scd_core.images.image_prompt import add_image
from scd_core.models.families.emu3p5_auto import generate_auto
from scd_core.models.families.emu3p5_story import StoryOptions, decode_images, generate_story

WIDTH, HEIGHT = 48, 32  # 2 rows of 3 codes and their row ends: 8 positions
PROMPT = "A red fox sitting in fresh snow under a pine tree at sunrise, soft golden light, detailed photograph"


@pytest.fixture(scope="module")
def server_model(comfy_server: ComfyServer, tiny_emu3p5_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny folder with room for a reference image at the authors' 1024 x 1024 px (4160 positions); its
    rotary positions have no weights, so only config.json changes."""
    folder = Path(shutil.copytree(tiny_emu3p5_dir, tmp_path_factory.mktemp("server") / "Emu3.5-Image"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 8192}))
    comfy_server.add_model(folder.name, folder)
    return folder


def shipped_graph(model: str) -> dict:
    graph = json.loads((REPO_ROOT / "workflows" / "api" / "scd_emu3p5_image_api.json").read_text())
    graph["1"]["inputs"]["model"] = model
    graph["2"]["inputs"] |= {"width": WIDTH, "height": HEIGHT}
    assert graph["2"]["inputs"]["prompt"] == PROMPT
    graph["3"]["inputs"]["window"] = 8
    return graph


def assert_ran(comfy_server: ComfyServer, graph: dict) -> tuple[np.ndarray, list[str]]:
    """Runs `graph`; its image at the requested size (as the server saved it), every token counted."""
    run = comfy_server.run(graph, timeout=600)
    assert run.status == "success", run.events[-3:]
    images = output_images(comfy_server, run, ["5"])
    assert [image.size for image in images] == [(WIDTH, HEIGHT)]
    events = [data for data in run.of_type("scd.progress") if data["node"] == "3"]
    assert sum(e["committed"] for e in events) == events[-1]["num_tokens"] == 2 * (3 + 1)
    return np.asarray(images[0].convert("RGB")), run.texts


def core_image(folder: Path, reference: Optional[torch.Tensor]) -> np.ndarray:
    """The same generation in the core (the node's defaults: float32 on the CPU, seed 42, faithful, window 8),
    as SaveImage writes it."""
    model = load_model(folder, device="cpu", dtype="float32")
    model.set_image_size(WIDTH, HEIGHT)
    with torch.inference_mode():
        cond = model.encode(PROMPT)
        if reference is not None:
            cond = add_image(model, cond, reference, "x2i").cond
        tokens = generate(model, cond, SamplerConfig(coupler="faithful", window=8, seed=42)).tokens
        return np.clip(255.0 * model.decode(tokens)[0].numpy(), 0, 255).astype(np.uint8)


def test_shipped_emu3p5_workflow_and_x2i_on_the_tiny_folder(comfy_server: ComfyServer, server_model: Path) -> None:
    """The API twin with the model and size swapped, then with a Load Image and an SCD Image Prompt (task x2i)
    between the prompt and the sampler: the reference image is resized to about 1024 x 1024 px as the authors do
    and encoded into the prompt.  Each image is the core's with the same settings, and the two differ."""
    t2i, _ = assert_ran(comfy_server, shipped_graph(server_model.name))
    gen = torch.Generator().manual_seed(0)
    pixels = (torch.rand(300, 200, 3, generator=gen) * 255).to(torch.uint8)
    (comfy_server.base_dir / "input").mkdir(exist_ok=True)
    Image.fromarray(pixels.numpy()).save(comfy_server.base_dir / "input" / "emu3p5_reference.png")
    graph = shipped_graph(server_model.name)
    graph["10"] = {"class_type": "LoadImage", "inputs": {"image": "emu3p5_reference.png"}}
    graph["11"] = {"class_type": "SCDImagePrompt",
                   "inputs": {"model": ["1", 0], "cond": ["2", 0], "image": ["10", 0], "task": "x2i",
                              "keep_top": 0.5, "image_cfg": -1.0}}
    graph["3"]["inputs"]["conditioning"] = ["11", 0]
    x2i, texts = assert_ran(comfy_server, graph)
    assert any("image added for x2i" in text and "resized to the model's 832 x 1248 px" in text for text in texts)
    for served, reference in ((t2i, None), (x2i, pixels[None].float() / 255)):
        assert np.abs(served.astype(int) - core_image(server_model, reference).astype(int)).max() <= 1
    assert np.abs(t2i.astype(int) - x2i.astype(int)).max() > 1


@pytest.fixture(scope="module")
def server_base_model(comfy_server: ComfyServer, tiny_emu3p5_base_dir: Path,
                      tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny base copy (it writes the size 10*20 itself) in the server's models as Emu3.5."""
    folder = Path(shutil.copytree(tiny_emu3p5_base_dir, tmp_path_factory.mktemp("server") / "Emu3.5"))
    comfy_server.add_model(folder.name, folder)
    return folder


def test_shipped_emu3p5_workflow_with_size_auto_and_tiles(comfy_server: ComfyServer, server_base_model: Path) -> None:
    """The T2I API twin on the base copy with Prompt Encode's size auto and VQ Decode's tile_size 64: the image
    comes out at the size the copy writes (10 x 20 codes: 320 x 160 px), every token counted, with the core's
    pixels (generate_auto, the same settings, decoded whole)."""
    graph = shipped_graph(server_base_model.name)
    graph["2"]["inputs"] |= {"width": 0, "height": 0, "size": "auto"}
    graph["4"]["inputs"]["tile_size"] = 64
    run = comfy_server.run(graph, timeout=600)
    assert run.status == "success", run.events[-3:]
    (image,) = output_images(comfy_server, run, ["5"])
    assert image.size == (320, 160)
    events = [data for data in run.of_type("scd.progress") if data["node"] == "3"]
    assert sum(e["committed"] for e in events) == events[-1]["num_tokens"] == 10 * 21
    model = load_model(server_base_model, device="cpu", dtype="float32")
    with torch.inference_mode():
        result, _ = generate_auto(model, model.encode(PROMPT), SamplerConfig(coupler="faithful", window=8, seed=42))
        core = np.clip(255.0 * model.decode(result.tokens)[0].numpy(), 0, 255).astype(np.uint8)
    assert np.abs(np.asarray(image.convert("RGB")).astype(int) - core.astype(int)).max() <= 1


STORY_RUN = {"max_new_tokens": 20, "width": 32, "height": 16, "window": 4}  # the tiny copy's budget and size


def story_twin(name: str, folder: Path) -> dict:
    """A story workflow's API twin with the model, budget and size swapped for the tiny copy in `folder`."""
    graph = json.loads((REPO_ROOT / "workflows" / "api" / f"{name}_api.json").read_text())
    graph["1"]["inputs"]["model"] = folder.name
    graph["2"]["inputs"] |= STORY_RUN
    return graph


def served_story(comfy_server: ComfyServer, graph: dict) -> tuple[list[np.ndarray], str, list[str]]:
    """The saved images, the text and the progress lines of a story graph run on the server."""
    run = comfy_server.run(graph, timeout=600)
    assert run.status == "success", run.events[-3:]
    served = [np.asarray(image.convert("RGB")) for image in output_images(comfy_server, run, ["3"])]
    (text,) = run.history()["outputs"]["4"]["text"]
    return served, text, run.texts


def core_story(folder: Path, graph: dict, references: Optional[list[torch.Tensor]] = None) -> tuple:
    """(the core's story with the graph's settings: faithful, seed 42, CFG 3; its decoded 8-bit images)."""
    model = load_model(folder, device="cpu", dtype="float32")
    with torch.inference_mode():
        story = generate_story(model, graph["2"]["inputs"]["prompt"], SamplerConfig(window=4, seed=42, cfg_scale=3.0),
                               StoryOptions(max_new_tokens=20, size=(1, 2)), references=references or ())
        expected = [np.clip(255.0 * image.numpy(), 0, 255).astype(np.uint8) for image in decode_images(model, story)]
    return story, expected


def same_story(served: list[np.ndarray], text: str, story: Any, expected: list[np.ndarray]) -> bool:
    return (text == story.text.strip() and len(served) == len(expected) >= 1
            and all(np.abs(a.astype(int) - b.astype(int)).max() <= 1 for a, b in zip(served, expected)))


def test_shipped_story_workflow_on_the_tiny_base_folder(comfy_server: ComfyServer, server_base_model: Path) -> None:
    """The story workflow's API twin (model, budget and size swapped for the tiny copy): the saved images and the
    text are the core's story with the same settings (faithful, seed 42, CFG 3), and each image had its
    progress."""
    graph = story_twin("scd_emu3p5_story", server_base_model)
    served, text, progress = served_story(comfy_server, graph)
    story, expected = core_story(server_base_model, graph)
    assert same_story(served, text, story, expected) and len(served) == 2
    assert any(line.endswith("tokens | image 2") for line in progress)


def test_shipped_story_with_a_reference_on_the_tiny_base_folder(comfy_server: ComfyServer, server_base_model: Path,
                                                                tmp_path: Path) -> None:
    """The story-from-your-picture workflow's API twin (model, budget and size swapped for the tiny copy; its
    Load Image given a picture in the server's input folder): the images and the text are the core's story with
    that picture as its reference, and differ from the story without it."""
    # the authors' reference area (720^2 px: about 2,000 codes in the prompt) needs more positions than the copy has
    folder = Path(shutil.copytree(server_base_model, tmp_path / "Emu3.5-long"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 4096}))
    comfy_server.add_model(folder.name, folder)
    graph = story_twin("scd_emu3p5_story_references", folder)
    loader = next(key for key, node in graph.items() if node["class_type"] == "LoadImage")
    assert graph["2"]["inputs"]["references"] == [loader, 0]
    pixels = torch.randint(0, 256, (48, 64, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    (comfy_server.base_dir / "input").mkdir(exist_ok=True)
    Image.fromarray(pixels.numpy()).save(comfy_server.base_dir / "input" / graph[loader]["inputs"]["image"])
    served, text, _ = served_story(comfy_server, graph)
    story, expected = core_story(folder, graph, [pixels.float() / 255])
    assert same_story(served, text, story, expected)
    assert story.tokens != core_story(folder, graph)[0].tokens
