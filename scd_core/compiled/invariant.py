"""Window calls whose logits do not depend on the window: every matrix product and row reduction at one shape.

A position's logits must be a function of its prefix only, or faithful's seed stops deciding the image.  In
bfloat16 and float16 they are not, as the kernels run: which GEMM and attention kernel runs, and how it splits
its reductions, depends on the shape of the call (measured on this CPU, torch 2.14, bfloat16: `F.linear` gives a
row other bits in a call of more than 32 rows at K >= 512, of 31 at K = 11008; float16 at 2 rows already;
`scaled_dot_product_attention` gives a query row other bits when the number of query rows or the key length
changes).  Run at one fixed shape the same kernels give every row the same bits wherever it sits among the
others, whatever they hold (measured for linear at 8, 32 and 64 rows up to K = 11008, and for attention at 1 to
256 query rows up to 1100 keys, bfloat16, float16 and float32).  So while `fixed_shape_calls` is active:

- every linear layer runs over its input rows in tiles of exactly `tile_rows(device)` rows (the last one padded
  with zeros): batch x copies x width rows, the prompt's and the heads' included; so do torch's fused int8
  matmul and a module wrapped by `row_tiled` (bitsandbytes' 4-bit layers: a custom op the mode cannot enter);
- every reduction along a row's last dimension (the norms' `mean(-1)`, `layer_norm`, `rms_norm`, the sampler's
  top-p `sum` and `cumsum`) runs in the same tiles: on CUDA a reduction's lanes per row follow the call's row
  count (1, 2, 4, 8 or 16+ rows reduce a row in other orders);
- every attention call runs its query rows in tiles of as many rows (padded rows see every key) over a key
  length that the cache keeps fixed (`RowCache.full_keys`: the whole pre-sized cache, masked);
- the process-wide numerics switches that other ComfyUI nodes flip (TF32, reduced-precision reductions, fp16
  accumulation, the BLAS library, the SDPA backends, oneDNN on the CPU) are held at torch's defaults, and put
  back after (`PINNED`).  Bits still depend on the machine: the same GPU model (and SM count), torch, CUDA and
  driver give the same image; another CPU instruction set or GPU may not.

The tile is 32 rows on a CPU, where a padded row costs its arithmetic, and 128 on CUDA, where a call of up to
about 150 rows costs the read of its weights whatever its rows (performance facts for H100 / H200; a tile of 32
would read the weights twice in a window-32 call with CFG, four times at 64).  The CUDA choice is not measured
yet: `python -m scd_core.bench device-run` compares tiles of 32, 64 and 128 rows there, bits and time.

Element-wise work (activations, rotary embeddings) never mixes rows; softmax runs one row per block or warp on
CUDA and per row on the CPU, so it is left as it comes.  Which dtypes take all this: `wanted`; the padding costs
the narrow calls most (scd_core/bench/README.md, "Window-invariant calls").
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from typing import Any, Callable, Iterator, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

TILE_ROWS = {"cuda": 128}  # rows of every linear tile and query rows of every attention tile, by device type
DEFAULT_TILE_ROWS = 32     # elsewhere (the CPU)

# "auto": bfloat16 and float16 (float32's kernels round alike at the shapes measured: tests/test_reproducible.py);
# "on": every dtype; "off": today's calls, each at its own shape (the cheapest; a seed's image then depends on
# the window in bfloat16 / float16)
POLICIES = ("auto", "on", "off")
POLICY_VARIABLE = "SCD_INVARIANT_CALLS"
HALF_DTYPES = (torch.bfloat16, torch.float16)


def policy() -> str:
    """The process's policy: `SCD_INVARIANT_CALLS` (auto when unset)."""
    name = os.environ.get(POLICY_VARIABLE, "auto").strip().lower() or "auto"
    if name not in POLICIES:
        raise ValueError(f"{POLICY_VARIABLE}={name!r}: use one of {', '.join(POLICIES)}")
    return name


def wanted(dtype: torch.dtype) -> bool:
    """Whether calls computing in `dtype` run at fixed shapes under the process's policy."""
    chosen = policy()
    return chosen == "on" or (chosen == "auto" and dtype in HALF_DTYPES)


def tile_rows(device: torch.device) -> int:
    """The rows of a tile on `device`."""
    return TILE_ROWS.get(device.type, DEFAULT_TILE_ROWS)


def _padded_rows(x: torch.Tensor, dim: int, multiple: int, value: Any = 0) -> torch.Tensor:
    """`x` with zeros (or `value`) appended along `dim` up to a multiple of `multiple`."""
    extra = -x.shape[dim] % multiple
    if not extra:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, torch.full(shape, value, dtype=x.dtype, device=x.device)], dim=dim)


