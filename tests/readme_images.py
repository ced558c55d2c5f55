"""Regenerates the README's pictures in web/readme/ and the demo workflows' thumbnails (run after the demo
model or the UI changes):

- ar_vs_scd.png: the quick start's `python -m scd_core generate --compare --seeds 0-7` on the demo model (AR,
  SCD-faithful, SJD and SCD: mean calls over 8 seeds, the images of the first two);
- comfyui_sampler.png: the shipped demo workflow run in a real ComfyUI in Debian's chromium (the browser
  test's machinery), cropped to the sampler with its live chart and the outputs next to it;
- workflows/scd_demo.jpg, scd_demo_ar_vs_scd.jpg: what those two workflows produce, with their call counts;
- the other workflows' thumbnails (their models are not here to run): a rendering of the graph itself, with
  the title the template browser shows (web/templates.json).

    .venv-test/bin/python tests/readme_images.py [NAME ...]   # NAME: compare, sampler, thumbnails; default all
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import requests
import torch
from PIL import Image, ImageDraw, ImageFont
from playwright.sync_api import Page, sync_playwright

from comfy_server import REPO_ROOT, ComfyServer
from test_browser import CHART, CHROMIUM_FLAGS, EXTENSION_NAME, GRAPH_BOUNDS, queue_and_wait, read_workflow

sys.path.insert(0, str(REPO_ROOT))  # run as a script from tests/: the package sits at the repository root
from scd_core import SamplerConfig, generate, load_model  # noqa: E402
from scd_core.images.image_prompt import add_image  # noqa: E402

OUT = REPO_ROOT / "web" / "readme"
WORKFLOWS = REPO_ROOT / "workflows"
FONTS = "/usr/share/fonts/truetype/dejavu"  # Debian's fonts-dejavu-core, which chromium brings
THUMB = 512
COMPARE_ARGS = ["--model", "demo", "--prompt", "7", "--compare", "--seeds", "0-7"]  # the README's quick start
WORKFLOW = "scd_demo.json"
# Canvas area to show, in graph coordinates: the sampler (pos 780, 80) to the saved image and the chart preview.
REGION = (770, 44, 1762, 800)  # left, top (above the sampler's title), right, bottom
INSET = 200  # pixels between the canvas' corner and the region, clear of the menus and tabs
VIEWPORT = {"width": 1700, "height": 1200}
GRAPH_VIEWPORT = {"width": 2400, "height": 1500}  # a whole graph at scale 1, where the frontend draws all text
TEMPLATES = json.loads((REPO_ROOT / "web" / "templates.json").read_text())


def compare_image(path: Path) -> None:
    subprocess.run([sys.executable, "-m", "scd_core", "generate", *COMPARE_ARGS, "-o", str(path)],
                   cwd=REPO_ROOT, check=True, stderr=subprocess.DEVNULL)


@contextmanager
def comfyui_page(viewport: dict[str, int]) -> Iterator[Page]:
    """The frontend of a fresh ComfyUI with this pack, in Debian's chromium."""
    server = ComfyServer(Path(tempfile.mkdtemp(prefix="scd_readme_")))
    server.start()
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_FLAGS,
                                                 headless=True)
            page = browser.new_page(viewport=viewport)
            # no template browser on the first visit; no badge naming the pack's folder over every node
            for setting, value in (("Comfy.TutorialCompleted", True), ("Comfy.NodeBadge.NodeSourceBadgeMode", "None")):
                requests.post(f"{server.url}/settings/{setting}", json=value, timeout=10).raise_for_status()
            page.goto(server.url)
            page.wait_for_function(f"window.app?.graph && window.app.extensions.some((e) => e.name === "
                                   f"{EXTENSION_NAME!r})", timeout=60_000)
            yield page
            browser.close()
    finally:
        server.stop()


