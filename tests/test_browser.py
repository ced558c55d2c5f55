"""The node pack in a real browser: the served frontend loads the shipped workflows and the live chart on
SCDSampler draws while the demo model samples.

Needs Debian's chromium (tests/install_browser.sh) and the `comfy_server` fixture (a real ComfyUI with this
pack linked in).  Screenshots go to test-artifacts/ for a human to look at.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests
from playwright.sync_api import Browser, Page, sync_playwright

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO_ROOT / "workflows"
ARTIFACTS = REPO_ROOT / "test-artifacts"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]
EXTENSION_NAME = "comfyui-scd.AcceptanceChart"
CHART = ".scd-acceptance-chart canvas"
RUN_TIMEOUT_MS = 150_000
BROWSER_TEST_SEED = 918_273_645

# In-page helpers.  The bar colours are the widget's own (web/js/scd_widget.js); text is never drawn in them
# in the lower part of the plot, so counting exact matches there counts bar pixels.
COUNT_BAR_PIXELS = """(canvas) => {
    const ctx = canvas.getContext("2d");
    const top = Math.floor(canvas.height * 0.75);
    const pixels = ctx.getImageData(0, top, canvas.width, canvas.height - top).data;
    let bars = 0;
    for (let i = 0; i < pixels.length; i += 4) {
        const [r, g, b] = [pixels[i], pixels[i + 1], pixels[i + 2]];
        if ((r === 0x4c && g === 0xaf && b === 0x50) || (r === 0x7a && g === 0x7a && b === 0x7a)) bars++;
    }
    return bars;
}"""
SAMPLER_CHARTS = """() => app.graph.nodes.filter((n) => n.type === "SCDSampler").map((n) => ({
    id: String(n.id), state: {...n.scdChart.canvas.dataset}}))"""
# What each node needs: its widgets and slots (the frontend's computeSize) and room for the whole title
# (the frontend truncates a title wider than the node less twice the title height).
NODE_NEEDS = """() => app.graph.nodes.map((n) => {
    const ctx = app.canvas.ctx;
    ctx.font = n.titleFontStyle;
    const title = n.getTitle() ?? n.type;
    return {id: n.id, title, min: [...n.computeSize()],
            titleWidth: ctx.measureText(title).width + 2 * LiteGraph.NODE_TITLE_HEIGHT};
})"""


def read_workflow(name: str) -> dict[str, Any]:
    return json.loads((WORKFLOWS / name).read_text())


def combo_options(spec: list[Any]) -> list[Any] | None:
    """The choices of a combo input in /object_info: V1 lists them in place, V3 as "COMBO" with options."""
    if isinstance(spec[0], list):
        return spec[0]
    if spec[0] == "COMBO":
        return spec[1]["options"]
    return None


def is_upload_combo(spec: list[Any]) -> bool:
    """A loader's file choice (Load Video, Load Image): it lists the files of the user's input folder."""
    return len(spec) > 1 and isinstance(spec[1], dict) and any(key.endswith("_upload") for key in spec[1])


def ui_workflows() -> list[Path]:
    return sorted(WORKFLOWS.glob("*.json"))


def api_workflows() -> list[Path]:
    return sorted((WORKFLOWS / "api").glob("*_api.json"))


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = shutil.which("chromium")
    assert executable, "Debian's chromium is not installed; run tests/install_browser.sh"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser, comfy_server: Any) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1500, "height": 950})
    page = context.new_page()
    page_errors: list[str] = []
    page.on("pageerror", lambda error: page_errors.append(str(error)))
    page.on("console", lambda message: page_errors.append(message.text)
            if "already registered" in message.text and "scd" in message.text.lower() else None)
    # A first visit opens the template browser over the canvas; mark the tour as done for this server.
    requests.post(f"{comfy_server.url}/settings/Comfy.TutorialCompleted", json=True, timeout=10).raise_for_status()
    page.goto(comfy_server.url)
    page.wait_for_function(f"window.app?.graph && window.app.extensions.some((e) => e.name === {EXTENSION_NAME!r})",
                           timeout=60_000)
    registered = page.evaluate(f"window.app.extensions.filter((e) => e.name === {EXTENSION_NAME!r}).length")
    assert registered == 1, f"{EXTENSION_NAME} registered {registered} times"
    yield page
    context.close()
    assert not page_errors, f"uncaught errors in the page: {page_errors}"


def load_ui_workflow(page: Page, name: str) -> None:
    page.evaluate("async (graph) => { await app.loadGraphData(graph); }", read_workflow(name))
    # A seed no other test uses: ComfyUI would answer a repeated graph from its cache, without progress events.
    page.evaluate("""(seed) => app.graph.nodes.filter((n) => n.type === "SCDSampler").forEach((n) => {
        n.widgets.find((w) => w.name === "seed").value = seed; })""", BROWSER_TEST_SEED)


def synthetic_progress(page: Page, node_id: str, iteration: int, committed: int, total: int) -> None:
    page.evaluate("""(data) => window.comfyAPI.api.api.dispatchCustomEvent("scd.progress", data)""",
                  {"node": node_id, "iteration": iteration, "committed": committed, "total": total,
                   "num_tokens": 64, "nfe": iteration + 1, "acceptance": [1.0] * committed,
                   "calls_saved": total - iteration - 1})


def test_every_workflow_comes_as_ui_file_api_twin_and_thumbnail() -> None:
    # The template browser of frontend 1.32.9 asks for <name>.jpg next to <name>.json.
    assert ui_workflows(), "no workflows shipped"
    for ui_file in ui_workflows():
        assert (WORKFLOWS / "api" / f"{ui_file.stem}_api.json").is_file(), f"{ui_file.name} has no API twin"
        assert ui_file.with_suffix(".jpg").is_file(), f"{ui_file.name} has no thumbnail"
    for api_file in api_workflows():
        ui_name = api_file.name.removesuffix("_api.json") + ".json"
        assert (WORKFLOWS / ui_name).is_file(), f"{api_file.name} has no UI-format twin"


def test_shipped_workflows_match_the_servers_node_definitions(comfy_server: Any) -> None:
    """Every node, input and link in the API twins exists on a real server with this pack."""
    object_info = requests.get(f"{comfy_server.url}/object_info", timeout=30).json()
    for path in api_workflows():
        graph = json.loads(path.read_text())
        for node_id, node in graph.items():
            info = object_info.get(node["class_type"])
            assert info, f"{path.name}: node {node_id} has unknown type {node['class_type']}"
            declared = {**info["input"].get("required", {}), **info["input"].get("optional", {})}
            missing = set(info["input"].get("required", {})) - set(node["inputs"])
            assert not missing, f"{path.name}: node {node_id} lacks inputs {sorted(missing)}"
            for name, value in node["inputs"].items():
                assert name in declared, f"{path.name}: node {node_id} has no input {name!r}"
                kind, options = declared[name][0], combo_options(declared[name])
                if isinstance(value, list):
                    source = graph[value[0]]
                    produced = object_info[source["class_type"]]["output"][value[1]]
                    assert kind in (produced, "*"), f"{path.name}: {node_id}.{name} wants {kind}, gets {produced}"
                elif options is not None and name != "model" and not is_upload_combo(declared[name]):
                    # model folders and the files in ComfyUI's input folder differ per installation
                    assert value in options, f"{path.name}: {node_id}.{name}={value!r} is not one of {options}"


def test_ui_workflows_load_in_the_frontend_as_their_api_twins(page: Page, comfy_server: Any) -> None:
    """Loading the UI file and converting it back gives exactly the API twin (widget values and links)."""
    object_info = requests.get(f"{comfy_server.url}/object_info", timeout=30).json()

    def comparable(graph: dict[str, Any]) -> dict[str, Any]:
        # Only what the server reads: the frontend adds display-only inputs (PreviewAny's "preview"),
        # and load_ui_workflow replaced the seeds.
        result = {}
        for node_id, node in graph.items():
            declared = object_info[node["class_type"]]["input"]
            names = {*declared.get("required", {}), *declared.get("optional", {})} - {"seed"}
            result[node_id] = (node["class_type"], {k: v for k, v in node["inputs"].items() if k in names})
        return result

    for ui_file in ui_workflows():
        load_ui_workflow(page, ui_file.name)
        # graphToPrompt is what the queue button sends.
        prompt = page.evaluate("async () => (await app.graphToPrompt()).output")
        twin = json.loads((WORKFLOWS / "api" / f"{ui_file.stem}_api.json").read_text())
        assert comparable(prompt) == comparable(twin), f"{ui_file.name} differs from its API twin"


def test_shipped_workflows_size_nodes_so_titles_and_widgets_show(page: Page) -> None:
    """The sizes saved in the files, not the loaded ones: the frontend grows a node to its widgets on load,
    but a title wider than the node is cut off ("SCD VQ De...")."""
    for ui_file in ui_workflows():
        saved = {node["id"]: node["size"] for node in read_workflow(ui_file.name)["nodes"]}
        load_ui_workflow(page, ui_file.name)
        for node in page.evaluate(NODE_NEEDS):
            width, height = saved[node["id"]]
            assert width >= node["titleWidth"], f"{ui_file.name}: title {node['title']!r} cut off at width {width}"
            assert width >= node["min"][0] and height >= node["min"][1], \
                f"{ui_file.name}: {node['title']!r} is {width}x{height}, its widgets need {node['min']}"


def test_chart_routes_events_by_node_and_resets_on_a_new_run(page: Page) -> None:
    load_ui_workflow(page, "scd_demo_ar_vs_scd.json")
    first, second = page.evaluate(SAMPLER_CHARTS)
    for iteration, committed in enumerate([1, 4, 3]):
        synthetic_progress(page, first["id"], iteration, committed, total=[1, 5, 8][iteration])
    charts = {chart["id"]: chart["state"] for chart in page.evaluate(SAMPLER_CHARTS)}
    assert charts[first["id"]]["iterations"] == "3" and charts[first["id"]]["callsSaved"] == "5"
    assert charts[second["id"]]["iterations"] == "0", "an event for one sampler reached the other"

    synthetic_progress(page, first["id"], 0, 2, total=2)
    state = {chart["id"]: chart["state"] for chart in page.evaluate(SAMPLER_CHARTS)}[first["id"]]
    assert state["iterations"] == "1" and state["total"] == "2", "iteration 0 did not start a new chart"


def test_chart_draws_in_the_vue_node_renderer(page: Page) -> None:
    """The frontend's newer renderer ("Nodes 2.0") breaks canvas-drawn widgets; the DOM chart must survive it."""
    page.evaluate("() => app.extensionManager.setting.set('Comfy.VueNodes.Enabled', true)")
    try:
        load_ui_workflow(page, "scd_demo.json")
        page.wait_for_selector(f"[data-node-id] {CHART}", state="visible")  # inside a Vue-rendered node
        (chart,) = page.evaluate(SAMPLER_CHARTS)
        for iteration in range(12):
            synthetic_progress(page, chart["id"], iteration, committed=3, total=3 * (iteration + 1))
        page.wait_for_timeout(100)  # the chart redraws on the next animation frame
        assert page.locator(CHART).evaluate(COUNT_BAR_PIXELS) > 50, "no bars in the Vue-rendered node"
        ARTIFACTS.mkdir(exist_ok=True)
        page.locator(CHART).screenshot(path=ARTIFACTS / "browser_vue_node_chart.png")
    finally:
        page.evaluate("() => app.extensionManager.setting.set('Comfy.VueNodes.Enabled', false)")


