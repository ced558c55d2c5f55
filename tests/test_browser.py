"""The node pack in a real browser: the served frontend loads every shipped workflow without an alert, lists
them in its template browser with their titles, shows the nodes' help pages, and the live chart on SCDSampler
draws while the demo model samples, marks a cancelled run, and stays clear of the other nodes after a run.

Every page test runs twice: against the frontend the core pins and against the newest one on the registry
(pinned in tests/install_frontend.sh, served with --front-end-root), as users of a late-2026 ComfyUI see it.
Needs Debian's chromium (tests/install_browser.sh) and the `comfy_server` fixture (a real ComfyUI with this
pack linked in).  Screenshots go to test-artifacts/<frontend>/ for a human to look at.
"""

from __future__ import annotations

import json
import re
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright

from comfy_server import PACK_NAME, ComfyServer, newest_frontend

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO_ROOT / "workflows"
DOCS = REPO_ROOT / "web" / "docs"  # the nodes' help pages
HELP_PAGE_PROBE = re.compile(r"/docs/[A-Za-z0-9]+/[a-z]{2}(-[A-Za-z]+)?\.md$")
TEMPLATES = json.loads((REPO_ROOT / "web" / "templates.json").read_text())
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


# Every node's box, title bar included, in graph coordinates: [left, top, width, height].
NODE_BOXES = """() => app.graph.nodes.map((n) => ({id: n.id, title: n.getTitle() ?? n.type, box: [...n.boundingRect]}))"""
GRAPH_BOUNDS = """() => { const boxes = app.graph.nodes.map((n) => n.boundingRect);
    return [Math.min(...boxes.map((b) => b[0])), Math.min(...boxes.map((b) => b[1])),
            Math.max(...boxes.map((b) => b[0] + b[2])), Math.max(...boxes.map((b) => b[1] + b[3]))]; }"""
# The frontend's alerts ("Invalid workflow against zod schema", ...) are warning toasts (not its info ones,
# such as the Vue renderer's "Prefer the legacy design?").
TOASTS = """() => [...document.querySelectorAll(".p-toast-message-warn, .p-toast-message-error")]
    .map((t) => t.innerText)"""


# Not yet passing with the newest frontend, left open: its template browser (1.58.1) shows "Node graph" under each
# of the pack's templates where 1.32 shows web/templates.json's descriptions.
pinned_frontend_only = pytest.mark.parametrize("frontend", ["pinned"], indirect=True)


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


def is_ours(message: ConsoleMessage) -> bool:
    """A console error from this pack's scripts or about it (a second registration, a failed fetch of ours).
    Not the frontend's probe for a translated help page (docs/<node>/<lang>.md) before it reads docs/<node>.md."""
    text, where = message.text.lower(), message.location.get("url", "")
    if HELP_PAGE_PROBE.search(where):
        return False
    if "already registered" in text and "scd" in text:
        return True
    return message.type in ("error", "warning") and (f"/extensions/{PACK_NAME}/" in where or "scd" in text)


@pytest.fixture(scope="module", params=["pinned", "newest"])
def frontend(request: pytest.FixtureRequest) -> str:
    """Which frontend the page tests run against: the one the core pins, or the newest on the registry."""
    return request.param


@pytest.fixture(scope="module")
def frontend_server(frontend: str, request: pytest.FixtureRequest,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComfyServer]:
    """The session's server for the pinned frontend; a second one serving the newest frontend."""
    if frontend == "pinned":
        yield request.getfixturevalue("comfy_server")
        return
    _, static = newest_frontend()
    server = ComfyServer(tmp_path_factory.mktemp("comfy_base_newest"), front_end_root=static)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def shots(frontend: str) -> Path:
    """This frontend's screenshot folder."""
    folder = ARTIFACTS / frontend
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def page(browser: Browser, frontend: str, frontend_server: ComfyServer) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1500, "height": 950})
    page = context.new_page()
    page_errors: list[str] = []
    page.on("pageerror", lambda error: page_errors.append(str(error)))
    page.on("console", lambda message: page_errors.append(message.text) if is_ours(message) else None)
    # A first visit opens the template browser over the canvas; mark the tour as done for this server.
    requests.post(f"{frontend_server.url}/settings/Comfy.TutorialCompleted", json=True,
                  timeout=10).raise_for_status()
    page.goto(frontend_server.url)
    page.wait_for_function(f"window.app?.graph && window.app.extensions.some((e) => e.name === {EXTENSION_NAME!r})",
                           timeout=60_000)
    served = page.evaluate("window.__COMFYUI_FRONTEND_VERSION__")
    expected = newest_frontend()[0] if frontend == "newest" else metadata.version("comfyui-frontend-package")
    assert served == expected, f"the {frontend} frontend should be {expected}, the page runs {served}"
    registered = page.evaluate(f"window.app.extensions.filter((e) => e.name === {EXTENSION_NAME!r}).length")
    assert registered == 1, f"{EXTENSION_NAME} registered {registered} times"
    yield page
    context.close()
    assert not page_errors, f"uncaught errors in the page: {page_errors}"


