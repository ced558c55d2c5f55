"""Weight-only quantisation of a backbone's linear layers: int8 (our own layer) or NF4 (bitsandbytes, optional).

Exactness needs every position's logits to be a function of its own prefix only, so a
quantised layer must treat the rows of a call independently.  Both layers offered do:
int8 keeps int8 weights and one float scale per output row; its forward casts the int8 rows
to the compute dtype and scales the outputs, or on the CPU in bfloat16 runs torch's fused weight-only int8 matmul
(`_weight_int8pack_mm`: each output element one dot product over K, whatever the call's rows); NF4 dequantises
64-weight blocks of the weight.  Neither looks at the
activations.  bitsandbytes' LLM.int8 (`Linear8bitLt` with an outlier threshold) picks
outlier columns over all rows of a call and is therefore not offered
(tests/test_quantize.py shows the difference).  Heads and embeddings are never passed
here: they stay in the compute dtype, so slicing a head's rows keeps working.
"""

from __future__ import annotations

import gc
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from ...compiled.invariant import row_tiled

PRECISIONS = ("none", "int8", "nf4")
NF4_PACKAGE = "bitsandbytes"
NF4_DEVICES = ("cpu", "cuda", "xpu", "meta")  # where bitsandbytes' 4-bit layers run


class QuantizationError(ValueError):
    """A precision this model, device or installation cannot take; the message says what to do."""


# Where torch's fused weight-only int8 matmul runs for the layer (measured: scd_core/bench/README.md "int8 on the
# CPU"); on CUDA it is unmeasured, so the device check times it against the cast (`bench.device_check`).
FUSED_INT8_DEVICES = ("cpu",)
FUSED_ALIGNMENT = 64  # bytes: the CPU kernel reads rows of 16 bfloat16 with aligned vector loads


def fused_int8_runs(device: torch.device, dtype: torch.dtype, in_features: int) -> bool:
    """Whether the layer runs `_weight_int8pack_mm` for inputs on `device` in `dtype`.  Its CPU kernel loads 16
    bfloat16 at a time with aligned loads: with K not a multiple of 16 (or a row off a 32-byte boundary, which
    the layer copies away) it reads out of bounds, a segfault (measured for every K % 16 != 0 at M >= 2).
    float32 and float16 take its scalar loop there, slower than the cast, so they stay off it."""
    return device.type in FUSED_INT8_DEVICES and dtype == torch.bfloat16 and in_features % 16 == 0


