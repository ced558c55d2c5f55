"""transformers' cache glue the families and benchmarks share: the cache keyword of this release, a plain
cache, and a `Cache` view over a RowCache (rows at their own pace) for transformers' own layers."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from .row_cache import RowCache


def cache_keyword() -> str:
    # transformers 5.24 renamed `past_key_values` to `cache`; the old name warns until 5.40 removes it.
    from transformers import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


def new_cache() -> Any:
    from transformers import DynamicCache

    return DynamicCache()


@functools.lru_cache(maxsize=None)
def row_cache_view() -> type:
    """A transformers `Cache` whose storage is a RowCache (built lazily: transformers is imported on use)."""
    from transformers import DynamicCache

    class RowCacheView(DynamicCache):
        """What the Llama layers call in every supported release: `update(k, v, layer_idx, ...)`.

        Lengths are the RowCache's; the session passes the 4-D mask and the position
        ids, so transformers never derives them from this cache.
        """

        def __init__(self, rows: RowCache) -> None:
            super().__init__()
            self.rows = rows

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            return self.rows.write(layer_idx, key_states, value_states)

        def get_seq_length(self, layer_idx: int = 0) -> int:
            return self.rows.longest

    return RowCacheView
