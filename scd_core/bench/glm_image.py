"""Model calls of GLM-Image's AR stage: AR, SJD, SCD and faithful on a GLM-Image-shaped synthetic model.

GLM-Image's text-to-image samples a preview grid (16 x 16 for a square image), then the large grid, one token
per 32 x 32 px (32 x 32 at 1024 px), among 16384 codes, at temperature 0.9 and top-p 0.75 (its
generation_config); image-to-image samples the large grid only.  The stand-in is a Markov field over those
grids (`GlmShapedModel`): each cell's law comes from its left and upper neighbours in its own grid and, in the
large grid, from the preview cell that covers it, at the medium entropy of the Janus-Pro stand-in (`bench
auto`), sampled at GLM-Image's defaults.  Its calls cost almost nothing: the tables count calls, which a GPU
turns into time at the cost of one window call.  The DiT after the AR stage is not touched: its 50 steps of two
passes each (cond and uncond at guidance 1.5) stay 100 calls, so end to end only the AR stage's calls change.
"""

from __future__ import annotations

import statistics
from typing import Sequence

import torch

from ..decoding.config import SamplerConfig
from ..decoding.engine import generate
from ..models.families.glm_image import DECODE_GUIDANCE, DECODE_STEPS, grid_sizes
from ..decoding.sampling import Sampling
from .nfe import mean_entropy
from .synthetic import GridModel
from .tables import markdown

# the temperature and top-p of GLM-Image's generation_config.json as published, which this table was measured at
# (the model's default law since adds generate's global top-k 50: models.generate_defaults)
DEFAULT_TEMPERATURE, DEFAULT_TOP_P = 0.9, 0.75
SAMPLED = Sampling(temperature=DEFAULT_TEMPERATURE, top_p=DEFAULT_TOP_P)  # what the published file samples with

CODES = 16384  # GLM-Image's image codes
MEDIUM_SHARPNESS = 1.5  # the Janus-Pro stand-in's (bench auto)
METHODS = (("AR", "independent"), ("SJD", "independent"), ("SCD-maximal", "maximal"), ("faithful", "faithful"))
SIDE = 1024  # text-to-image at 1024 x 1024: the 16 x 16 preview, then the 32 x 32 grid
# the DiT's network calls per image after the AR stage: a cond and an uncond pass per step under its guidance
DIT_CALLS = DECODE_STEPS * (2 if DECODE_GUIDANCE != 1 else 1)


