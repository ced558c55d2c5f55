"""Calls with static shapes, compiled: torch.compile'd regions with their eager fallback (CUDA graphs of those
calls: scd_core.compiled.cuda_graphs).

A model loaded with `compile=True` runs every window call at its bucket's width (the window, or one of the
automatic window's widths 1, 2, 4, ..., 64): a call narrower than its bucket at the end of the image feeds
drafts past the last position, whose slots the engine already ignores (commits never pass the last
position, and each row's block verification ends at its last position, as in any call).  The family's
session reads its whole pre-sized KV cache with a mask built on the device (`RowCache.static`); per-row
lengths, positions, seed keys and call counters are device tensors; nothing in the forward,
the verification or the coupling reads a value back to the host.  So each bucket has one shape, and:

  - torch.compile (inductor, `dynamic=False`, `fullgraph=True`) compiles the family's decoder layer once per
    width (regional: one layer class serves every layer) and the engine's sampling step once per width
    and sampler setting, on any device (this module);
  - on CUDA, the whole step (forward, distributions, verification, coupling) is captured as one CUDA graph
    per width and replayed with its inputs copied into a static buffer (scd_core.compiled.cuda_graphs).

Either falls back to eager, with one warning, when it fails (whatever it raises: dynamo's and inductor's errors,
the recompile limit's plain Exception, a missing C++ compiler), and the generation's result lists what ran
eagerly and why (`eager_fallbacks`); on a torch older than the oldest the tests run
(OLDEST_TESTED_TORCH), compile=True runs eagerly with one warning.  Compiled code is kept for the process (and in
inductor's on-disk cache).  What it is specialised on is kept to shapes: the sampler's numbers are device
tensors (`sampling.sampler_tensors`), and a static KV cache holds its prompt's slots rounded up to a bucket
(`row_session.PROMPT_BUCKET`), so prompts of one bucket share their compiled code.

Families that declare `compile` (`models.family.Family`) are `compilable.Compilable`: through their own blocks
or the row attention (`models.row_attention.attention_layer`).  Trees of candidates are refused (they would grow
the cache); rows that finish stay in the batch (regrouping would change the shapes).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Optional

import torch

from ..model import Logits

# dynamo compiles one graph per width bucket, batch size, cache size and coupler for each compiled function;
# its default limit (8 per function) would be reached by a process that switches couplers
RECOMPILE_LIMIT = 64
OLDEST_TESTED_TORCH = (2, 11)  # tests/run.sh's oldest tier, the GPU image's: compile=True runs eagerly before it
BACKEND = "inductor"
_WARNED: set[str] = set()
_EAGER = [0]  # > 0 within `eager_regions`


def warn_once(key: str, message: str) -> None:
    """Warn with `message` the first time `key` comes in this process (compile and CUDA-graph fallbacks)."""
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def error_line(err: Exception) -> str:
    """An error as one line for a warning or a report."""
    return f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"


def recompile_limit_name(config: Any) -> str:
    """The name of dynamo's per-function graph limit in `config` (torch._dynamo.config): `recompile_limit`
    from torch 2.7 on, `cache_size_limit` before."""
    return "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"


def raise_recompile_limit(config: Any) -> None:
    """Lift dynamo's per-function graph limit in `config` to RECOMPILE_LIMIT (never lower it)."""
    name = recompile_limit_name(config)
    setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))


def torch_tested(version: str) -> bool:
    """Whether torch `version` ("2.13.0+cu130") is at least the oldest one the compiled tests run on."""
    major, minor = (int("".join(ch for ch in part if ch.isdigit()) or 0) for part in version.split(".")[:2])
    return (major, minor) >= OLDEST_TESTED_TORCH


class CompiledRegion:
    """`fn` through torch.compile, or `fn` itself once compiling it failed (one warning per region)."""

    shared_across_generations = True  # (graph_state: one region for the model's or the process's life)

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self.fn, self.name = fn, name
        self.compiled: dict[str, Callable[..., Any]] = {}  # by BACKEND (tests trace with "eager": no codegen)
        self.error: Optional[str] = None  # why compiling failed, for reports (the device check's table)

    @property
    def failed(self) -> bool:
        return self.error is not None

    def __call__(self, *args: Any) -> Any:
        if self.failed or _EAGER[0]:
            return self.fn(*args)
        try:
            if BACKEND not in self.compiled:
                from torch import _dynamo  # (not `import torch._dynamo`: that would make `torch` a local name)

                raise_recompile_limit(_dynamo.config)
                self.compiled[BACKEND] = torch.compile(self.fn, dynamic=False, fullgraph=True, backend=BACKEND)
            return self.compiled[BACKEND](*args)
        except torch.cuda.OutOfMemoryError:  # not a compile failure: the eager call would need the memory too
            raise
        except Exception as err:  # compile failures have no common type; they raise before the graph runs
            # an error of `fn` itself raises again here, as it would have without compile
            result = self.fn(*args)
            self.error = error_line(err)
            warn_once(f"compile:{self.name}", f"torch.compile of {self.name} failed, running it eagerly: "
                      f"{self.error}")
            return result


@contextlib.contextmanager
def eager_regions() -> Any:
    """Compiled regions run their own function within: for a call of a shape no bucket has (a call widened over
    given cells), which would compile a graph for a width that may not come again."""
    _EAGER[0] += 1
    try:
        yield
    finally:
        _EAGER[0] -= 1


def compile_region(fn: Callable[..., Any], name: str) -> CompiledRegion:
    """A compiled `fn` (tensors and constants in, tensors out) with an eager fallback."""
    return CompiledRegion(fn, name)


def _decide(decoder: Any, logits: Logits, width: int) -> tuple[torch.Tensor, torch.Tensor, None]:
    return decoder.decide(logits, width, 0, None)


# one region for the process: compiled once per width and sampler setting, whichever generation calls it
SAMPLING_STEP = compile_region(_decide, "the sampling step")


def eager_fallbacks(model: Any, graphs: Any = None) -> list[str]:
    """What of a compiled model's generation ran eagerly, and why: its compiled layer or the sampling step
    (whose compile failed, in this process), or its CUDA graphs (`graphs`, the generation's
    `cuda_graphs.GraphedSteps` or None: whose capture failed in this generation)."""
    regions = (getattr(model, "compiled_layer", None), SAMPLING_STEP)
    found = [f"{region.name}: {region.error}" for region in regions
             if isinstance(region, CompiledRegion) and region.failed]
    if graphs is not None and graphs.failed:
        found.append(f"the CUDA graphs of the window call: {graphs.error}")
    return found