def load_ui_workflow(page: Page, name: str, seed: int = BROWSER_TEST_SEED) -> None:
    """Load a shipped workflow as drag-and-drop does; the frontend's schema check must raise no alert."""
    page.evaluate("async (graph) => { await app.loadGraphData(graph); }", read_workflow(name))
    alerts = page.evaluate(TOASTS)
    assert not alerts, f"{name}: the frontend alerts on load: {alerts}"
    # A seed no other test uses: ComfyUI would answer a repeated graph from its cache, without progress events.
    page.evaluate("""(seed) => app.graph.nodes.filter((n) => n.type === "SCDSampler").forEach((n) => {
        n.widgets.find((w) => w.name === "seed").value = seed; })""", seed)


def queue_and_wait(page: Page) -> str:
    """Queue the loaded graph as the Run button does; "success" or the error message once it ends."""
    page.evaluate("""() => {
        const api = window.comfyAPI.api.api;
        window.scdRunOutcome = null;
        api.addEventListener("execution_success", () => { window.scdRunOutcome = "success"; });
        api.addEventListener("execution_error", ({detail}) => { window.scdRunOutcome = detail.exception_message; });
        api.addEventListener("execution_interrupted", () => { window.scdRunOutcome = "interrupted"; });
        return app.queuePrompt(0, 1);
    }""")
    page.wait_for_function("window.scdRunOutcome !== null", timeout=RUN_TIMEOUT_MS)
    page.wait_for_timeout(300)  # the chart redraws on the next animation frame, the saved images load
    return page.evaluate("window.scdRunOutcome")


def assert_no_overlap(page: Page, name: str) -> None:
    """No node's box (title bar included) overlaps another's: a sampler grows by its preview during a run."""
    boxes = page.evaluate(NODE_BOXES)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            (ax, ay, aw, ah), (bx, by, bw, bh) = a["box"], b["box"]
            apart = ax + aw <= bx or bx + bw <= ax or ay + ah <= by or by + bh <= ay
            assert apart, f"{name}: {a['title']!r} {a['box']} overlaps {b['title']!r} {b['box']}"


def show_at_full_size(page: Page, node_type: str) -> None:
    """Zoom to 100% with the first node of that type near the canvas' top left corner."""
    page.evaluate("""(type) => { const node = app.graph.nodes.find((n) => n.type === type);
        app.canvas.ds.scale = 1; app.canvas.ds.offset = [200 - node.pos[0], 120 - node.pos[1]];
        app.canvas.setDirty(true, true); }""", node_type)
    page.wait_for_timeout(300)  # the canvas redraws, DOM widgets follow


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
    # the template browser's titles and order (web/js/scd_templates.js): every workflow once, the demo first
    assert [t["name"] for t in TEMPLATES][0] == "scd_demo"
    assert sorted(t["name"] for t in TEMPLATES) == [f.stem for f in ui_workflows()]
    for template in TEMPLATES:
        assert template["title"] and template["description"], f"{template['name']} lacks a title or description"
        # frontend 1.32 shows a description with "-" and "_" replaced by spaces
        assert not set("-_") & set(template["description"]), f"{template['name']}: {template['description']!r}"


def test_every_workflow_has_a_note_that_says_where_its_model_goes() -> None:
    for ui_file in ui_workflows():
        notes = [n for n in read_workflow(ui_file.name)["nodes"] if n.get("title") == "About this workflow"]
        assert len(notes) == 1, f"{ui_file.name} has {len(notes)} 'About this workflow' notes"
        text = notes[0]["widgets_values"][0]
        assert "Shows:" in text, f"{ui_file.name}: the note does not say what the workflow shows"
        models = {n["widgets_values"][0] for n in read_workflow(ui_file.name)["nodes"] if n["type"] == "SCDModelLoader"}
        for model in models - {"demo"}:
            assert f"models/{model}" in text or f"models/scd/{model}" in text, \
                f"{ui_file.name}: the note does not name the folder of {model}"
        assert "demo" in models or "Hugging Face" in text, f"{ui_file.name}: the note names no repository"


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


