"""`load_model`: a model folder on disk (or "demo") to a ready TokenModel.

Each family module (`family.MODULES`) declares itself (`FAMILY`) and offers `detect(folder) -> bool` and
`load(folder, device, dtype, quantize)`; the first family that recognises the folder loads it.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any, Optional, Union

import torch

from .weights.checkpoints import ModelLoadError
from .family import compilable, families, family_modules, hooks, joined
from .pixels import steady_decode
from .weights.memory import MemoryEstimate, folder_estimate, t5_folder_estimate
from .weights.quantize import check_precision, normalize_precision

DEMO_DIR = Path(__file__).parents[1] / "demo"


def pick_device(device: Union[str, torch.device, None]) -> torch.device:
    """The requested device, refused with a clear error when this machine lacks it; None picks the best one."""
    if device is not None:
        try:
            chosen = torch.device(device)
        except RuntimeError as err:
            raise ValueError(f"device {str(device)!r} is not a torch device: use cuda (cuda:1 for a second GPU), "
                             "mps or cpu") from err
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


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16, "float64": torch.float64}  # the names taken


def pick_dtype(dtype: Union[str, torch.dtype, None], device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def download_hint(name: str) -> Optional[str]:
    """What to download for a model folder called `name`, when the name says which published model it is."""
    lowered = name.lower()
    return next((what for family in families() for word, what in family.downloads if word in lowered), None)


def detect_family(folder: Path) -> Optional[ModuleType]:
    """The family module that recognises `folder` (a model folder, perhaps incomplete), or None."""
    return next((family for family in family_modules() if family.detect(folder)), None)


def unrecognised_message(folder: Path) -> str:
    """Why no family takes `folder`: what it holds and what each family expects."""
    found = ", ".join(sorted(p.name for p in folder.iterdir())[:12]) or "nothing"
    expected = joined((family.holds for family in families()), last="or")
    return (f"{folder} is not a model folder this pack can load (found: {found}). Expected {expected}; see the "
            "README's 'Model folders' section")


def load_model(path: Union[str, Path], device: Union[str, torch.device, None] = None,
               dtype: Union[str, torch.dtype, None] = None, quantize: Optional[str] = None,
               compile: bool = False) -> Any:
    """Load the model in `path` ("demo" for the embedded demo model).

    `dtype` is the compute dtype; `quantize` ("int8" or "nf4"; None or "none" for full precision) stores the
    backbone's linear layers in fewer bits (heads, embeddings and image decoders stay at `dtype`).
    `compile=True` runs the window calls at static shapes through torch.compile (and on CUDA as CUDA graphs,
    one per window width; see scd_core.compiled.compiled_regions); the first call of each width compiles.
    Families without static-shape calls refuse it.
    """
    if not isinstance(compile, bool):
        raise ValueError(f"compile must be True or False, got {compile!r}")
    folder = _model_folder(path)
    device = pick_device(device)
    dtype = pick_dtype(dtype, device)
    precision = normalize_precision(quantize)
    check_precision(precision, device, dtype)  # before anything is read
    module = _family(folder)
    name, family = module.__name__.rsplit(".", 1)[-1], hooks(module)
    if compile and not family.FAMILY.compile:
        raise ModelLoadError(f"compile=True is not available for {folder} ({name} family) yet: only "
                             f"{compilable()} have static-shape calls; load it with compile=False")
    if precision != "none" and not family.FAMILY.quantize:
        raise ModelLoadError(f"quantize={precision!r} is not available for {folder} ({name} family) yet: load it "
                             "at full precision (quantize='none')")
    model = family.load(folder, device, dtype, quantize=precision)
    if callable(getattr(model, "decode", None)):  # an image's bytes then depend on its tokens alone
        model.decode = steady_decode(model.decode, getattr(model, "decodes_rows_alone", False))
    if compile:
        model.enable_compile()
    return model


def estimate_memory(path: Union[str, Path]) -> MemoryEstimate:
    """What `load_model(path)` will hold, from the weight files' headers, its T5 text encoder included: see
    `memory.MemoryEstimate`."""
    folder = _model_folder(path)
    family = hooks(_family(folder))
    if family.memory_estimate is not None:  # a folder of several models (GLM-Image: its AR stage, what sampling
        return family.memory_estimate(folder)  # holds)
    estimate = folder_estimate(folder, family.UNUSED_WEIGHTS, family.CACHE_TOKENS)
    text_folder = None if family.text_encoder_folder is None else family.text_encoder_folder(folder)
    if text_folder is None:
        return estimate
    return estimate.plus(t5_folder_estimate(text_folder))


def _model_folder(path: Union[str, Path]) -> Path:
    folder = DEMO_DIR if str(path) == "demo" else Path(path).expanduser()
    if not folder.is_dir():
        hint = download_hint(folder.name)
        raise ModelLoadError(f"model folder {folder} not found" + (f"; download {hint} into it" if hint else ""))
    return folder


def _family(folder: Path) -> ModuleType:
    """The family module that recognises `folder`; refused with what it holds otherwise."""
    family = detect_family(folder)
    if family is None:
        raise ModelLoadError(unrecognised_message(folder))
    return family
