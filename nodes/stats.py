"""SCD Stats: SCD_STATS -> chart IMAGE + summary STRING."""

from __future__ import annotations

import comfy.model_management as mm
import numpy as np
import torch
from comfy_api.latest import io
from scd_core.auto_window import widths_used
from scd_core.config import AUTO_WINDOW

from .chart import committed_chart
from .sockets import SamplingStats, SCDStats


# ComfyUI's text preview renders Markdown, which joins plain newlines into one line; two trailing spaces
# make a line break there and change nothing in plain text.
LINE_BREAK = "  \n"


def window_text(stats: SamplingStats) -> str:
    """The window setting; for "auto" also the widths it chose, with how many calls each."""
    if stats.config.window != AUTO_WINDOW:
        return str(stats.config.window)
    return f"auto ({widths_used(stats.result.windows)})"


def summary_text(stats: SamplingStats) -> str:
    result, config = stats.result, stats.config
    tokens = result.tokens.shape[1]  # autoregressive decoding needs one call per token
    return LINE_BREAK.join([
        f"{stats.model_name}: {tokens} tokens x {stats.batch_size} in {result.nfe} model calls "
        f"(autoregressive: {tokens}) - {tokens / result.nfe:.2f}x fewer calls",
        f"coupler {config.coupler}, window {window_text(stats)}, draft init {config.draft_init or 'auto'}, "
        + (f"{config.candidates} candidates, " if config.candidates > 1 else "") + f"seed {config.seed}",
        f"wall {result.total_s:.2f} s: prefill {result.prefill_s:.2f} s, forward {result.forward_s:.2f} s, "
        f"sampling {result.sample_s:.2f} s"])


class SCDStatsNode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SCDStats",
            display_name="SCD Stats",
            category="SCD",
            description="Shows how many tokens each model call committed and the speed-up over "
                        "autoregressive decoding.",
            inputs=[SCDStats.Input("stats")],
            outputs=[io.Image.Output(display_name="chart"), io.String.Output(display_name="summary")],
        )

    @classmethod
    def execute(cls, stats: SamplingStats) -> io.NodeOutput:
        result = stats.result
        title = f"{result.nfe} calls for {result.tokens.shape[1]} tokens"  # short: it must fit at node size
        chart = committed_chart(result.committed, result.acceptance, title)
        pixels = torch.from_numpy(np.asarray(chart, dtype=np.float32) / 255.0).unsqueeze(0)
        return io.NodeOutput(pixels.to(mm.intermediate_device()), summary_text(stats))