def test_ui_workflows_load_in_the_frontend_as_their_api_twins(page: Page, frontend_server: ComfyServer) -> None:
    """Loading the UI file and converting it back gives exactly the API twin (widget values and links)."""
    object_info = requests.get(f"{frontend_server.url}/object_info", timeout=30).json()

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
        # frontend 1.32 keeps the file's numeric ids, newer ones turn them into strings
        saved = {str(node["id"]): node["size"] for node in read_workflow(ui_file.name)["nodes"]}
        load_ui_workflow(page, ui_file.name)
        for node in page.evaluate(NODE_NEEDS):
            width, height = saved[str(node["id"])]
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


def test_chart_draws_in_the_vue_node_renderer(page: Page, shots: Path) -> None:
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
        page.locator(CHART).screenshot(path=shots / "browser_vue_node_chart.png")
    finally:
        page.evaluate("() => app.extensionManager.setting.set('Comfy.VueNodes.Enabled', false)")


def test_demo_workflow_draws_live_acceptance_bars(page: Page, frontend: str, shots: Path) -> None:
    load_ui_workflow(page, "scd_demo.json")
    chart = page.locator(CHART)
    assert chart.count() == 1
    assert chart.evaluate(COUNT_BAR_PIXELS) == 0, "bars drawn before anything ran"

    assert queue_and_wait(page) == "success"
    assert chart.evaluate("(canvas) => canvas.dataset.done") == "true"
    assert chart.evaluate("(canvas) => canvas.dataset.stopped") == ""
    assert_no_overlap(page, "scd_demo.json")

    state = chart.evaluate("(canvas) => ({...canvas.dataset})")
    iterations, nfe, total = int(state["iterations"]), int(state["nfe"]), int(state["total"])
    assert iterations == nfe, "one progress event per model call"
    assert total == int(state["numTokens"]) > 0
    assert int(state["callsSaved"]) == total - nfe
    assert nfe < total, "window 32 on the demo model should commit more than one token per call"
    assert chart.evaluate(COUNT_BAR_PIXELS) > 50, "no bars on the chart"
    # the Stats summary keeps its three lines: frontend 1.32 renders PreviewAny's text as Markdown in a DOM
    # widget ("preview"), newer ones as plain text on the canvas ("preview_text")
    summary = page.evaluate("""() => app.graph.nodes.find((n) => n.type === "PreviewAny").widgets
        .find((w) => w.name === "preview" || w.name === "preview_text").value""")
    assert len(summary.splitlines()) == 3 and "model calls" in summary and "NFE" not in summary, summary
    if frontend == "pinned":
        breaks = page.evaluate("""() => app.graph.nodes.find((n) => n.type === "PreviewAny")
            .widgets.find((w) => w.name === "preview").element.querySelectorAll("br").length""")
        assert breaks == 2, f"the summary shows {breaks + 1} lines, not 3"

    # at 100% zoom, the sampler in view: the chart at its full size, the summary's lines whole
    show_at_full_size(page, "SCDSampler")
    shown = chart.evaluate("""(canvas) => { const r = canvas.getBoundingClientRect();
        return {width: r.width, height: r.height, css: canvas.clientWidth}; }""")
    assert shown["width"] >= 300 and shown["height"] >= 140 and abs(shown["width"] - shown["css"]) < 1, shown
    chart.screenshot(path=shots / "browser_scd_chart.png")
    show_at_full_size(page, "PreviewAny")
    if frontend == "pinned":
        summary = page.evaluate("""() => { const e = app.graph.nodes.find((n) => n.type === "PreviewAny")
            .widgets.find((w) => w.name === "preview").element;
            return {font: parseFloat(getComputedStyle(e).fontSize), height: e.clientHeight,
                    clipped: e.scrollHeight > e.clientHeight + 1 || e.scrollWidth > e.clientWidth + 1}; }""")
        assert summary["font"] >= 12 and summary["height"] > 0 and not summary["clipped"], summary
    page.screenshot(path=shots / "browser_scd_demo.png")


