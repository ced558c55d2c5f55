"""SCD Stats: SCD_STATS -> chart IMAGE + summary STRING."""

from __future__ import annotations

import comfy.model_management as mm
import numpy as np
import torch
from comfy_api.latest import io
from scd_core.windows import window_policies

from .chart import committed_chart
from .sockets import SamplingStats, SCDStats


# ComfyUI's text preview renders Markdown, which joins plain newlines into one line; two trailing spaces
# make a line break there and change nothing in plain text.
LINE_BREAK = "  \n"


def summary_text(stats: SamplingStats) -> str:
    result, config = stats.result, stats.config
    tokens = result.tokens.shape[1]
    forced = sum(result.forced)  # given cells and row-ends: committed, never sampled
    sampled = tokens - forced  # autoregressive decoding needs one call per sampled token
    return LINE_BREAK.join([
        f"{stats.model_name}: {tokens} tokens x {stats.batch_size}" + (f" ({forced} forced)" if forced else "")
        + f" in {result.nfe} model calls "
        f"(autoregressive: {sampled}) - {sampled / result.nfe:.2f}x fewer calls",
        f"coupler {config.coupler}, window {window_policies.report(config.window, result.windows)}, "
        f"draft init {config.draft_init or 'auto'}, "
        + (f"{config.candidates} candidates, " if config.candidates > 1 else "") + f"seed {config.seed}",
        f"wall {result.total_s:.2f} s: prefill {result.prefill_s:.2f} s, forward {result.forward_s:.2f} s, "
        f"sampling {result.sample_s:.2f} s"]
        # a compiled model whose compile or CUDA graph capture failed ran eagerly: the same image, not the speed
        + [f"ran eagerly (compile=True): {reason}" for reason in result.eager_fallbacks])


class SCDStatsNode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SCDStats",
            display_name="SCD Stats",
            category="SCD",
            description="Shows how many tokens each model call committed and how many calls the run saved "
                        "against autoregressive decoding, which needs one call per token. Each call checks a "
                        "window of drafts (guessed tokens) at once; acceptance is the share of a call's "
                        "drafts that passed the check that keeps the output exactly autoregressive.",
            inputs=[SCDStats.Input("stats")],
            outputs=[io.Image.Output(display_name="chart",
                                     tooltip="Bars: tokens committed by each model call (1 = the autoregressive "
                                             "pace); purple on top: forced tokens (an image's given cells, "
                                             "row-ends), not sampled. Line: acceptance, the share of that "
                                             "call's drafts kept."),
                     io.String.Output(display_name="summary",
                                      tooltip="Model calls against autoregressive decoding, the settings "
                                              "(window: the widths the calls used) and the wall time.")],
        )

    @classmethod
    def execute(cls, stats: SamplingStats) -> io.NodeOutput:
        result = stats.result
        title = f"{result.nfe} calls for {result.tokens.shape[1]} tokens"  # short: it must fit at node size
        chart = committed_chart(result.committed, result.acceptance, title, result.forced)
        pixels = torch.from_numpy(np.asarray(chart, dtype=np.float32) / 255.0).unsqueeze(0)
        return io.NodeOutput(pixels.to(mm.intermediate_device()), summary_text(stats))