def neighbour_table(grids: Sequence[tuple[int, int]]) -> torch.Tensor:
    """(positions, 3) earlier positions each cell reads, -1 for none: its left and upper neighbours in its own
    grid, and (grids after the first) the cell of the previous grid that covers it."""
    rows_out, start, previous = [], 0, None
    for rows, cols in grids:
        r = torch.arange(rows).repeat_interleave(cols)
        c = torch.arange(cols).repeat(rows)
        here = start + r * cols + c
        left = torch.where(c > 0, here - 1, -1)
        above = torch.where(r > 0, here - cols, -1)
        if previous is None:
            coarse = torch.full_like(here, -1)
        else:
            (coarse_rows, coarse_cols), coarse_start = previous
            coarse = coarse_start + (r * coarse_rows // rows) * coarse_cols + c * coarse_cols // cols
        rows_out.append(torch.stack([left, above, coarse], dim=1))
        previous, start = ((rows, cols), start), start + rows * cols
    return torch.cat(rows_out)


class GlmShapedModel(GridModel):
    """A synthetic model over GLM-Image's grids, in its generation order; it samples at GLM-Image's
    temperature and top-p unless a config sets them, and drafts `above` from one large-grid row back, as the
    GLM-Image adapter does."""

    default_temperature, default_top_p = DEFAULT_TEMPERATURE, DEFAULT_TOP_P

    def __init__(self, grids: Sequence[tuple[int, int]], vocab_size: int = CODES,
                 sharpness: float = MEDIUM_SHARPNESS, rank: int = 32, seed: int = 0) -> None:
        super().__init__(rows=grids[-1][0], cols=grids[-1][1], vocab_size=vocab_size, sharpness=sharpness,
                         rank=rank, seed=seed)
        self.grids = tuple(grids)
        self.num_tokens = sum(rows * cols for rows, cols in grids)
        gen = torch.Generator().manual_seed(seed + 1)
        self.coarse = torch.randn((vocab_size + 1, rank), generator=gen) / rank**0.5
        self.neighbours = neighbour_table(grids)

    def logits(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits of `positions` (B, T) given the tokens (B, N) written so far."""
        table = self.neighbours[positions]  # (B, T, 3)
        found = tokens.gather(1, table.clamp(min=0).flatten(1)).view(table.shape)
        ids = torch.where(table >= 0, found, self.vocab_size)
        hidden = self.left[ids[..., 0]] + self.above[ids[..., 1]] + self.coarse[ids[..., 2]]
        return hidden @ self.out.T + self.bias


def preview_calls(committed: Sequence[int], preview: int) -> int:
    """Calls until the preview grid's `preview` tokens are all committed (the call that finishes it counted
    with the preview; it may commit the large grid's first tokens too)."""
    total = 0
    for calls, count in enumerate(committed, start=1):
        total += count
        if total >= preview:
            return calls
    return len(committed)


def glm_rows(model: GlmShapedModel, windows: Sequence[int], seeds: Sequence[int]) -> list[dict]:
    """One row per method and window, with the calls until the first grid (the preview) is done and after."""
    first = model.grids[0][0] * model.grids[0][1]
    rows = []
    for label, coupler in METHODS:
        for window in ([1] if label == "AR" else windows):
            runs = [generate(model, None, SamplerConfig(coupler=coupler, window=window, seed=seed))
                    for seed in seeds]
            nfe = statistics.mean(run.nfe for run in runs)
            head = statistics.mean(preview_calls(run.committed, first) for run in runs)
            rows.append(dict(method=label, window=window, tokens=model.num_tokens, nfe=nfe,
                             preview_calls=head, large_calls=nfe - head,
                             tokens_per_call=model.num_tokens / nfe,
                             acceptance=statistics.mean(statistics.mean(run.acceptance[1:] or [1.0]) for run in runs)))
    ar = rows[0]
    for row in rows:
        row["ar_stage_speedup"] = ar["nfe"] / row["nfe"]
        row["saved"] = 1 - row["nfe"] / ar["nfe"]
        # both stages' network calls: the DiT's are the same whatever samples the tokens
        row["end_to_end_saved"] = 1 - (row["nfe"] + DIT_CALLS) / (ar["nfe"] + DIT_CALLS)
    return rows


def glm_image_tables(seeds: Sequence[int], windows: Sequence[int]) -> str:
    """The calls of each method at a 1024 px text-to-image, the preview grid's and the large grid's apart."""
    grids = grid_sizes(SIDE, SIDE)
    model = GlmShapedModel(grids)
    rows = glm_rows(model, windows, seeds)
    tokens = generate(model, None, SamplerConfig(window=1), batch_size=2).tokens
    (preview_rows, preview_cols), (large_rows, large_cols) = grids
    return (f"{SIDE} px text-to-image: the {preview_rows} x {preview_cols} preview grid, then the {large_rows} x "
            f"{large_cols} grid ({model.num_tokens} tokens), {CODES} codes, temperature {DEFAULT_TEMPERATURE} / top-p "
            f"{DEFAULT_TOP_P} ({mean_entropy(model, tokens, SAMPLED):.1f} nats/token sampled), {len(seeds)} "
            f"seed{'s' if len(seeds) > 1 else ''}\n\n"
            + markdown(rows, ("method", "window", "nfe", "preview_calls", "large_calls", "ar_stage_speedup", "saved",
                              "end_to_end_saved", "tokens_per_call", "acceptance")))
