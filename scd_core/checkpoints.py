"""Reading weight files safely: safetensors, or torch.load(weights_only=True).

Every failure becomes a ModelLoadError that names the file and what to do.
"""

from __future__ import annotations

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


def read_torch_checkpoint(path: Path, keys: tuple[str, ...] = ("model", "module", "state_dict")) -> dict[str, torch.Tensor]:
    """A plain tensor dict from a .pt/.ckpt file without unpickling arbitrary objects.

    Original checkpoints often nest the weights under one of `keys`.
    """
    try:
        data = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as err:  # weights_only refuses code objects with UnpicklingError, corrupt zips with RuntimeError
        raise ModelLoadError(f"{path} could not be loaded as plain tensors ({type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else ''}); only weight files without "
                             "pickled code are accepted") from err
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
