"""Hugging Face transformers-format model folders: check the files before `streaming` reads them.

`hint` arguments say which repository to download instead; every failure is a
ModelLoadError naming the folder or file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, TypeVar

from .checkpoints import PICKLE_SUFFIXES, ModelLoadError
from .memory import release_memory
from .quantize import QuantizationError
from .tokenizer_files import read_json

Built = TypeVar("Built")


def config_model_type(folder: Path) -> Optional[str]:
    """The model_type of `folder`'s config.json, what a transformers-format family recognises its folders by;
    None where there is no readable config.json."""
    path = Path(folder) / "config.json"
    try:
        return read_json(path).get("model_type") if path.is_file() else None
    except ModelLoadError:
        return None


def check_safetensors_weights(folder: Path, hint: str) -> None:
    """Every safetensors file (and every shard the index names) present and readable; pickles refused unopened."""
    from safetensors import safe_open

    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
        found = f"only pickled weights ({', '.join(pickles)}), which are not loaded for safety" if pickles \
            else "no *.safetensors weights"
        raise ModelLoadError(f"{folder} has {found}; {hint}")
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = set((read_json(index).get("weight_map") or {}).values())
        missing = sorted(name for name in shards if not (folder / name).is_file())
        if missing:
            raise ModelLoadError(f"{folder} lacks weight shards {', '.join(missing)}; download them again")
    for path in weights:
        try:
            with safe_open(str(path), framework="pt") as handle:
                handle.keys()
        except Exception as err:  # SafetensorError for truncated or corrupt headers
            raise ModelLoadError(f"{path} is not a readable safetensors file ({err}); it may be truncated: "
                                 "download it again") from err


def dtype_keyword() -> str:
    # from_pretrained takes `dtype` since transformers 4.56; older releases silently ignore it.
    import transformers
    from packaging.version import Version

    return "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"


def raise_load_failure(message: str) -> None:
    """Free what a failed load built, then raise.  Call it outside the except block, so no traceback keeps
    the half-built model alive."""
    release_memory()
    raise ModelLoadError(message)


def load_or_refuse(build: Callable[[], Built], folder: Path, family: str, hint: str) -> Built:
    """`build()`, with any failure turned into one ModelLoadError (ours as they say, any other named with the
    family and `hint`), raised once what was built is freed."""
    try:
        return build()
    except (ModelLoadError, QuantizationError) as err:
        failure = str(err)
    except Exception as err:  # transformers raises many types for bad configs
        failure = f"{folder} could not be loaded as {family} ({type(err).__name__}: {err}); {hint}"
    raise_load_failure(failure)
