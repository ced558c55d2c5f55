"""The video benchmark table: AR / SJD / SCD x draft initialisation x window on `VideoGridModel`.

`python -m scd_core.bench video` prints it (and `--readme` writes it between the
`bench:video` markers).  `limit` is N / window, the fewest calls a window allows;
`gap` is how many times that the measured calls are.
"""

from __future__ import annotations

import math
from typing import Sequence

from ..decoding.config import SamplerConfig
from .synthetic_video import VideoGridModel

CHANGES = (0.1, 0.3)          # share of tokens redrawn per frame: a slow and a busier video
INITS = ("random", "above", "previous_frame")
METHODS = (("SJD", "independent"), ("SCD", "maximal"))
VIDEO_COLUMNS = ("method", "draft_init", "window", "nfe", "speedup", "tokens_per_call", "acceptance", "limit", "gap")


def video_rows(model: VideoGridModel, windows: Sequence[int], seeds: Sequence[int]) -> list[dict]:
    from .nfe import measure

    ar = measure(model, None, SamplerConfig(coupler="independent", window=1), seeds)
    rows = [dict(method="AR", draft_init="-", window=1, **ar)]
    for label, coupler in METHODS:
        for init in INITS:
            for window in windows:
                row = measure(model, None, SamplerConfig(coupler=coupler, window=window, draft_init=init), seeds)
                rows.append(dict(method=label, draft_init=init, window=window, **row))
    for row in rows:
        row["speedup"] = ar["nfe"] / row["nfe"]
        row["limit"] = math.ceil(model.num_tokens / row["window"])
        row["gap"] = row["nfe"] / row["limit"]
    return rows


def video_tables(seeds: Sequence[int], windows: Sequence[int]) -> str:
    from .tables import markdown

    parts = []
    for change in CHANGES:
        model = VideoGridModel(change=change)
        frames, rows, cols = model.grid
        parts.append(f"**change {change}** ({frames} frames of {rows}x{cols} after one context frame, "
                     f"vocabulary {model.vocab_size}, {len(seeds)} seeds)\n\n"
                     + markdown(video_rows(model, windows, seeds), VIDEO_COLUMNS))
    return "\n\n".join(parts)
