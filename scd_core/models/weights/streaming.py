"""Building a network on the meta device and filling it from safetensors files one tensor at a time.

The backbone's linear layers are quantised as their weights arrive (`quantize.assign_quantizing`), so a model
never sits whole in full precision in memory: the quantised model plus one float tensor is the peak.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import torch

from .checkpoints import ModelLoadError
from .generation_only import drop_modules
from .hf_folders import load_or_refuse
from .quantize import assign_quantizing


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Build modules with parameters on the meta device (no memory, no random init) but real buffers.

    Buffers such as rotary tables are computed in the constructors and never stored
    in checkpoints, so they must be real; every parameter is replaced by a
    checkpoint tensor afterwards.
    """
    register = torch.nn.Module.register_parameter

    def register_on_meta(module: torch.nn.Module, name: str, param: Optional[torch.nn.Parameter]) -> None:
        register(module, name, param)
        if param is not None:
            module._parameters[name] = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def renamed(stored: str, renames: tuple[tuple[str, str], ...]) -> str:
    """A checkpoint name with the first matching (stored prefix, module prefix) of `renames` applied."""
    for old, new in renames:
        if stored.startswith(old):
            return new + stored[len(old):]
    return stored


def fill_from_safetensors(net: torch.nn.Module, files: list[Path], backbone: str, precision: str,
                          dtype: torch.dtype, hint: str, renames: tuple[tuple[str, str], ...] = (),
                          float32_modules: tuple[str, ...] = ()) -> None:
    """Every tensor `net` (built under `parameters_on_meta`) holds, read from `files` one at a time, in `dtype`,
    the linear layers under the `backbone` prefix at `precision`; a stored name that is no module name goes
    through `renames` first; modules named in `float32_modules` stay float32 (`quantize.assign_quantizing`).
    Names `net` does not have (modules dropped before, extras) stay in the files; a parameter no file holds,
    or one of another shape, is a ModelLoadError."""
    from safetensors import safe_open

    expected = {key: tuple(value.shape) for key, value in net.state_dict().items()}
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for stored in handle.keys():
                key = stored if stored in expected else renamed(stored, renames)
                if key not in expected:
                    continue
                shape = tuple(handle.get_slice(stored).get_shape())
                if shape != expected[key]:
                    raise ModelLoadError(f"{path}: {stored} has shape {list(shape)} where config.json implies "
                                         f"{list(expected[key])}; the weights do not match config.json: {hint}")
                assign_quantizing(net, key, handle.get_tensor(stored), backbone, precision, dtype, float32_modules)
    missing = sorted(name for name, param in net.named_parameters() if param.device.type == "meta")
    if missing:
        raise ModelLoadError(f"{files[0].parent}: the weights do not match config.json (missing {missing[:5]}); "
                             f"the folder may mix files of different models: {hint}")


@dataclass(frozen=True)
class HFNetwork:
    """How to read one transformers-backed family: its classes, what generation never runs, where its backbone
    is, and how its published checkpoint names map onto module names."""

    config_class: type
    model_class: type
    unused_modules: tuple[str, ...]
    backbone: str
    family: str
    hint: str
    renames: tuple[tuple[str, str], ...] = ()
    shared: tuple[tuple[str, str], ...] = ()  # (module, module whose weights it uses): tied weights stored once


def float16_kept_modules(model_class: type, dtype: torch.dtype) -> tuple[str, ...]:
    """The module names transformers keeps in float32 when `model_class` is loaded in float16 (its
    `_keep_in_fp32_modules`, e.g. T5's `wo`, whose outputs overflow float16); none at other dtypes."""
    return tuple(getattr(model_class, "_keep_in_fp32_modules", None) or ()) if dtype == torch.float16 else ()


def read_hf_network(folder: Path, spec: HFNetwork, dtype: torch.dtype, precision: str) -> torch.nn.Module:
    """`spec.model_class` built from the folder's config.json on the meta device, without `unused_modules`,
    filled tensor by tensor from its safetensors files; any failure is one ModelLoadError, nothing kept."""
    def build() -> torch.nn.Module:
        config = spec.config_class.from_pretrained(str(folder))
        with parameters_on_meta():
            net = spec.model_class(config)
        drop_modules(net, *spec.unused_modules)
        for name, source in spec.shared:  # one module, so filling the stored name fills both
            parent, _, leaf = name.rpartition(".")
            setattr(net.get_submodule(parent), leaf, net.get_submodule(source))
        fill_from_safetensors(net, sorted(folder.glob("*.safetensors")), spec.backbone, precision, dtype, spec.hint,
                              spec.renames, float16_kept_modules(spec.model_class, dtype))
        return net

    net = load_or_refuse(build, folder, spec.family, spec.hint)
    return net.eval().requires_grad_(False)
