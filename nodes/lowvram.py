"""A loaded network made streamable by ComfyUI's low-VRAM loading, in place.

When a model does not fit, ComfyUI's partial load (ModelPatcher.load with a memory budget)
moves the modules that fit to the GPU and leaves the others on the offload device with
`comfy_cast_weights = True`: such a module copies its weights to its input's device at each
call.  Only modules with that attribute may be left behind; a plain module that does not fit
stays on the CPU and the next call fails on mixed devices.  So every leaf holding tensors is
turned into a casting layer: torch's common layers into ComfyUI's own (`comfy.ops`), any other
(RMSNorms, our int8 layer, bitsandbytes' NF4 layer, ...) into a variant of its class that
follows the same protocol.  Casting only moves tensors, dtype unchanged, so the tokens are those
of a full load.  Tensors ComfyUI never moves when loading partially (buffers of non-leaf modules,
such as RoPE tables, and leaves that cannot take a new class, such as TorchScript modules) are
put on the compute device after each load (`follow_loads`).
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Iterator

import comfy.ops
import comfy.patcher_extension
from scd_core.compiled import cuda_graphs
import torch
from torch import nn

COMFY_LAYERS: dict[type, type] = {
    nn.Linear: comfy.ops.disable_weight_init.Linear,
    nn.Embedding: comfy.ops.disable_weight_init.Embedding,
    nn.LayerNorm: comfy.ops.disable_weight_init.LayerNorm,
    nn.GroupNorm: comfy.ops.disable_weight_init.GroupNorm,
    nn.Conv1d: comfy.ops.disable_weight_init.Conv1d,
    nn.Conv2d: comfy.ops.disable_weight_init.Conv2d,
    nn.Conv3d: comfy.ops.disable_weight_init.Conv3d,
    nn.ConvTranspose1d: comfy.ops.disable_weight_init.ConvTranspose1d,
    nn.ConvTranspose2d: comfy.ops.disable_weight_init.ConvTranspose2d,
}
STREAMING = "comfy-lowvram"  # the model's `offload` while ComfyUI streams part of its weights


def _moved(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy of `tensor` on `device`; a bitsandbytes 4-bit weight with a copy of its quantisation state
    (its own `.to` would move the stored state in place)."""
    state = getattr(tensor, "quant_state", None)
    if state is None:
        return tensor.to(device)
    state = copy.copy(state)
    if state.nested:
        state.state2 = copy.copy(state.state2)
    state.to(device)
    return type(tensor)(tensor.data.to(device), requires_grad=False, quant_state=state,
                        blocksize=tensor.blocksize, compress_statistics=tensor.compress_statistics,
                        quant_type=tensor.quant_type, quant_storage=tensor.quant_storage, bnb_quantized=True)


def _first_tensor(args: tuple, kwargs: dict) -> Any:
    return next((value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)), None)


class CastingLeaf(comfy.ops.CastWeightBiasOp):
    """ComfyUI's casting protocol for a leaf it has no class for: while `comfy_cast_weights` is set, each
    call runs on copies of the module's tensors on its input's device; the stored ones stay where they are."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        comfy.ops.run_every_op()  # as ComfyUI's layers: an interrupt stops the run at the next layer
        first = _first_tensor(args, kwargs)
        if not self.comfy_cast_weights or first is None:
            return super().forward(*args, **kwargs)
        stored = dict(self._parameters), dict(self._buffers)
        for table in (self._parameters, self._buffers):
            for name, tensor in table.items():
                if tensor is not None:
                    table[name] = _moved(tensor, first.device)
        try:
            return super().forward(*args, **kwargs)
        finally:
            self._parameters.update(stored[0])
            self._buffers.update(stored[1])


@functools.cache
def casting_class(cls: type) -> type:
    """`cls` with the casting protocol, named as `cls` (ComfyUI's log and repr show the same names)."""
    return type(cls.__name__, (CastingLeaf, cls), {"__module__": cls.__module__})


def _holds_tensors(module: nn.Module) -> bool:
    return any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False))


def make_streamable(network: nn.Module) -> int:
    """Give every leaf of `network` that holds tensors a casting class, in place (state dict unchanged).
    Returns how many were given one; TorchScript leaves keep theirs (see `follow_loads`)."""
    changed = 0
    for module in network.modules():
        if next(module.children(), None) is not None or not _holds_tensors(module):
            continue
        if hasattr(module, "comfy_cast_weights") or isinstance(module, torch.jit.ScriptModule):
            continue
        kind = type(module)
        module.__class__ = COMFY_LAYERS.get(kind) or casting_class(kind)
        if not hasattr(module, "bias"):  # ComfyUI's casting reads one (its Embedding sets None when built)
            module.bias = None
        changed += 1
    return changed


def resident_tensors(network: nn.Module) -> Iterator[torch.Tensor]:
    """The tensors of `network` outside casting layers: ComfyUI's partial load may leave them where they are."""
    for module in network.modules():
        if not hasattr(module, "comfy_cast_weights"):
            yield from (t for t in module.parameters(recurse=False))
            yield from (t for t in module.buffers(recurse=False) if t is not None)


def follow_loads(patcher: Any, model: Any) -> None:
    """After each ComfyUI load of `patcher`: tell `model` its compute device (its weights may now lie partly
    on the offload device) and whether ComfyUI streams part of them (`offload`, part of the automatic window's
    cost key), and put the tensors ComfyUI leaves behind (`resident_tensors`) on that device.  After an
    unload the model reads its device from its weights again."""

    def loaded(patcher: Any, device_to: Any, *_: Any) -> None:
        if device_to is None:
            return
        for tensor in resident_tensors(patcher.model):
            if tensor.device != device_to:
                tensor.data = tensor.data.to(device_to)
        model.compute_device = torch.device(device_to)
        model.offload = STREAMING if patcher.model.model_lowvram else None

    def detached(patcher: Any, *_: Any) -> None:
        model.compute_device = None
        model.offload = None
        cuda_graphs.kept_graphs(model).forget()  # CUDA graphs of the weights' old addresses, and the KV cache they read

    patcher.add_callback(comfy.patcher_extension.CallbacksMP.ON_LOAD, loaded)
    patcher.add_callback(comfy.patcher_extension.CallbacksMP.ON_DETACH, detached)


def streamed_bytes(patcher: Any) -> int:
    """Bytes of weights ComfyUI left on the offload device, copied in at each call (0 when fully loaded)."""
    return max(0, patcher.model_size() - patcher.loaded_size()) if patcher.model.model_lowvram else 0
