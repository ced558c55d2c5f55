// Live chart on every SCDSampler node: one bar per decoding iteration (tokens committed by that model call)
// and the running count of model calls saved against plain autoregressive decoding (a call per sampled token).
//
// Data arrives as the server's "scd.progress" websocket event, one per model call (nodes/progress.py):
//   {node, iteration, committed, forced, total, num_tokens, nfe, acceptance, calls_saved}
// `forced` of a call's `committed` tokens were given (an image's kept cells, row-ends), not sampled: they sit on
// top of the sampled ones in a colour of their own.
// ComfyUI's own execution_interrupted / execution_error events name the node that was running: a chart whose
// run was cut short says so instead of looking half done.
// The chart is a DOM widget (not canvas-drawn), so it also renders in the frontend's Vue node mode.
// Tests read the chart's state from the canvas's data attributes (data-iterations, data-calls-saved, ...).
import { app } from "../../../scripts/app.js";
import { api } from "../../../scripts/api.js";

const NODE_TYPE = "SCDSampler";
const EVENT = "scd.progress";
const CHART_HEIGHT = 150;
const MIN_NODE_WIDTH = 320; // room for the summary line

// The SCD Stats chart (nodes/chart.py) uses the same colours; tests/test_nodes.py checks that they agree.
const COLORS = {
    background: "#1b1b1b",
    frame: "#3a3a3a",
    arBar: "#7a7a7a", // a call that committed one token: no better than plain AR
    scdBar: "#4caf50", // a call that committed several tokens
    forcedBar: "#9575cd", // tokens a call committed without sampling them
    baseline: "#d0a040", // one token per call, the pace of plain AR
    text: "#e0e0e0",
    muted: "#9a9a9a",
    stopped: "#e57373", // a run cancelled or failed part way
};
// What ended a run early, by ComfyUI's event, as the chart says it.
const STOPPED_BY = { execution_interrupted: "cancelled", execution_error: "stopped by an error" };

// The run a chart shows; kept after the run ends and replaced when the next run's iteration 0 arrives.
function emptyRun() {
    return { committed: [], forced: [], total: 0, numTokens: 0, nfe: 0, callsSaved: 0, stopped: "" };
}

class AcceptanceChart {
    constructor() {
        this.run = emptyRun();
        this.element = document.createElement("div");
        this.element.className = "scd-acceptance-chart";
        Object.assign(this.element.style, { width: "100%", height: "100%", minHeight: `${CHART_HEIGHT}px` });
        this.canvas = document.createElement("canvas");
        Object.assign(this.canvas.style, { width: "100%", height: "100%", display: "block" });
        this.element.appendChild(this.canvas);
        this.drawPending = false;
        this.publishState();
        new ResizeObserver(() => this.requestDraw()).observe(this.canvas);
    }

    update(event) {
        if (event.iteration === 0) this.run = emptyRun();
        this.run.committed[event.iteration] = event.committed;
        this.run.forced[event.iteration] = event.forced ?? 0; // servers before forced tokens send none
        this.run.total = event.total;
        this.run.numTokens = event.num_tokens;
        this.run.nfe = event.nfe;
        this.run.callsSaved = event.calls_saved;
        this.publishState();
        this.requestDraw();
    }

    // The run ended before its last token; a finished run (or none) stays as it is.
    stop(reason) {
        if (this.run.committed.length === 0 || this.finished()) return;
        this.run.stopped = reason;
        this.publishState();
        this.requestDraw();
    }

    forcedTotal() {
        return this.run.forced.reduce((sum, n) => sum + (n ?? 0), 0);
    }

    finished() {
        return this.run.numTokens > 0 && this.run.total >= this.run.numTokens;
    }

    // State for tests and for anyone inspecting the page.
    publishState() {
        const data = this.canvas.dataset;
        data.iterations = String(this.run.committed.length);
        data.forced = String(this.forcedTotal());
        data.callsSaved = String(this.run.callsSaved);
        data.total = String(this.run.total);
        data.numTokens = String(this.run.numTokens);
        data.nfe = String(this.run.nfe);
        data.done = String(this.finished());
        data.stopped = this.run.stopped;
    }

    // Events can arrive faster than frames; draw at most once per frame.
    requestDraw() {
        if (this.drawPending) return;
        this.drawPending = true;
        requestAnimationFrame(() => {
            this.drawPending = false;
            this.draw();
        });
    }

    draw() {
        const ratio = window.devicePixelRatio || 1;
        const width = Math.max(1, Math.round(this.canvas.clientWidth * ratio));
        const height = Math.max(1, Math.round(this.canvas.clientHeight * ratio));
        if (this.canvas.width !== width || this.canvas.height !== height) {
            this.canvas.width = width;
            this.canvas.height = height;
        }
        const ctx = this.canvas.getContext("2d");
        ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
        const w = width / ratio;
        const h = height / ratio;
        ctx.fillStyle = COLORS.background;
        ctx.fillRect(0, 0, w, h);

        const textHeight = 32; // two summary lines above the plot
        const plot = { x: 4, y: textHeight + 4, w: w - 8, h: h - textHeight - 8 };
        ctx.strokeStyle = COLORS.frame;
        ctx.strokeRect(plot.x + 0.5, plot.y + 0.5, plot.w - 1, plot.h - 1);
        this.drawBars(ctx, plot);
        this.drawSummary(ctx);
    }

