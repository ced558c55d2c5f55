"""A config read against one model: what a run samples with.

The sampling values (the model's recommended ones where the config leaves them unset), the model's sampled
sub-vocabulary, where initial drafts are copied from, and whether the session needs its uncond rows.  The
engine reads them once per run.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import torch

from . import sampler_options
from .config import SamplerConfig
from ..model import Session, TokenModel, model_default
from .sampling import Sampling


def code_tables(code_ids: Any, vocab: int, forced_ids: Any, device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(code index -> model id, model id -> code index) for a model's sampled sub-vocabulary.

    Without `code_ids` the model samples its whole vocabulary and both maps are the identity.
    """
    codes = torch.arange(vocab) if code_ids is None else torch.as_tensor(code_ids, dtype=torch.long).flatten()
    if codes.numel() != vocab or codes.unique().numel() != vocab or (codes < 0).any():
        raise ValueError(f"model.code_ids must hold vocab_size={vocab} distinct non-negative ids, "
                         f"got {codes.numel()} ({codes.unique().numel()} distinct)")
    size = max([int(codes.max()) + 1] + [int(i) + 1 for i in forced_ids])
    index = torch.zeros(size, dtype=torch.long).scatter_(0, codes, torch.arange(vocab))
    return codes.to(device), index.to(device)


def sampling_settings(model: TokenModel, config: SamplerConfig) -> Sampling:
    """The config's sampler options, the model's recommended values where it has none."""
    return sampler_options.resolved(model, config)


def start_session(model: TokenModel, cond: Any, batch_size: int, config: SamplerConfig) -> Session:
    """`model.start(cond, batch_size)`, without the uncond rows (`guided=False`) where the model's start can
    leave them out and the run's guidance scale is 1 at every position: their logits would never be read.  A
    model with a guidance schedule keeps them (its scale may differ from 1 somewhere)."""
    start = model.start
    if (sampling_settings(model, config).cfg_scale == 1.0 and not callable(getattr(model, "cfg_schedule", None))
            and "guided" in inspect.signature(start).parameters):
        return start(cond, batch_size, guided=False)
    return start(cond, batch_size)


def draft_source(model: TokenModel, config: SamplerConfig) -> Optional[int]:
    """How far back (in positions) an initial draft is copied from: None for random drafts, 1 for the left
    neighbour, a grid row for `above`, a grid frame for `previous_frame`.  Unset, the model's default applies."""
    draft_init = config.draft_init or model_default(model, "default_draft_init", "above")
    if draft_init == "random":
        return None
    grid = tuple(getattr(model, "grid", None) or ())
    if draft_init == "previous_frame":
        if len(grid) != 3:
            raise ValueError("draft_init 'previous_frame' needs a video model (grid = (frames, rows, cols)); "
                             f"this model's grid is {grid or 'not declared'}")
        return grid[1] * grid[2]
    if draft_init == "above" and grid:
        return grid[-1]
    return 1
