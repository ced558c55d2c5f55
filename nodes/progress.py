"""Per-iteration feedback of a sampler run: progress bar, preview, status text, scd.progress event.

Every iteration also checks for a pending interrupt, so "Cancel" stops the run
within one model call.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import comfy.model_management as mm
import comfy.utils
import torch
from comfy.cli_args import args
from PIL import Image
from scd_core import IterationStats
from server import PromptServer

# A preview costs a VQ decode: at most one per interval, and never more than ~1/PREVIEW_COST_SHARE of the run.
PREVIEW_INTERVAL_S = 1.0
PREVIEW_COST_SHARE = 5
PENDING_GRAY = 0.5  # colour of the not yet committed part of the preview


def status_text(stats: IterationStats, warnings: Sequence[str] = ()) -> str:
    """What the run has done so far, "31 calls, 126 / 256 tokens", then any warning about the run's settings."""
    calls = f"{stats.nfe} call{'s' if stats.nfe != 1 else ''}"
    return " | ".join([f"{calls}, {stats.total} / {stats.num_tokens} tokens", *warnings])


def event_data(node_id: str, stats: IterationStats) -> dict[str, Any]:
    """The payload of the websocket event "scd.progress" (see the node pack contract)."""
    return {"node": node_id, "iteration": stats.iteration, "committed": stats.committed, "forced": stats.forced,
            "total": stats.total, "num_tokens": stats.num_tokens, "nfe": stats.nfe,
            "acceptance": [round(a, 4) for a in stats.acceptance],
            "calls_saved": stats.total - stats.forced_total - stats.nfe}  # plain AR: a call per sampled token


def partial_image(model: Any, prefix: torch.Tensor, num_tokens: int) -> Image.Image:
    """Decode the first row's committed prefix; the rows still being sampled are shown gray."""
    done = prefix.shape[1]
    preview_frame = getattr(model, "preview_frame", None)
    if preview_frame is not None:  # video: only the latent frame being sampled, which is cheap to decode
        return to_pil(preview_frame(prefix[:1]))
    # pending positions hold a token the decoder accepts: the first image code where the model names its codes
    code_ids = getattr(model, "code_ids", None)
    filler = 0 if code_ids is None else int(code_ids[0])
    tokens = torch.full((1, num_tokens), filler, dtype=torch.long, device=prefix.device)
    tokens[:, :done] = prefix[:1]
    image = model.decode(tokens)[0]
    grid_rows = model.grid[0] if getattr(model, "grid", None) else None
    if grid_rows is not None and done < num_tokens:
        # only complete token rows are meaningful pixels
        rows_done = done * grid_rows // num_tokens
        image[image.shape[0] * rows_done // grid_rows:] = PENDING_GRAY
    return to_pil(image)


def to_pil(image: torch.Tensor) -> Image.Image:
    return Image.fromarray((image.clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy())


class ProgressReporter:
    """The sampler's `generate` callback."""

    def __init__(self, node_id: str, model: Any, warnings: Sequence[str] = ()) -> None:
        self.node_id = node_id
        self.model = model
        self.warnings = tuple(warnings)  # shown on the status line all run long
        self.bar = comfy.utils.ProgressBar(model.num_tokens, node_id=node_id)
        self.server = PromptServer.instance
        self.next_preview_at = time.monotonic() + PREVIEW_INTERVAL_S

    def _preview(self, stats: IterationStats) -> Optional[tuple[str, Image.Image, int]]:
        """A preview when one is due, and always the finished image."""
        started = time.monotonic()
        if stats.total < stats.num_tokens and started < self.next_preview_at:
            return None
        image = partial_image(self.model, stats.tokens, stats.num_tokens)
        finished = time.monotonic()
        self.next_preview_at = finished + max(PREVIEW_INTERVAL_S, PREVIEW_COST_SHARE * (finished - started))
        return "JPEG", image, args.preview_size

    def __call__(self, stats: IterationStats) -> None:
        mm.throw_exception_if_processing_interrupted()
        self.bar.update_absolute(stats.total, stats.num_tokens, self._preview(stats))
        self.server.send_progress_text(status_text(stats, self.warnings), self.node_id)
        self.server.send_sync("scd.progress", event_data(self.node_id, stats))
