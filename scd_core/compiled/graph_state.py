"""The state a captured step reads: what a kept CUDA graph asks of the next generation.

A graph replays the kernels of its capture: the memory it read, at the addresses it had, and every host
number with the value it had.  A generation may replay the graphs of an earlier one (`cuda_graphs.KeptGraphs.keep`)
where its state (session and decoder, right after its prefill) equals that one's in everything but tensor
contents: `State.of` takes that everything as a `layout` (each tensor's place, shape, dtype, strides and
device; every other value as it is), and `State.move_to` copies a new generation's tensors into the memory
the graphs read and puts that memory in their place.

The walk goes through this package's objects, lists, tuples, dicts and functions (a function's code and what
its closure holds: a lambda made per generation is the same code over the same model).  A module, the model
and what else lives beyond one generation (`shared`) is a leaf known by its identity, as is any object of
another library.  A class names in `per_generation` the fields that differ between generations and that no
captured step reads (a setting as given, whose device copy the step reads): they are left out.
tests/test_compile.py checks that a kept graph's replay runs what its capture ran, generation after generation,
with those fields changed.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Iterator

import torch

PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device, type)
Path = tuple[Any, ...]


def shared(value: Any) -> bool:
    """Whether `value` lives beyond one generation (a leaf, the same object in every generation's state)."""
    return isinstance(value, torch.nn.Module) or getattr(value, "shared_across_generations", False)


def _walked(value: Any) -> bool:
    return isinstance(value, (list, tuple, dict, types.FunctionType, types.MethodType)) or (
        type(value).__module__.startswith("scd_core.") and hasattr(value, "__dict__") and not shared(value))


def _items(value: Any) -> Iterator[tuple[Any, Any]]:
    if isinstance(value, dict):
        return iter(value.items())
    if isinstance(value, (list, tuple)):
        return enumerate(value)
    if isinstance(value, types.MethodType):
        return iter((("__self__", value.__self__), ("__func__", value.__func__)))
    if isinstance(value, types.FunctionType):
        cells = enumerate(cell.cell_contents for cell in value.__closure__ or ())
        return iter([("__code__", value.__code__), ("__defaults__", value.__defaults__)]
                    + [(("cell", index), item) for index, item in cells])
    left_out = getattr(type(value), "per_generation", ())
    return ((name, item) for name, item in vars(value).items() if name not in left_out)


@dataclass
class State:
    """A generation's state as a layout, and its tensors by place."""

    layout: tuple[Any, ...]
    tensors: dict[Path, torch.Tensor]

    @classmethod
    def of(cls, root: Any) -> "State":
        layout: list[Any] = []
        tensors: dict[Path, torch.Tensor] = {}
        _walk(root, (), layout, tensors, {})
        return cls(tuple(layout), tensors)

    def move_to(self, kept: "State", root: Any) -> None:
        """Copy this state's tensors (of `root`, whose state this is) into `kept`'s, whose layout is this one's,
        and put `kept`'s in their place: `root` then reads and writes the memory `kept`'s graphs read."""
        for path, tensor in self.tensors.items():
            target = kept.tensors[path]
            if target is not tensor:
                _written(target).copy_(_written(tensor))
                _put(root, path, target)


def _written(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` narrowed to one element along its broadcast dimensions (stride 0), which a copy cannot write."""
    for dim, (size, stride) in enumerate(zip(tensor.shape, tensor.stride())):
        if stride == 0 and size > 1:
            tensor = tensor.narrow(dim, 0, 1)
    return tensor


def _put(root: Any, path: Path, value: Any) -> Any:
    """`root` with `value` at `path`: set in place on objects, lists and dicts, a new tuple for a tuple."""
    key = path[0]
    if isinstance(root, tuple):
        items = list(root)
        items[key] = value if len(path) == 1 else _put(root[key], path[1:], value)
        return type(root)(*items) if hasattr(root, "_fields") else tuple(items)
    if isinstance(root, types.FunctionType) and isinstance(key, tuple):  # ("cell", index)
        cell = root.__closure__[key[1]]
        new = value if len(path) == 1 else _put(cell.cell_contents, path[1:], value)
        cell.cell_contents = new
        return root
    child = root[key] if isinstance(root, (list, dict)) else getattr(root, key)
    new = value if len(path) == 1 else _put(child, path[1:], value)
    if new is not child:
        if isinstance(root, (list, dict)):
            root[key] = new
        else:
            setattr(root, key, new)
    return root


def _walk(value: Any, path: Path, layout: list[Any], tensors: dict[Path, torch.Tensor],
          first_met: dict[int, Path]) -> None:
    """Append `value`'s layout at `path` to `layout` and its tensors to `tensors`, depth first (a module-level
    function: a closure that calls itself would be a reference cycle holding the tensors till collected)."""
    if isinstance(value, torch.Tensor):
        tensors[path] = value
        layout.append((path, value.dtype, tuple(value.shape), value.stride(), value.device))
    elif isinstance(value, PLAIN):
        layout.append((path, value))
    elif not _walked(value):
        layout.append((path, "object", id(value)))
    elif id(value) in first_met:  # met again (a cache its backbone holds too): where is part of the layout
        layout.append((path, "met at", first_met[id(value)]))
    else:
        first_met[id(value)] = path
        layout.append((path, type(value)))
        for key, item in _items(value):
            _walk(item, path + (key,), layout, tensors, first_met)