    drawBars(ctx, plot) {
        const committed = this.run.committed;
        if (committed.length === 0 || plot.w <= 0 || plot.h <= 0) return;
        const peak = Math.max(...committed.map((n) => n ?? 0));
        const tallest = Math.max(2, peak); // room above the one-token line even when no call beat it
        // Bars span the whole run's expected width once the run is long; until then keep them readable.
        const slots = Math.max(committed.length, 32);
        const step = plot.w / slots;
        const gap = step > 3 ? 1 : 0;
        const barWidth = Math.max(step - gap, 0.5);
        committed.forEach((count, i) => {
            if (!count) return;
            const forced = this.run.forced[i] ?? 0;
            const sampledHeight = ((count - forced) / tallest) * (plot.h - 2);
            const sampledTop = plot.y + plot.h - 1 - sampledHeight;
            ctx.fillStyle = count - forced > 1 ? COLORS.scdBar : COLORS.arBar;
            ctx.fillRect(plot.x + i * step, sampledTop, barWidth, sampledHeight);
            if (!forced) return;
            const forcedHeight = (forced / tallest) * (plot.h - 2);
            ctx.fillStyle = COLORS.forcedBar;
            ctx.fillRect(plot.x + i * step, sampledTop - forcedHeight, barWidth, forcedHeight);
        });
        // Plain AR commits exactly one token per call: everything above this line is a saved call.
        const baselineY = plot.y + plot.h - 1 - (plot.h - 2) / tallest;
        ctx.strokeStyle = COLORS.baseline;
        ctx.setLineDash([4, 3]);
        ctx.beginPath();
        ctx.moveTo(plot.x, baselineY);
        ctx.lineTo(plot.x + plot.w, baselineY);
        ctx.stroke();
        ctx.setLineDash([]);
        ctx.font = "11px sans-serif";
        ctx.textBaseline = "top";
        // the scale: the most tokens a call of this run committed (none above one on a plain AR run)
        this.drawLabel(ctx, `most in one call: ${peak}`, plot.x + 1, plot.y + 1, COLORS.muted);
        const lineLabel = "1 per call = autoregressive";
        const labelWidth = ctx.measureText(lineLabel).width + 6;
        this.drawLabel(ctx, lineLabel, plot.x + plot.w - labelWidth - 1, baselineY - 15, COLORS.baseline);
    }

    // Text on a backing box so bars do not hide it.
    drawLabel(ctx, text, x, y, color) {
        ctx.fillStyle = COLORS.background;
        ctx.fillRect(x, y, ctx.measureText(text).width + 6, 14);
        ctx.fillStyle = color;
        ctx.fillText(text, x + 3, y + 1);
    }

    drawSummary(ctx) {
        const run = this.run;
        ctx.textBaseline = "top";
        ctx.textAlign = "left";
        if (run.committed.length === 0) {
            ctx.font = "12px sans-serif";
            ctx.fillStyle = COLORS.muted;
            ctx.fillText("tokens per model call appear here", 6, 4);
            ctx.fillText("while the sampler runs", 6, 18);
            return;
        }
        const perCall = run.nfe > 0 ? (run.total / run.nfe).toFixed(2) : "-";
        const calls = `${run.nfe} model call${run.nfe === 1 ? "" : "s"}`;
        ctx.font = "bold 12px sans-serif";
        ctx.fillStyle = run.stopped ? COLORS.stopped : COLORS.text;
        ctx.fillText(run.stopped ? `${run.stopped} after ${calls}`
            : `${run.callsSaved} calls saved · ${perCall} tokens per call`, 6, 4);
        ctx.font = "12px sans-serif";
        ctx.fillStyle = COLORS.muted;
        ctx.fillText(`${calls}, ${run.total} / ${run.numTokens} tokens`, 6, 19);
        const forced = this.forcedTotal();
        if (forced === 0) return;
        const x = 6 + ctx.measureText(`${calls}, ${run.total} / ${run.numTokens} tokens `).width;
        ctx.fillStyle = COLORS.forcedBar;
        ctx.fillText(`(${forced} forced)`, x, 19);
    }
}

// The event's node id is the execution id: a path "outer:inner" for nodes inside subgraphs.
function findNode(executionId) {
    const [rootId, ...innerIds] = String(executionId).split(":");
    let node = app.graph?.getNodeById(rootId);
    for (const id of innerIds) node = node?.subgraph?.getNodeById(id);
    return node;
}

app.registerExtension({
    name: "comfyui-scd.AcceptanceChart",

    async setup() {
        api.addEventListener(EVENT, ({ detail }) => {
            if (!detail || detail.node === undefined) return;
            const node = findNode(detail.node);
            node?.scdChart?.update(detail);
        });
        for (const [event, reason] of Object.entries(STOPPED_BY)) {
            api.addEventListener(event, ({ detail }) => {
                if (detail?.node_id != null) findNode(detail.node_id)?.scdChart?.stop(reason);
            });
        }
    },

    async beforeRegisterNodeDef(nodeType, nodeData) {
        if (nodeData.name !== NODE_TYPE) return;
        const onNodeCreated = nodeType.prototype.onNodeCreated;
        nodeType.prototype.onNodeCreated = function () {
            const result = onNodeCreated?.apply(this, arguments);
            this.scdChart = new AcceptanceChart();
            // options.serialize keeps the chart out of the prompt, widget.serialize out of the saved workflow.
            const widget = this.addDOMWidget("scd_acceptance", "scd_chart", this.scdChart.element, {
                serialize: false,
                getMinHeight: () => CHART_HEIGHT,
            });
            widget.serialize = false;
            this.setSize([Math.max(this.size[0], MIN_NODE_WIDTH), this.size[1]]);
            return result;
        };
    },
});