def test_ar_vs_scd_workflow_runs_and_no_node_covers_another(page: Page, shots: Path) -> None:
    """Both samplers grow by their previews during the run; the layout leaves room for that."""
    load_ui_workflow(page, "scd_demo_ar_vs_scd.json", seed=BROWSER_TEST_SEED + 1)  # not the demo run's, cached
    assert queue_and_wait(page) == "success"
    charts = {chart["id"]: chart["state"] for chart in page.evaluate(SAMPLER_CHARTS)}
    assert all(state["done"] == "true" for state in charts.values()), charts
    assert sorted(int(state["nfe"]) for state in charts.values())[1] == 256, "window 1 takes one call per token"
    assert_no_overlap(page, "scd_demo_ar_vs_scd.json")
    page.evaluate("async () => { app.canvas.ds.scale = 0.5; app.canvas.ds.offset = [40, 120]; "
                  "app.canvas.setDirty(true, true); }")
    page.wait_for_timeout(300)
    page.screenshot(path=shots / "browser_ar_vs_scd.png")


def test_continuation_workflow_charts_the_kept_half_as_forced(page: Page, shots: Path) -> None:
    """The second sampler's chart counts the kept top half (8 rows of 16 tokens) as forced and draws it in the
    forced colour; the first sampler forced nothing."""
    load_ui_workflow(page, "scd_demo_continuation.json", seed=BROWSER_TEST_SEED + 2)
    assert queue_and_wait(page) == "success"
    states = {chart["id"]: chart["state"] for chart in page.evaluate(SAMPLER_CHARTS)}
    assert sorted(state["forced"] for state in states.values()) == ["0", "128"], states
    assert all(state["done"] == "true" for state in states.values()), states
    assert_no_overlap(page, "scd_demo_continuation.json")
    # DOM widgets off screen are hidden: bring each sampler into view before reading its chart's pixels
    purple = {}
    for node_id in states:
        page.evaluate("""(id) => { const node = app.graph.getNodeById(id);
            app.canvas.ds.scale = 1; app.canvas.ds.offset = [200 - node.pos[0], 120 - node.pos[1]];
            app.canvas.setDirty(true, true); }""", node_id)
        page.wait_for_timeout(300)  # the canvas redraws, DOM widgets follow
        purple[states[node_id]["forced"]] = page.evaluate("""(id) => {
            const canvas = app.graph.getNodeById(id).scdChart.canvas;
            const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
            let count = 0;
            for (let i = 0; i < data.length; i += 4) {
                if (data[i] === 0x95 && data[i + 1] === 0x75 && data[i + 2] === 0xcd) count++;
            }
            return count; }""", node_id)
    assert purple["0"] == 0 and purple["128"] > 100, purple
    page.screenshot(path=shots / "browser_continuation.png")


def test_cancelled_run_is_marked_on_the_chart(page: Page, shots: Path) -> None:
    load_ui_workflow(page, "scd_demo.json")
    # plain AR on a batch: hundreds of model calls, long enough to cancel midway
    page.evaluate("""() => { const sampler = app.graph.nodes.find((n) => n.type === "SCDSampler");
        sampler.widgets.find((w) => w.name === "window").value = 1;
        sampler.widgets.find((w) => w.name === "batch_size").value = 8; }""")
    chart = page.locator(CHART)
    page.evaluate("""() => {
        const api = window.comfyAPI.api.api;
        window.scdRunOutcome = null;
        api.addEventListener("execution_interrupted", () => { window.scdRunOutcome = "interrupted"; });
        api.addEventListener("execution_success", () => { window.scdRunOutcome = "success"; });
        return app.queuePrompt(0, 1);
    }""")
    page.wait_for_function(f"Number(document.querySelector({CHART!r}).dataset.iterations) >= 3",
                           timeout=RUN_TIMEOUT_MS)
    page.evaluate("() => window.comfyAPI.api.api.interrupt()")
    page.wait_for_function("window.scdRunOutcome !== null", timeout=30_000)
    assert page.evaluate("window.scdRunOutcome") == "interrupted"
    page.wait_for_timeout(300)
    state = chart.evaluate("(canvas) => ({...canvas.dataset})")
    assert state["stopped"] == "cancelled" and state["done"] == "false", state
    chart.screenshot(path=shots / "browser_cancelled_chart.png")