def test_demo_workflow_draws_live_acceptance_bars(page: Page) -> None:
    load_ui_workflow(page, "scd_demo.json")
    chart = page.locator(CHART)
    assert chart.count() == 1
    assert chart.evaluate(COUNT_BAR_PIXELS) == 0, "bars drawn before anything ran"

    page.evaluate("""() => {
        const api = window.comfyAPI.api.api;
        window.scdRunOutcome = null;
        api.addEventListener("execution_success", () => { window.scdRunOutcome = "success"; });
        api.addEventListener("execution_error", ({detail}) => { window.scdRunOutcome = detail.exception_message; });
        return app.queuePrompt(0, 1);
    }""")
    page.wait_for_function("window.scdRunOutcome !== null", timeout=RUN_TIMEOUT_MS)
    assert page.evaluate("window.scdRunOutcome") == "success"
    page.wait_for_timeout(300)  # the chart redraws on the next animation frame, the saved image loads
    assert chart.evaluate("(canvas) => canvas.dataset.done") == "true"

    state = chart.evaluate("(canvas) => ({...canvas.dataset})")
    iterations, nfe, total = int(state["iterations"]), int(state["nfe"]), int(state["total"])
    assert iterations == nfe, "one progress event per model call"
    assert total == int(state["numTokens"]) > 0
    assert int(state["callsSaved"]) == total - nfe
    assert nfe < total, "window 32 on the demo model should commit more than one token per call"
    assert chart.evaluate(COUNT_BAR_PIXELS) > 50, "no bars on the chart"
    # the Stats summary keeps its three lines in PreviewAny's Markdown display
    breaks = page.evaluate("""() => app.graph.nodes.find((n) => n.type === "PreviewAny")
        .widgets.find((w) => w.name === "preview").element.querySelectorAll("br").length""")
    assert breaks == 2, f"the summary shows {breaks + 1} lines, not 3"

    ARTIFACTS.mkdir(exist_ok=True)
    chart.screenshot(path=ARTIFACTS / "browser_scd_chart.png")
    page.screenshot(path=ARTIFACTS / "browser_scd_demo.png")
