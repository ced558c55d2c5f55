"""Reading weight files safely: safetensors, or torch.load(weights_only=True).

Every failure becomes a ModelLoadError that names the file and what to do.
"""

from __future__ import annotations

import argparse
import contextlib
import pickle
import re
from pathlib import Path

import torch


class ModelLoadError(ValueError):
    """A model folder or weight file that cannot be used; the message says why."""


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of one .safetensors file, on the CPU."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise ModelLoadError(f"{path} is not a readable safetensors file ({err}); "
                             "it may be truncated: download it again") from err


# Harmless classes that original training checkpoints pickle next to the weights: LlamaGen's scripts save
# {"model", "optimizer", "steps", "args": argparse.Namespace}.  Everything else stays refused.
SAFE_CHECKPOINT_CLASSES = (argparse.Namespace,)
_REFUSED_GLOBAL = re.compile(r"GLOBAL (\S+)")
_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;]*m")


def _allowing_safe_classes() -> contextlib.AbstractContextManager:
    if hasattr(torch.serialization, "safe_globals"):  # torch >= 2.5: allowed for this load only
        return torch.serialization.safe_globals(list(SAFE_CHECKPOINT_CLASSES))
    torch.serialization.add_safe_globals(list(SAFE_CHECKPOINT_CLASSES))  # torch 2.4: process-wide
    return contextlib.nullcontext()


def _load_error(path: Path, err: Exception) -> ModelLoadError:
    """One clean sentence instead of torch's multi-line advice on loading the file unsafely."""
    if isinstance(err, pickle.UnpicklingError):
        refused = _REFUSED_GLOBAL.search(str(err))
        what = f" ({refused.group(1).rstrip('.')})" if refused else ""
        return ModelLoadError(f"{path} was refused: it holds pickled Python objects{what} that loading could run "
                              "as code; use a .safetensors file or a .pt checkpoint that holds only tensors")
    detail = _TERMINAL_CODES.sub("", str(err)).strip().splitlines()
    return ModelLoadError(f"{path} is not a readable torch checkpoint ({type(err).__name__}"
                          f"{': ' + detail[0] if detail else ''}); it may be truncated: download it again")


def _load_tensors(path: Path) -> object:
    """torch.load, memory-mapped where the file allows it (zip format): tensors are then read from the file as
    they are used, so loaders can quantise or cast layer by layer without the whole file in RAM."""
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as err:
        if "mmap" not in str(err):
            raise
        return torch.load(str(path), map_location="cpu", weights_only=True)  # the legacy format cannot be mapped


def read_torch_checkpoint(path: Path, keys: tuple[str, ...] = ("model", "module", "state_dict")
                          ) -> dict[str, torch.Tensor]:
    """A plain tensor dict from a .pt/.ckpt file without unpickling arbitrary objects.

    Original checkpoints often nest the weights under one of `keys` next to optimizer state and
    training arguments, which are ignored.
    """
    try:
        with _allowing_safe_classes():
            data = _load_tensors(path)
    except Exception as err:  # weights_only refuses code objects with UnpicklingError, corrupt zips with RuntimeError
        raise _load_error(path, err) from err
    for key in keys:
        if isinstance(data, dict) and isinstance(data.get(key), dict):
            data = data[key]
            break
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise ModelLoadError(f"{path} holds no tensor dict (looked at the top level and under {', '.join(keys)})")
    return data


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """Dispatch on the suffix: safetensors, or a tensor-only torch checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"weight file {path} not found")
    if path.suffix == ".safetensors":
        return read_safetensors(path)
    if path.suffix in PICKLE_SUFFIXES:
        return read_torch_checkpoint(path)
    raise ModelLoadError(f"{path}: unknown weight format; expected .safetensors or a .pt/.ckpt tensor dict")
