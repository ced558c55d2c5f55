"""Model calls of Emu3.5-Image at 1024 px: AR, SJD, SCD and faithful on an Emu3.5-shaped synthetic model.

Emu3.5 writes a 1024 x 1024 image as 64 rows of 64 codes among 131072, each row but the last ended by EOL and the
image by EOI: 4160 positions, of which the 64 ends are forced (no call of their own).  It samples at temperature 1
and top-k 5120 after its guidance.  The stand-in (`Emu3p5ShapedModel`) is the synthetic grid of `bench nfe` over
that layout: each cell's law comes from its left and upper neighbours (a row end reads as "no neighbour"), at the
medium sharpness of the Janus-Pro stand-in, sampled with top-k.  By default its codebook is 16x smaller (8192
codes, top-k 320: the same share of the codes), 16 times less sampling work at every slot than the published
131072 (`--codes 131072`).  Its calls cost
almost nothing: the table counts calls, which a GPU turns into time at the cost of one window call.  Guidance is
left out: it changes each position's law, not the layout the calls depend on.
"""

from __future__ import annotations

from typing import Sequence

from ..decoding.config import SamplerConfig
from ..decoding.engine import generate
from ..models.families.emu3p5 import DEFAULT_SIZE, IMAGE_MODEL
from ..decoding.sampling import Sampling
from .glm_image import MEDIUM_SHARPNESS, METHODS
from .nfe import mean_entropy, window_rows
from .synthetic import GridModel
from .tables import markdown

CODES = 131072  # Emu3.5's visual tokens
TOP_K = IMAGE_MODEL[1]  # Emu3.5-Image's image top-k
BENCH_CODES = 8192  # the stand-in's default codebook (see above)


class Emu3p5ShapedModel(GridModel):
    """The synthetic grid over Emu3.5's layout: rows of `cols` codes plus a forced row end, a forced image end;
    code ids are 0 .. codes - 1, the row end the grid's "no neighbour" id and the image end the one after it.
    It samples at top-k TOP_K scaled to its codebook."""

    def __init__(self, rows: int, cols: int, codes: int = BENCH_CODES, sharpness: float = MEDIUM_SHARPNESS,
                 seed: int = 0) -> None:
        super().__init__(rows=rows, cols=cols + 1, vocab_size=codes, sharpness=sharpness, seed=seed)
        self.default_top_k = max(1, TOP_K * codes // CODES)
        row_end, image_end = codes, codes + 1
        self.forced_tokens = {row * (cols + 1) + cols: row_end for row in range(rows - 1)}
        self.forced_tokens[self.num_tokens - 1] = image_end


def emu3p5_rows(model: Emu3p5ShapedModel, windows: Sequence[int], seeds: Sequence[int]) -> list[dict]:
    rows = window_rows(model, METHODS, windows, seeds)
    for row in rows:
        row["speedup"] = rows[0]["nfe"] / row["nfe"]
        row["saved"] = 1 - row["nfe"] / rows[0]["nfe"]
    return rows


def emu3p5_tables(seeds: Sequence[int], windows: Sequence[int], codes: int = BENCH_CODES) -> str:
    """The calls of each method for one 1024 px image."""
    rows, cols = DEFAULT_SIZE
    model = Emu3p5ShapedModel(rows, cols, codes)
    table = emu3p5_rows(model, windows, seeds)
    tokens = generate(model, None, SamplerConfig(window=1, seed=0)).tokens
    entropy = mean_entropy(model, tokens, Sampling(top_k=model.default_top_k))
    return (f"1024 px: {rows} rows of {cols} codes, {rows - 1} row ends and the image end forced ({model.num_tokens} "
            f"positions), {codes} codes, top-k {model.default_top_k} ({entropy:.1f} nats/token sampled), "
            f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''}\n\n"
            + markdown(table, ("method", "window", "nfe", "speedup", "saved", "tokens_per_call", "acceptance")))
