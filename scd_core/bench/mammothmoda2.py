"""Model calls of MammothModa2's token stage: AR, SJD, SCD and faithful on a MammothModa2-shaped synthetic model,
and what they leave of an image's time once the DiT is counted (Amdahl).

MammothModa2 samples `rows` rows of `cols` codes among 16384, each row closed by an EOL that its loop overwrites
(forced here: no call of its own), and no image end; then a ~2B DiT turns an LLM re-encoding of the tokens into
pixels.  The authors' law: CFG 6 on the raw logits of a cond row and an uncond row (the prompt's last 10 tokens),
then temperature, top-k and top-p, each keeping at least 3 tokens.  The stand-in (`MammothShapedModel`) is the
synthetic grid of `bench nfe` over that layout at the Janus-Pro stand-in's medium sharpness: its uncond row is the
grid's field over the same image tokens (the image model without the text), its cond row adds a prompt term of its
own; guidance mixes the two as the authors do.  Its calls cost almost nothing: the table counts calls (measured)
and turns them into seconds with published timings (derived).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..decoding.config import SamplerConfig
from ..decoding.engine import generate
from ..decoding.sampling import Sampling
from .glm_image import MEDIUM_SHARPNESS, METHODS
from .nfe import mean_entropy, window_rows
from .synthetic import GridModel, Logits
from .tables import markdown

CODES = 16384  # visual ids 152072 .. 168455 (t2i_generation_config.json's visual_token_start_id / end_id)
CFG_SCALE = 6.0  # generate_t2i's default cfg_scale
MIN_TOKENS_KEPT = 3  # the authors' TopK / TopP warpers' min_tokens_to_keep
# t2i_generation_config.json's values were not read (docs/models.md): top-k 2048 at temperature 1 and top-p 1 is
# the sampling vLLM-Omni's MammothModa2 example passed (run_mammothmoda2_t2i.py, deleted in vllm-omni #4691)
TOP_K, TEMPERATURE, TOP_P = 2048, 1.0, 1.0
PROMPT_SHARE = 0.2  # the cond row's prompt term against the image field (x CFG 6: a little above it)
GRIDS = ((32, 32), (64, 64))  # Preview's generate_t2i default at 1024 px; vLLM-Omni's size / 16 at 1024 px
# vLLM-Omni on one A800 at 1024 px, 64 x 64 grid, unguided AR (vllm-omni #7215): AR 78.9 s over 64 x 65 steps and
# the image end (4161), DiT 17.2 s (50 steps, VAE included); the DiT's time depends on the pixels, not the grid
PUBLISHED_AR_S, PUBLISHED_AR_STEPS, PUBLISHED_DIT_S = 78.9, 64 * 65 + 1, 17.2
STEP_S = PUBLISHED_AR_S / PUBLISHED_AR_STEPS
WINDOW_CALL_COSTS = (1.0, 1.5)  # a window call's time in one-token steps: memory-bound at 8B (1), or dearer


class MammothShapedModel(GridModel):
    """The synthetic grid over MammothModa2's layout: rows of `cols` codes plus a forced EOL (the grid's "no
    neighbour" id), guided at CFG 6 and sampled at TOP_K, TEMPERATURE, TOP_P keeping at least 3 tokens."""

    default_cfg_scale, default_top_k = CFG_SCALE, TOP_K
    default_temperature, default_top_p, min_tokens_kept = TEMPERATURE, TOP_P, MIN_TOKENS_KEPT

    def __init__(self, rows: int, cols: int, codes: int = CODES, sharpness: float = MEDIUM_SHARPNESS,
                 seed: int = 0) -> None:
        super().__init__(rows=rows, cols=cols + 1, vocab_size=codes, sharpness=sharpness, seed=seed)
        self.forced_tokens = {row * (cols + 1) + cols: codes for row in range(rows)}
        gen = torch.Generator().manual_seed(seed + 1)
        self.prompt = torch.randn(self.out.shape, generator=gen) * sharpness * PROMPT_SHARE

    def scores(self, tokens: torch.Tensor, positions: torch.Tensor) -> Logits:
        """(cond, uncond): the uncond row sees the image tokens only, the cond row the prompt term too."""
        hidden = self.hidden(tokens, positions)
        uncond = hidden @ self.out.T + self.bias
        return uncond + hidden @ self.prompt.T, uncond


def seconds(calls: float, window: int, call_cost: float) -> float:
    """Derived AR-stage seconds: `calls` at the published per-step time, a call of width > 1 at `call_cost`."""
    return calls * STEP_S * (call_cost if window > 1 else 1.0)


def mammoth_rows(model: MammothShapedModel, windows: Sequence[int], seeds: Sequence[int]) -> list[dict]:
    """One row per method and window: measured calls, then derived AR-stage seconds and end-to-end speedups."""
    rows = window_rows(model, METHODS, windows, seeds)
    ar_calls = rows[0]["nfe"]
    ar_total = seconds(ar_calls, 1, 1.0) + PUBLISHED_DIT_S
    for row in rows:
        row["ar_speedup"] = ar_calls / row["nfe"]
        row["ar_s"] = seconds(row["nfe"], row["window"], 1.0)
        row["ar_share"] = row["ar_s"] / (row["ar_s"] + PUBLISHED_DIT_S)
        for cost in WINDOW_CALL_COSTS:
            row[f"e2e_speedup_{cost:g}x"] = ar_total / (seconds(row["nfe"], row["window"], cost) + PUBLISHED_DIT_S)
    return rows


COLUMNS = ("method", "window", "nfe", "ar_speedup", "tokens_per_call", "acceptance", "ar_s", "ar_share",
           *(f"e2e_speedup_{cost:g}x" for cost in WINDOW_CALL_COSTS))


def mammoth_tables(seeds: Sequence[int], windows: Sequence[int], grids: Sequence[tuple[int, int]] = GRIDS) -> str:
    """The calls of each method at each grid, and the end-to-end share the DiT leaves."""
    parts = []
    for rows, cols in grids:
        model = MammothShapedModel(rows, cols)
        table = mammoth_rows(model, windows, seeds)
        tokens = generate(model, None, SamplerConfig(window=1, seed=0)).tokens
        law = Sampling(cfg_scale=CFG_SCALE, temperature=TEMPERATURE, top_k=TOP_K, top_p=TOP_P,
                       keep_at_least=MIN_TOKENS_KEPT)
        parts.append(f"**{rows} x {cols} grid**: {rows} rows of {cols} codes, {rows} EOLs forced ({model.num_tokens} "
                     f"positions), {CODES} codes, CFG {CFG_SCALE:g}, top-k {TOP_K} "
                     f"({mean_entropy(model, tokens, law):.1f} nats/token sampled), {len(seeds)} "
                     f"seed{'s' if len(seeds) > 1 else ''}\n\n" + markdown(table, COLUMNS))
    return "\n\n".join(parts)
