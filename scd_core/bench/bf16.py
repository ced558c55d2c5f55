"""What holds in bfloat16: the demo images that differ where float32 gives the same tokens.

    python -m scd_core.bench bf16 --seeds 8

In float32 on this CPU the tests show equal tokens for faithful across widths, for a batch row against its seed
alone and for compiled against eager calls (tests/test_reproducible.py, tests/test_compile.py).  In bfloat16 a
call of another width, a batched call or a compiled kernel can round a position's logits differently, and a
draw that falls on such an edge picks another token (the image goes its own way from there; its law is the
same).  Each row counts the seeds whose image differs in any token from its reference, all with faithful.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import torch

from ..config import SamplerConfig
from ..engine import generate
from .tables import markdown

WINDOW = 32


def bf16_table(seeds: Sequence[int]) -> str:
    from ..models.loading import load_model

    eager = load_model("demo", "cpu", "bfloat16")
    cond = eager.encode("7")

    def tokens(model, window: int, seed: int, batch_size: int = 1) -> torch.Tensor:
        config = SamplerConfig(coupler="faithful", window=window, seed=seed)
        return generate(model, cond, config, batch_size=batch_size).tokens

    alone = [tokens(eager, WINDOW, seed)[0] for seed in seeds]
    ar = [tokens(eager, 1, seed)[0] for seed in seeds]
    batched = tokens(eager, WINDOW, seeds[0], len(seeds))  # row i is seed seeds[0] + i
    with warnings.catch_warnings(record=True) as caught:  # a failed compile runs eagerly: say so, not "equal"
        warnings.simplefilter("always", RuntimeWarning)
        compiled_model = load_model("demo", "cpu", "bfloat16", compile=True)
        compiled = [tokens(compiled_model, WINDOW, seed)[0] for seed in seeds]
    failed = [str(w.message) for w in caught if "eagerly" in str(w.message)]

    def differ(others: Sequence[torch.Tensor]) -> str:
        return f"{sum(not torch.equal(a, b) for a, b in zip(alone, others))}/{len(seeds)}"

    rows = [{"comparison": f"window {WINDOW} against window 1 (plain AR)", "differ": differ(ar)},
            {"comparison": f"row of a batch of {len(seeds)} against its seed alone (window {WINDOW})",
             "differ": differ(list(batched))},
            {"comparison": f"compiled against eager calls (window {WINDOW})",
             "differ": f"not measured: {failed[0][:120]}" if failed else differ(compiled)}]
    return (f"**demo in bfloat16, faithful, seeds {seeds[0]}-{seeds[-1]}**: images that differ from the reference "
            f"in any token (float32: none)\n\n{markdown(rows, ('comparison', 'differ'))}")
