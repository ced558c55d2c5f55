"""`generate_many`: a stream of (conditioning, seed) jobs over one model, each result as its job finishes.

Reference version; replaced by the continuous batcher.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable, Iterator

from .config import SamplerConfig
from .engine import GenerationResult, generate
from .model import TokenModel


def generate_many(model: TokenModel, jobs: Iterable[tuple[Any, int]], config: SamplerConfig, slots: int = 1
                  ) -> Iterator[tuple[int, GenerationResult]]:
    """Yield (job index, result) for each (cond, seed) job of `jobs`, in the order the jobs finish.

    Each job's tokens equal `generate(model, cond, replace(config, seed=seed))`'s; up to `slots` jobs are in
    flight.  Reference version; replaced by the continuous batcher: it runs the jobs one by one.
    """
    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
        raise ValueError(f"slots must be an integer >= 1, got {slots!r}")
    for index, (cond, seed) in enumerate(jobs):
        yield index, generate(model, cond, replace(config, seed=seed))