def canvas_shot(page: Page, left: float, top: float, width: float, height: float) -> bytes:
    """Graph region (left, top, width, height) at scale 1, INSET pixels into the canvas, clear of the menus."""
    page.evaluate("""([x, y]) => {
        app.canvas.ds.scale = 1; app.canvas.ds.offset = [-x, -y]; app.canvas.setDirty(true, true); }""",
                  [left - INSET, top - INSET])
    page.mouse.move(page.viewport_size["width"] // 2, page.viewport_size["height"] - 4)  # no hover highlight
    page.wait_for_timeout(500)  # the canvas redraws
    box = page.evaluate("() => { const r = app.canvas.canvas.getBoundingClientRect(); return {x: r.left, y: r.top}; }")
    return page.screenshot(clip={"x": box["x"] + INSET, "y": box["y"] + INSET, "width": width, "height": height})


def sampler_screenshot(path: Path) -> None:
    with comfyui_page(VIEWPORT) as page:
        page.evaluate("async (graph) => { await app.loadGraphData(graph); }", read_workflow(WORKFLOW))
        # the workflow as shipped (its seed included): the picture shows what a user's first run shows
        outcome = queue_and_wait(page)
        if outcome != "success":
            raise RuntimeError(f"the demo workflow failed: {outcome}")
        page.wait_for_function(f"document.querySelector({CHART!r}).dataset.done === 'true'")
        page.wait_for_function("""() => app.graph.nodes.filter((n) => n.type.endsWith("Image"))
            .every((n) => n.imgs?.length && n.imgs.every((img) => img.complete))""")
        left, top, right, bottom = REGION
        path.write_bytes(canvas_shot(page, left, top, right - left, bottom - top))


def graph_thumbnails() -> list[Path]:
    """The workflows whose models are not here: the graph as the frontend draws it, and its title."""
    written = []
    with comfyui_page(GRAPH_VIEWPORT) as page:
        for template in TEMPLATES:
            if template["name"].startswith("scd_demo"):
                continue  # those show what they produce (demo_thumbnails)
            page.evaluate("async (graph) => { await app.loadGraphData(graph); }",
                          read_workflow(f"{template['name']}.json"))
            left, top, right, bottom = page.evaluate(GRAPH_BOUNDS)
            margin = 20
            shot = canvas_shot(page, left - margin, top - margin, right - left + 2 * margin,
                               bottom - top + 2 * margin)
            path = WORKFLOWS / f"{template['name']}.jpg"
            card(path, [Image.open(io.BytesIO(shot)).convert("RGB")], template["title"], template["description"])
            written.append(path)
    return written


def card(path: Path, pictures: list[Image.Image], title: str, subtitle: str) -> None:
    """A 512 x 512 card for the template browser: the pictures side by side, then a title and a subtitle."""
    canvas = Image.new("RGB", (THUMB, THUMB), (28, 28, 28))
    draw = ImageDraw.Draw(canvas)
    bold, plain = (ImageFont.truetype(f"{FONTS}/{name}.ttf", size) for name, size in (("DejaVuSans-Bold", 22),
                                                                                      ("DejaVuSans", 16)))
    lines = wrapped(draw, subtitle, plain, THUMB - 40)
    text_top = THUMB - 52 - 22 * len(lines)
    room_w, room_h = THUMB - 32, text_top - 32
    scale = min(room_w / sum(p.width for p in pictures), room_h / max(p.height for p in pictures))
    sizes = [(round(p.width * scale), round(p.height * scale)) for p in pictures]
    x = (THUMB - sum(w for w, _ in sizes)) // 2
    for picture, (w, h) in zip(pictures, sizes):
        canvas.paste(picture.resize((w, h), Image.Resampling.LANCZOS), (x, 16 + (room_h - h) // 2))
        x += w
    draw.text((20, text_top), title, fill=(235, 235, 235), font=bold)
    for i, line in enumerate(lines):
        draw.text((20, text_top + 36 + 22 * i), line, fill=(170, 170, 170), font=plain)
    canvas.save(path, quality=90)


def wrapped(draw: ImageDraw.ImageDraw, text: str, font: ImageFont.FreeTypeFont, width: int) -> list[str]:
    lines = [""]
    for word in text.split():
        candidate = f"{lines[-1]} {word}".strip()
        if lines[-1] and draw.textlength(candidate, font=font) > width:
            lines.append(word)
        else:
            lines[-1] = candidate
    return lines


def digits(images: torch.Tensor) -> list[Image.Image]:
    """Decoded images as pictures, square and at most 384 px so a single digit does not fill the card."""
    side = min(384, (THUMB - 64) // len(images))
    return [Image.fromarray((image.numpy() * 255).round().astype("uint8")).resize((side, side), Image.Resampling.BICUBIC)
            for image in images]


def demo_thumbnails() -> list[Path]:
    """The demo workflows' settings (digit 7, seed 42, coupler faithful, model defaults): SCD at window 32, and AR
    next to it (the same image)."""
    model = load_model("demo")
    cond = model.encode("7")
    scd = generate(model, cond, SamplerConfig(coupler="faithful", window=32, seed=42))
    ar = generate(model, cond, SamplerConfig(coupler="faithful", window=1, seed=42))
    card(WORKFLOWS / "scd_demo.jpg", digits(model.decode(scd.tokens)),
         f"SCD: {scd.nfe} model calls for {model.num_tokens} tokens", "demo model, digit 7, window 32")
    card(WORKFLOWS / "scd_demo_ar_vs_scd.jpg", digits(torch.cat([model.decode(ar.tokens), model.decode(scd.tokens)])),
         f"AR {ar.nfe} calls  |  SCD {scd.nfe} calls", "same seed, coupler faithful: window 1 and 32, one image")
    # scd_demo_continuation: that 7 with its lower half erased (grey), then the second sampler's 4 completions
    digit = model.decode(scd.tokens)
    given = add_image(model, cond, digit, keep_top=0.5).cond
    completed = generate(model, given, SamplerConfig(coupler="faithful", window=32, seed=7), batch_size=4)
    erased = digit.clone()
    erased[:, digit.shape[1] // 2:] = 0.5
    images = model.decode(completed.tokens)
    grid = torch.cat([torch.cat(list(images[:2]), dim=1), torch.cat(list(images[2:]), dim=1)])  # 2 x 2
    pictures = [Image.fromarray((image.numpy() * 255).round().astype("uint8")) for image in (erased[0], grid)]
    card(WORKFLOWS / "scd_demo_continuation.jpg", pictures, f"top half kept: {completed.nfe} calls",
         "a half-erased 7, completed 4 ways; the kept rows cost no calls")
    return [WORKFLOWS / "scd_demo.jpg", WORKFLOWS / "scd_demo_ar_vs_scd.jpg", WORKFLOWS / "scd_demo_continuation.jpg"]


def main(names: list[str]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    written = []
    if "compare" in names:
        compare_image(OUT / "ar_vs_scd.png")
        written.append(OUT / "ar_vs_scd.png")
    if "sampler" in names:
        sampler_screenshot(OUT / "comfyui_sampler.png")
        written.append(OUT / "comfyui_sampler.png")
    if "thumbnails" in names:
        written += demo_thumbnails() + graph_thumbnails()
    for path in written:
        print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main(sys.argv[1:] or ["compare", "sampler", "thumbnails"])
