"""`load_model`: a model folder on disk (or "demo") to a ready TokenModel.

Each family module offers `detect(folder) -> bool` and
`load(folder, device, dtype)`; the first family that recognises the folder loads it.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Union

import torch

from .checkpoints import ModelLoadError

# Family modules, asked in order.  Imported lazily: transformers is slow to import.
FAMILIES = ("scd_core.models.janus", "scd_core.models.llamagen", "scd_core.models.emu3",
            "scd_core.models.cosmos", "scd_core.models.lumina")
DEMO_DIR = Path(__file__).parents[1] / "demo"


def static_families() -> list[str]:
    """The families whose models load with compile=True."""
    return [name.rsplit(".", 1)[-1] for name in FAMILIES if hasattr(importlib.import_module(name), "STATIC_SHAPES")]


def pick_device(device: Union[str, torch.device, None]) -> torch.device:
    """The requested device, refused with a clear error when this machine lacks it; None picks the best one."""
    if device is not None:
        try:
            chosen = torch.device(device)
        except RuntimeError as err:
            raise ValueError(f"device {str(device)!r} is not a torch device ({err})") from err
        if chosen.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r}: CUDA is not available on this machine")
        if chosen.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ValueError(f"device {str(device)!r}: MPS is not available on this machine")
        return chosen
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_dtype(dtype: Union[str, torch.dtype, None], device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
             "float64": torch.float64}
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in names:
        raise ValueError(f"dtype must be one of {', '.join(names)}, got {dtype!r}")
    return names[dtype]


def load_model(path: Union[str, Path], device: Union[str, torch.device, None] = None,
               dtype: Union[str, torch.dtype, None] = None, compile: bool = False) -> Any:
    """Load the model in `path` ("demo" for the embedded demo model).

    `compile=True` runs the window calls at static shapes through torch.compile (and on CUDA as CUDA graphs,
    one per window width; see scd_core.static_step); the first call of each width compiles.  Families without
    static-shape calls refuse it.
    """
    if not isinstance(compile, bool):
        raise ValueError(f"compile must be True or False, got {compile!r}")
    folder = DEMO_DIR if str(path) == "demo" else Path(path).expanduser()
    if not folder.is_dir():
        raise ModelLoadError(f"model folder {folder} not found")
    device = pick_device(device)
    dtype = pick_dtype(dtype, device)
    for name in FAMILIES:
        family = importlib.import_module(name)
        if family.detect(folder):
            if compile and not hasattr(family, "STATIC_SHAPES"):
                raise ModelLoadError(f"compile=True is not available for {folder} ({name.rsplit('.', 1)[-1]} "
                                     f"family) yet: only {', '.join(static_families())} have static-shape "
                                     "calls; load it with compile=False")
            model = family.load(folder, device, dtype)
            if compile:
                model.enable_compile()
            return model
    found = ", ".join(sorted(p.name for p in folder.iterdir())[:12]) or "nothing"
    raise ModelLoadError(
        f"{folder} is not a model folder this pack can load (found: {found}). Expected a Janus-Pro folder in "
        "the transformers format (config.json with model_type 'janus', *.safetensors, tokenizer.json), an "
        "Emu3-Gen folder (BAAI/Emu3-Gen-hf: model_type 'emu3'), a Lumina-mGPT folder (model_type 'chameleon' "
        "plus vqgan.ckpt or movqgan_270M.ckpt), a "
        "LlamaGen folder (GPT and VQ checkpoints) or a Cosmos-1.0 autoregressive folder (model.pt); see the "
        "README's 'Model folders' section")