@pinned_frontend_only
def test_template_browser_lists_the_workflows_with_titles_and_thumbnails(page: Page, shots: Path) -> None:
    # the browser renders the thumbnails of the cards in view only: a window tall enough for every card
    page.set_viewport_size({"width": page.viewport_size["width"], "height": 2000})
    page.evaluate("() => app.extensionManager.command.execute('Comfy.BrowseTemplates')")
    page.get_by_text(PACK_NAME, exact=True).first.click()  # the pack's entry under Extensions
    content = page.locator('[data-testid="template-workflows-content"]')
    page.wait_for_function("""(count) => document.querySelectorAll(
        '[data-testid="template-workflows-content"] h3').length === count""", arg=len(TEMPLATES))
    titles = content.locator("h3").all_inner_texts()
    assert titles == [t["title"] for t in TEMPLATES], "titles or order differ from web/templates.json"
    text = content.inner_text()
    assert all(t["description"] in text for t in TEMPLATES), text
    # a card may show a placeholder before its thumbnail: wait for every card's image, loaded
    page.wait_for_function("""(count) => {
        const images = [...document.querySelectorAll('[data-testid="template-workflows-content"] img')];
        return images.length === count && images.every((img) => img.complete); }""",
                           arg=len(TEMPLATES), timeout=60_000)
    widths = content.locator("img").evaluate_all("(images) => images.map((img) => img.naturalWidth)")
    assert len(widths) == len(TEMPLATES) and all(w > 0 for w in widths), f"thumbnails missing: {widths}"
    page.screenshot(path=shots / "browser_templates.png")
    # a click loads the workflow from the pack's folder
    content.get_by_text(TEMPLATES[0]["title"], exact=True).click()
    expected = len(read_workflow(f"{TEMPLATES[0]['name']}.json")["nodes"])
    page.wait_for_function("(count) => app.graph.nodes.length === count && "
                           "app.graph.nodes.some((n) => n.type === 'SCDSampler')", arg=expected)


def markdown_images(text: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)


def test_every_node_has_a_help_page_naming_its_inputs_and_outputs(comfy_server: Any) -> None:
    """web/docs/<node id>.md, where the frontend's help panel looks for a custom node's page; its pictures are
    files the server serves from web/."""
    object_info = comfy_server.get_json("/object_info")
    ours = {name: info for name, info in object_info.items() if info["python_module"].endswith(PACK_NAME)}
    assert ours, "no node of the pack on the server"
    for name, info in ours.items():
        page = DOCS / f"{name}.md"
        assert page.is_file(), f"{name} has no help page ({page.relative_to(REPO_ROOT)})"
        text = page.read_text()
        assert text.startswith(f"# {info['display_name']}\n"), f"{page.name} does not open with the node's title"
        inputs = [*info["input"].get("required", {}), *info["input"].get("optional", {})]
        for socket in inputs + info["output_name"]:
            assert f"`{socket}`" in text, f"{page.name} does not describe `{socket}`"
        pictures = markdown_images(text)
        assert pictures, f"{page.name} shows no picture"
        for picture in pictures:
            served = (DOCS / picture).resolve()
            assert served.is_relative_to(REPO_ROOT / "web") and served.is_file(), f"{page.name}: {picture} missing"


def test_node_info_opens_the_help_page_with_its_picture(page: Page, shots: Path) -> None:
    """The selection toolbox's info button shows the node's help page (fetched from the pack), picture loaded."""
    load_ui_workflow(page, "scd_demo.json")
    page.evaluate("""() => { app.canvas.selectNode(app.graph.nodes.find((n) => n.type === "SCDSampler"));
        app.canvas.setDirty(true, true); }""")
    page.locator("button:has(i[class*='lucide--info'])").first.click()  # "Node Info" in the toolbox
    shown = page.locator(".node-help-content").first
    shown.wait_for(state="visible")
    page.wait_for_function("""() => { const images = [...document.querySelectorAll(".node-help-content img")];
        return images.length > 0 && images.every((img) => img.complete && img.naturalWidth > 0); }""")
    doc = (DOCS / "SCDSampler.md").read_text()
    first_sentence = doc.split("\n\n")[1].split(":")[0]  # "Samples image (or video) tokens ... decoding"
    assert first_sentence in shown.inner_text(), "the help panel does not show web/docs/SCDSampler.md"
    sources = shown.locator("img").evaluate_all("(images) => images.map((img) => img.src)")
    (picture,) = markdown_images(doc)
    origin = page.evaluate("location.origin")  # the page's URL may carry a fragment (newer frontends)
    assert sources == [f"{origin}/extensions/{PACK_NAME}/docs/{picture}".replace("docs/../", "")]
    page.screenshot(path=shots / "browser_node_help.png")