def in_row_tiles(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, rows: int) -> torch.Tensor:
    """`fn` (row-wise: one output row per input row) over `x`'s rows (its leading dimensions flattened) in
    calls of exactly `rows` rows each, the last padded with zeros."""
    flat = _padded_rows(x.reshape(-1, x.shape[-1]), 0, rows)
    out = _joined([fn(tile) for tile in flat.split(rows)], 0)
    return out[:x.shape[:-1].numel()].reshape(*x.shape[:-1], out.shape[-1])


def tiled_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                 rows: int = DEFAULT_TILE_ROWS) -> torch.Tensor:
    """`F.linear(x, weight, bias)` as GEMMs of exactly `rows` rows each."""
    return in_row_tiles(lambda tile: F.linear(tile, weight, bias), x, rows)


def tiled_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0, is_causal: bool = False,
                    scale: Optional[float] = None, enable_gqa: bool = False, rows: int = DEFAULT_TILE_ROWS
                    ) -> torch.Tensor:
    """`F.scaled_dot_product_attention` with its query rows in tiles of exactly `rows` (masked calls only: a
    causal one's mask depends on where its tile starts)."""
    options = dict(dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa)
    if attn_mask is None or is_causal or attn_mask.dim() < 2:
        return F.scaled_dot_product_attention(query, key, value, attn_mask, is_causal=is_causal, **options)
    count = query.shape[-2]
    # a mask row broadcast to every query is written out: each tile reads one mask layout
    masks = attn_mask.expand(*attn_mask.shape[:-2], count, attn_mask.shape[-1])
    masks = _padded_rows(masks, -2, rows, True if attn_mask.dtype == torch.bool else 0)  # padding sees every key
    tiles = [F.scaled_dot_product_attention(tile, key, value, mask, **options)
             for tile, mask in zip(_padded_rows(query, -2, rows).split(rows, dim=-2), masks.split(rows, dim=-2))]
    return _joined(tiles, -2)[..., :count, :]


def _joined(tiles: list[torch.Tensor], dim: int) -> torch.Tensor:
    """The tiles' outputs as one tensor (one tile, the common case on CUDA, as it is: no copy, no launch)."""
    return tiles[0] if len(tiles) == 1 else torch.cat(tiles, dim=dim)


def _along_rows(x: Any, dim: Any) -> bool:
    """Whether a reduction over `dim` of `x` reduces each row of a (rows..., width) tensor along its last dim."""
    dims = tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)
    return (isinstance(x, torch.Tensor) and x.dim() >= 2 and x.is_floating_point() and len(dims) == 1
            and isinstance(dims[0], int) and dims[0] in (-1, x.dim() - 1))


