"""The scope the compiled path's own CUDA graph capture runs in, set by whoever hosts the library.

A host may watch the allocations of the thread it runs on: late-2026 ComfyUI records them in a "malloc graph"
while its model compiler runs, and a CUDA graph captured inside that record breaks both.  scd_core knows no
host; the node pack installs ComfyUI's way out (nodes/core_compat.py) and the capture runs through
`outside_host_graphs`.
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, TypeVar

Result = TypeVar("Result")
_scope: Callable[[], ContextManager[object]] = contextlib.nullcontext


def set_capture_scope(scope: Callable[[], ContextManager[object]]) -> None:
    """Run every later capture inside `scope()` (a fresh context manager per capture)."""
    global _scope
    _scope = scope


def outside_host_graphs(run: Callable[[], Result]) -> Result:
    """`run()` inside the host's scope: for a CUDA graph capture (or its warm-up calls) of the compiled path."""
    with _scope():
        return run()
