"""Regenerates the README's pictures in web/readme/ and the demo workflows' thumbnails (run after the demo
model or the UI changes):

- ar_vs_scd.png: the quick start's `python -m scd_core generate --compare --seeds 8` on the demo model (AR, SJD
  and SCD: mean calls over 8 seeds, the images of the first two);
- comfyui_sampler.png: the shipped demo workflow run in a real ComfyUI in Debian's chromium (the browser
  test's machinery), cropped to the sampler with its live chart and the outputs next to it;
- workflows/scd_demo.jpg, scd_demo_ar_vs_scd.jpg: what those two workflows produce, with their call counts.

    .venv-test/bin/python tests/readme_images.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import requests
import torch
from PIL import Image, ImageDraw, ImageFont
from playwright.sync_api import sync_playwright

from comfy_server import REPO_ROOT, ComfyServer
from test_browser import CHART, CHROMIUM_FLAGS, EXTENSION_NAME, RUN_TIMEOUT_MS, read_workflow

sys.path.insert(0, str(REPO_ROOT))  # run as a script from tests/: the package sits at the repository root
from scd_core import SamplerConfig, generate, load_model  # noqa: E402

OUT = REPO_ROOT / "web" / "readme"
WORKFLOWS = REPO_ROOT / "workflows"
FONTS = "/usr/share/fonts/truetype/dejavu"  # Debian's fonts-dejavu-core, which chromium brings
THUMB = 512
COMPARE_ARGS = ["--model", "demo", "--prompt", "7", "--compare", "--seeds", "8"]  # the README's quick start
WORKFLOW = "scd_demo.json"
# Canvas area to show, in graph coordinates: the sampler (pos 780, 80) to the saved image and the chart preview.
REGION = (770, 44, 1762, 800)  # left, top (above the sampler's title), right, bottom
INSET = 200  # pixels between the canvas' corner and the region, clear of the menus and tabs
VIEWPORT = {"width": 1700, "height": 1200}
SEED = 7  # a seed whose 7 reads as a 7


def compare_image(path: Path) -> None:
    subprocess.run([sys.executable, "-m", "scd_core", "generate", *COMPARE_ARGS, "-o", str(path)],
                   cwd=REPO_ROOT, check=True, stderr=subprocess.DEVNULL)


def sampler_screenshot(path: Path) -> None:
    server = ComfyServer(Path(tempfile.mkdtemp(prefix="scd_readme_")))
    server.start()
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_FLAGS,
                                                 headless=True)
            page = browser.new_page(viewport=VIEWPORT)
            requests.post(f"{server.url}/settings/Comfy.TutorialCompleted", json=True, timeout=10).raise_for_status()
            page.goto(server.url)
            page.wait_for_function(f"window.app?.graph && window.app.extensions.some((e) => e.name === "
                                   f"{EXTENSION_NAME!r})", timeout=60_000)
            page.evaluate("async (graph) => { await app.loadGraphData(graph); }", read_workflow(WORKFLOW))
            page.evaluate("""(seed) => app.graph.nodes.filter((n) => n.type === "SCDSampler").forEach((n) => {
                n.widgets.find((w) => w.name === "seed").value = seed; })""", SEED)
            page.evaluate("""() => {
                const api = window.comfyAPI.api.api;
                window.scdRunOutcome = null;
                api.addEventListener("execution_success", () => { window.scdRunOutcome = "success"; });
                api.addEventListener("execution_error", ({detail}) => {
                    window.scdRunOutcome = detail.exception_message; });
                return app.queuePrompt(0, 1);
            }""")
            page.wait_for_function("window.scdRunOutcome !== null", timeout=RUN_TIMEOUT_MS)
            outcome = page.evaluate("window.scdRunOutcome")
            if outcome != "success":
                raise RuntimeError(f"the demo workflow failed: {outcome}")
            left, top, right, bottom = REGION
            # at scale 1, graph point (left, top) lands INSET pixels into the canvas, clear of the menus
            page.evaluate("""([x, y]) => {
                app.canvas.ds.scale = 1; app.canvas.ds.offset = [-x, -y]; app.canvas.setDirty(true, true); }""",
                          [left - INSET, top - INSET])
            page.wait_for_function(f"document.querySelector({CHART!r}).dataset.done === 'true'")
            page.wait_for_function("""() => app.graph.nodes.filter((n) => n.type.endsWith("Image"))
                .every((n) => n.imgs?.length && n.imgs.every((img) => img.complete))""")
            page.wait_for_timeout(500)  # the canvas redraws
            box = page.evaluate("() => { const r = app.canvas.canvas.getBoundingClientRect(); "
                                "return {x: r.left, y: r.top}; }")
            page.screenshot(path=str(path), clip={"x": box["x"] + INSET, "y": box["y"] + INSET,
                                                  "width": right - left, "height": bottom - top})
            browser.close()
    finally:
        server.stop()


def thumbnail(path: Path, images: torch.Tensor, title: str, subtitle: str) -> None:
    """A 512 x 512 card for the template browser: the images side by side, then a title and a subtitle."""
    card = Image.new("RGB", (THUMB, THUMB), (28, 28, 28))
    side = min(384, (THUMB - 64) // len(images))
    left = (THUMB - side * len(images)) // 2
    for i, image in enumerate(images):
        pixels = Image.fromarray((image.numpy() * 255).round().astype("uint8"))
        card.paste(pixels.resize((side, side), Image.Resampling.BICUBIC),
                   (left + i * side, (THUMB - 112 - side) // 2 + 16))
    draw = ImageDraw.Draw(card)
    bold, plain = (ImageFont.truetype(f"{FONTS}/{name}.ttf", size) for name, size in (("DejaVuSans-Bold", 22),
                                                                                      ("DejaVuSans", 18)))
    draw.text((20, THUMB - 80), title, fill=(235, 235, 235), font=bold)
    draw.text((20, THUMB - 42), subtitle, fill=(170, 170, 170), font=plain)
    card.save(path, quality=90)


def demo_thumbnails() -> None:
    """The demo workflows' settings (digit 7, seed 42, model defaults): SCD at window 32, and AR next to it."""
    model = load_model("demo")
    cond = model.encode("7")
    scd = generate(model, cond, SamplerConfig(window=32, seed=42))
    ar = generate(model, cond, SamplerConfig(window=1, seed=42))
    thumbnail(WORKFLOWS / "scd_demo.jpg", model.decode(scd.tokens),
              f"SCD: {scd.nfe} model calls for {model.num_tokens} tokens", "demo model, digit 7, window 32")
    thumbnail(WORKFLOWS / "scd_demo_ar_vs_scd.jpg", torch.cat([model.decode(ar.tokens), model.decode(scd.tokens)]),
              f"AR {ar.nfe} calls  |  SCD {scd.nfe} calls", "same seed, digit 7; left window 1, right 32")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    compare_image(OUT / "ar_vs_scd.png")
    sampler_screenshot(OUT / "comfyui_sampler.png")
    demo_thumbnails()
    for path in (OUT / "ar_vs_scd.png", OUT / "comfyui_sampler.png", WORKFLOWS / "scd_demo.jpg",
                 WORKFLOWS / "scd_demo_ar_vs_scd.jpg"):
        print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