class Int8Linear(nn.Module):
    """y = x W^T + b with W stored as int8 rows times one scale per output row (absmax / 127)."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
        super().__init__()
        self.in_features, self.out_features = qweight.shape[1], qweight.shape[0]
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, dtype: torch.dtype) -> "Int8Linear":
        weight = linear.weight.detach().float()
        absmax = weight.abs().amax(dim=1)
        scale = torch.where(absmax > 0, absmax / 127, torch.ones_like(absmax))
        qweight = (weight / scale[:, None]).round_().clamp_(-127, 127).to(torch.int8)
        bias = None if linear.bias is None else linear.bias.detach().to(dtype)
        return cls(qweight, scale.to(dtype), bias)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return self.qweight.to(dtype) * self.scale.to(dtype)[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Per call the int8 rows are cast whole and each output column scaled, or fused: nothing depends on the
        # activations, so one row's output never depends on another row of the call.
        bias = None if self.bias is None else self.bias.to(x.dtype)
        fused = self._fused(x)
        if fused is not None:
            return fused if bias is None else fused + bias
        return self.cast(x, bias)

    def cast(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x W^T (+ bias) with the int8 rows cast to x's dtype: what runs where the fused kernel does not."""
        if x.dtype == torch.float16:  # x times raw int8 rows can leave float16's range before the scale
            return F.linear(x, self.dequantized(x.dtype), bias)
        out = F.linear(x, self.qweight.to(x.dtype)) * self.scale.to(x.dtype)  # a pass less than dequantising
        return out if bias is None else out + bias

    def _fused(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """x W^T through torch's fused weight-only int8 kernel, or None where it does not run."""
        # (data pointers are not traced: compiled, inductor fuses the cast into the matmul itself)
        if torch.compiler.is_compiling() or not fused_int8_runs(x.device, x.dtype, self.in_features) \
                or not self.qweight.is_contiguous() or self.qweight.data_ptr() % FUSED_ALIGNMENT:
            return None
        rows = x.reshape(-1, self.in_features).contiguous()
        if rows.data_ptr() % FUSED_ALIGNMENT:  # a view at an odd offset: an aligned copy
            rows = rows.clone()
        return torch._weight_int8pack_mm(rows, self.qweight, self.scale.to(x.dtype)).reshape(
            *x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def normalize_precision(quantize: Optional[str]) -> str:
    """`None` or one of PRECISIONS (any case) -> the name in PRECISIONS."""
    name = "none" if quantize is None else str(quantize).strip().lower()
    if name not in PRECISIONS:
        raise QuantizationError(f"quantize must be one of {', '.join(PRECISIONS)} (or None), got {quantize!r}")
    return name


def _bitsandbytes():
    try:
        import bitsandbytes
    except ImportError as err:
        raise QuantizationError(f"quantize='nf4' needs the {NF4_PACKAGE} package, which is not installed "
                                f"({err}): pip install {NF4_PACKAGE}, or use quantize='int8'") from None
    return bitsandbytes


def check_precision(precision: str, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse, before anything is loaded, a precision this installation or device cannot run."""
    if precision != "nf4":
        return
    _bitsandbytes()
    if device.type not in NF4_DEVICES:
        raise QuantizationError(f"quantize='nf4' (bitsandbytes) does not run on {device.type}; use 'int8' there")
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise QuantizationError(f"quantize='nf4' computes in float32, bfloat16 or float16, not {dtype}")


def _nf4_linear(linear: nn.Linear, dtype: torch.dtype) -> nn.Module:
    bnb = _bitsandbytes()
    layer = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                              compute_dtype=dtype, quant_type="nf4", device="meta")
    # Params4bit quantises when it is moved to a real device; the CPU does it here, tensor by tensor
    layer.weight = bnb.nn.Params4bit(linear.weight.detach().to(dtype), requires_grad=False, quant_type="nf4")
    if linear.bias is not None:
        layer.bias = nn.Parameter(linear.bias.detach().to(dtype), requires_grad=False)
    # bitsandbytes would repack the weight in place on the first CPU call for its AVX512-BF16 kernel, which
    # needs in_features divisible by the block size and leaves a weight that no longer moves to a GPU
    layer.support_avx512bf16_for_cpu = False
    # its 4-bit matmul is a custom op that picks its kernel from the rows it is given: the window-invariant calls
    # give it their tiles' rows
    return row_tiled(layer.to(linear.weight.device if linear.weight.device.type != "meta" else "cpu").eval())


def quantized_linear(linear: nn.Linear, precision: str, dtype: torch.dtype) -> nn.Module:
    """`linear` at `precision` ("int8" or "nf4"), computing in `dtype`."""
    return Int8Linear.from_linear(linear, dtype) if precision == "int8" else _nf4_linear(linear, dtype)


def quantize_linears(module: nn.Module, precision: str, dtype: torch.dtype) -> int:
    """Replace every nn.Linear inside `module` by its `precision` version, one layer at a time (the float
    weight of a layer is freed as soon as its quantised copy exists).  Returns how many were replaced."""
    if precision == "none":
        return 0
    replaced = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, quantized_linear(child, precision, dtype))
                replaced += 1
    return replaced


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Real storage bytes, also for bitsandbytes' packed 4-bit weights (their quant_state holds the scales)."""
    total = tensor.numel() * tensor.element_size()
    state = getattr(tensor, "quant_state", None)
    if state is not None:
        parts = [state.absmax, getattr(state, "code", None)]
        nested = getattr(state, "state2", None)
        if nested is not None:
            parts += [nested.absmax, nested.code]
        total += sum(p.numel() * p.element_size() for p in parts if isinstance(p, torch.Tensor))
    return total


def module_bytes(module: nn.Module) -> int:
    """Bytes of every parameter and buffer of `module` (each counted once), at their real precision."""
    seen: set[int] = set()
    total = 0
    for tensor in list(module.parameters()) + list(module.buffers()):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor_bytes(tensor)
    return total


def bytes_per_weight(precision: str, dtype: Union[torch.dtype, int]) -> float:
    """Storage per weight of a quantised linear layer (scales included), or of a float one at `dtype`."""
    size = dtype if isinstance(dtype, int) else torch.empty((), dtype=dtype).element_size()
    # int8: one scale per row (~0 per weight); NF4: 4 bits + one 8-bit absmax per 64 weights (double quantised)
    return {"none": float(size), "int8": 1.0, "nf4": 0.5 + 1 / 64}[precision]


def quantize_then_move(module: nn.Module, backbone: nn.Module, precision: str, dtype: torch.dtype,
                       device: torch.device) -> None:
    """Quantise `backbone`'s linear layers where the weights were read (the CPU), then move all of `module` to
    `device`: the device never holds the full-precision backbone.  On a failure what reached the device goes
    back to the CPU (the caller then drops the model), so no device memory stays taken."""
    failure: Optional[Exception] = None
    try:
        quantize_linears(backbone, precision, dtype)
        module.to(device)
    except (RuntimeError, ValueError) as err:  # out of memory, a kernel bitsandbytes lacks on this device, ...
        failure = err
    if failure is not None:
        message = f"could not put the model on {device} at precision {precision!r} ({type(failure).__name__}: " \
                  f"{str(failure).splitlines()[0] if str(failure) else ''})"
        del failure  # its traceback holds this frame
        module.to("cpu")
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        raise QuantizationError(message)


def assign_quantizing(root: nn.Module, key: str, tensor: torch.Tensor, backbone: str, precision: str,
                      dtype: torch.dtype, float32_modules: tuple[str, ...] = ()) -> None:
    """Put checkpoint tensor `key` into `root` (built on the meta device) in `dtype`; a linear layer under the
    `backbone` prefix is quantised as soon as all its parameters are in, so the float copy of one layer at a
    time is all that exists beside the quantised model.  A module with a name part in `float32_modules`
    stays float32 and unquantised (transformers' `_keep_in_fp32_modules`)."""
    owner_name, _, attr = key.rpartition(".")
    owner = root.get_submodule(owner_name)
    kept = not set(owner_name.split(".")).isdisjoint(float32_modules)
    value = tensor.to(torch.float32 if kept else dtype) if tensor.is_floating_point() else tensor
    if attr in owner._buffers:
        owner._buffers[attr] = value
        return
    owner._parameters[attr] = nn.Parameter(value, requires_grad=False)
    complete = all(p.device.type != "meta" for p in owner.parameters(recurse=False))
    if precision != "none" and not kept and type(owner) is nn.Linear and complete and \
            (owner_name + ".").startswith(backbone + "."):
        parent_name, _, child = owner_name.rpartition(".")
        try:
            new = quantized_linear(owner, precision, dtype)
        except RuntimeError as err:  # out of memory, a kernel bitsandbytes lacks here
            raise QuantizationError(f"could not quantise {owner_name} to {precision} ({type(err).__name__}: "
                                    f"{str(err).splitlines()[0] if str(err) else ''})") from None
        setattr(root.get_submodule(parent_name), child, new)
