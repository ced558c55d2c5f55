"""The transformers-format families (Janus-Pro, Emu3, Lumina-mGPT) refuse a broken model folder alike: one
ModelLoadError that names what is wrong, and never a pickle opened."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from emu3_fixture import tiny_emu3_dir  # noqa: F401  (fixtures, one checkpoint per session)
from janus_fixture import tiny_janus_dir  # noqa: F401
from lumina_fixture import tiny_lumina_dir  # noqa: F401

from scd_core import ModelLoadError, load_model

# the tiny folder's fixture, and what the error for a missing tokenizer names
FAMILIES = {
    "janus": ("tiny_janus_dir", "tokenizer.json"),
    "emu3": ("tiny_emu3_dir", "tokenizer.json"),
    "lumina": ("tiny_lumina_dir", "tokenizer.json.*text_tokenizer.json"),
}


@pytest.fixture(params=list(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str]:
    """(a copy of the family's tiny folder to break, the missing-tokenizer message)."""
    fixture, tokenizer_message = FAMILIES[request.param]
    source = request.getfixturevalue(fixture)
    folder = Path(shutil.copytree(source, tmp_path / source.name))  # Lumina-mGPT reads its size from the name
    return folder, tokenizer_message


def weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("model*.safetensors"))


def test_missing_tokenizer(family: tuple[Path, str]) -> None:
    folder, message = family
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match=message):
        load_model(folder, device="cpu")


def test_truncated_weights(family: tuple[Path, str]) -> None:
    folder, _ = family
    weights = weight_files(folder)[-1]
    with open(weights, "r+b") as handle:
        handle.truncate(weights.stat().st_size // 2)
    with pytest.raises(ModelLoadError, match=f"{re.escape(weights.name)}.*truncated"):
        load_model(folder, device="cpu")


def test_pickled_weights_are_refused_unopened(family: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    folder, _ = family
    for path in folder.glob("model*.safetensors*"):  # the shards and their index
        path.unlink()
    pickled = folder / "pytorch_model.bin"
    torch.save({"w": torch.zeros(2)}, pickled)
    load = torch.load

    def refuse(path: object, *args: object, **kwargs: object) -> object:
        # Lumina-mGPT's VQ checkpoint is read with weights_only=True; the pickle must never be
        if Path(str(path)) == pickled:
            raise AssertionError("torch.load must not open the pickled weights")
        return load(path, *args, **kwargs)

    monkeypatch.setattr(torch, "load", refuse)
    with pytest.raises(ModelLoadError, match="pickled weights"):
        load_model(folder, device="cpu")