def tiled_reduction(func: Callable[..., torch.Tensor], keeps_width: bool, rows: int
                    ) -> Callable[..., torch.Tensor]:
    """`func(x, dim, ...)` (mean / sum, or cumsum where `keeps_width`) in row tiles when it runs along the last
    dim of a float tensor of rows; any other call as it comes."""
    def run(x: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        dim = args[0] if args else kwargs.get("dim")
        if not _along_rows(x, dim):
            return func(x, *args, **kwargs)
        args, kwargs = args[1:], {name: value for name, value in kwargs.items() if name != "dim"}
        if keeps_width:
            return in_row_tiles(lambda tile: func(tile, -1, *args, **kwargs), x, rows)
        keepdim = args[0] if args else kwargs.pop("keepdim", False)
        out = in_row_tiles(lambda tile: func(tile, -1, True, *args[1:], **kwargs), x, rows)
        return out if keepdim else out.squeeze(-1)
    return run


def tiled_norm(func: Callable[..., torch.Tensor], rows: int) -> Callable[..., torch.Tensor]:
    """`F.layer_norm` / `F.rms_norm` over the last dim in row tiles; any other call as it comes."""
    def run(x: Any, normalized_shape: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        if not (_along_rows(x, -1) and len(tuple(normalized_shape)) == 1):
            return func(x, normalized_shape, *args, **kwargs)
        return in_row_tiles(lambda tile: func(tile, normalized_shape, *args, **kwargs), x, rows)
    return run


def tiled_rows_first(func: Callable[..., torch.Tensor], rows: int) -> Callable[..., torch.Tensor]:
    """`func(x, ...)` whose output rows follow the rows of its first argument (a matmul), in row tiles."""
    return lambda x, *args, **kwargs: in_row_tiles(lambda tile: func(tile, *args, **kwargs), x, rows)


# the row reductions the mode tiles (name, whether the output keeps the row's width) and the norms
ROW_REDUCTIONS = (("mean", False), ("sum", False), ("cumsum", True))
NORMS = ("layer_norm", "rms_norm")  # (rms_norm: torch >= 2.4)


def _routes(rows: int) -> dict[Callable[..., Any], Callable[..., torch.Tensor]]:
    routes = {F.linear: functools.partial(tiled_linear, rows=rows),
              F.scaled_dot_product_attention: functools.partial(tiled_attention, rows=rows),
              torch._weight_int8pack_mm: tiled_rows_first(torch._weight_int8pack_mm, rows)}
    routes.update({getattr(F, name): tiled_norm(getattr(F, name), rows) for name in NORMS if hasattr(F, name)})
    routes.update({func: tiled_reduction(func, keeps_width, rows) for name, keeps_width in ROW_REDUCTIONS
                   for func in (getattr(torch, name), getattr(torch.Tensor, name))})
    return routes


class FixedShapeCalls(TorchFunctionMode):
    """Routes the matrix products, attention and row reductions through their tiled versions, in tiles of
    `rows`."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.rows = rows
        self.routes = _routes(rows)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        route = self.routes.get(func)
        return (route or func)(*args, **(kwargs or {}))


class _Switch(NamedTuple):
    """A process-wide numerics switch, the value torch starts with, and the devices whose kernels read it."""

    name: str
    read: Callable[[], Any]
    write: Callable[[Any], None]
    default: Any
    devices: tuple[str, ...]


def _attribute(label: str, owner: Any, name: str, default: Any, devices: tuple[str, ...]) -> Optional[_Switch]:
    if not hasattr(owner, name):  # older torch: the switch does not exist, nothing can flip it
        return None
    return _Switch(label, lambda: getattr(owner, name), lambda value: setattr(owner, name, value), default, devices)


def _sdpa(name: str) -> Optional[_Switch]:
    cuda = torch.backends.cuda
    if not hasattr(cuda, f"{name}_sdp_enabled"):
        return None
    # (the CPU's attention reads them too: its flash kernel and the math one)
    return _Switch(f"{name}_sdp", getattr(cuda, f"{name}_sdp_enabled"), getattr(cuda, f"enable_{name}_sdp"), True,
                   ("cpu", "cuda"))


def _pinned() -> tuple[_Switch, ...]:
    matmul, cuda = torch.backends.cuda.matmul, ("cuda",)
    switches = [
        _attribute("bf16_reduced_precision_reduction", matmul, "allow_bf16_reduced_precision_reduction", True, cuda),
        _attribute("fp16_reduced_precision_reduction", matmul, "allow_fp16_reduced_precision_reduction", True, cuda),
        _attribute("fp16_accumulation", matmul, "allow_fp16_accumulation", False, cuda),
        _attribute("cudnn_tf32", torch.backends.cudnn, "allow_tf32", True, cuda),  # (convolutions: image decoders)
        _attribute("onednn", torch.backends.mkldnn, "enabled", True, ("cpu",)),
        # (matmul.allow_tf32 is this switch's other spelling: "highest" is TF32 off)
        _Switch("float32_matmul_precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision,
                "highest", ("cpu", "cuda")),
        *(_sdpa(name) for name in ("flash", "mem_efficient", "math", "cudnn"))]
    if hasattr(torch.backends.cuda, "preferred_blas_library"):
        blas = torch.backends.cuda.preferred_blas_library
        switches.append(_Switch("preferred_blas_library", lambda: blas().name.lower(), blas, "cublas", cuda))
    return tuple(switch for switch in switches if switch is not None)


PINNED = _pinned()  # what fixed_shape_calls holds at torch's defaults while it runs


@contextlib.contextmanager
def pinned_numerics(device: torch.device) -> Iterator[None]:
    """Hold the switches that `device`'s kernels read at torch's defaults inside, and put back what was set."""
    changed = []
    for switch in PINNED:
        if device.type in switch.devices and switch.read() != switch.default:
            changed.append((switch, switch.read()))
            switch.write(switch.default)
    try:
        yield
    finally:
        for switch, value in reversed(changed):
            switch.write(value)


_ACTIVE_ROWS: contextvars.ContextVar[Optional[int]] = contextvars.ContextVar("fixed_shape_rows", default=None)


@contextlib.contextmanager
def fixed_shape_calls(active: bool, device: torch.device) -> Iterator[None]:
    """Run the calls inside at fixed shapes (`active`: in tiles of `tile_rows(device)`, the numerics switches at
    their defaults), or as they come.  Not inside a compiled region: its static shapes are its own."""
    if not active or torch.compiler.is_compiling():
        yield
        return
    rows = tile_rows(device)
    token = _ACTIVE_ROWS.set(rows)
    try:
        with pinned_numerics(device), FixedShapeCalls(rows):
            yield
    finally:
        _ACTIVE_ROWS.reset(token)


def row_tiled(module: torch.nn.Module) -> torch.nn.Module:
    """`module` (a layer whose output rows follow its input rows) running its input in row tiles while
    `fixed_shape_calls` is active: for layers whose kernel the mode cannot enter (bitsandbytes' 4-bit matmul is a
    custom op that picks its kernel from the untiled row count)."""
    forward = module.forward

    def tiled_forward(x: torch.Tensor) -> torch.Tensor:
        rows = _ACTIVE_ROWS.get()
        return forward(x) if rows is None else in_row_tiles(forward, x, rows)

    module.forward = tiled_forward
    return module
