"""Decoded pixels that depend on the tokens alone: every image decoded by itself, on one CPU thread.

An image decoder's float sums (convolutions, norms) are ordered by the CPU thread count and by the batch a row
is decoded in, so a rounded pixel can move by one level between a `generate` of a batch on every thread and a
`batch` job decoded alone.  `load_model` wraps each family's `decode` in `steady_decode`, so a seed's image is
the same bytes from the library, the command line, a batch job, a Ray worker and the ComfyUI nodes (on one
kind of device).  The cost: a CPU decodes on one thread (the demo: about 0.02 s an image either way).
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch


@contextmanager
def one_thread() -> Iterator[None]:
    """torch's CPU ops on one thread, then the caller's thread count again."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def steady_decode(decode: Callable[..., torch.Tensor], rows_alone: bool = False) -> Callable[..., torch.Tensor]:
    """`decode(tokens (batch, N), ...)` run row by row on one thread, the rows' outputs concatenated in order
    (a video's frames stay grouped by row); anything but a batch of several rows goes to `decode` as it is,
    which checks it.  `rows_alone`: `decode` already takes each row by itself (MammothModa2's, which runs every
    row's LLM re-encode before its first DiT step, so that a host swaps the two stages once a batch), so only the
    thread count is set."""

    @functools.wraps(decode)
    def decode_each_alone(tokens: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        with one_thread():
            if rows_alone or not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.shape[0] < 2:
                return decode(tokens, *args, **kwargs)
            return torch.cat([decode(row, *args, **kwargs) for row in tokens.split(1)])

    return decode_each_alone
