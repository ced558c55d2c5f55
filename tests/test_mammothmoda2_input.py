"""Bad MammothModa2 input gets one line and loses nothing: a t2i_generation_config.json whose do_sample is not a
boolean; refused folders (the authors' issue #2 either way, no t2i_generation_config.json) left as they were, and a
model loaded before them sampling as before; a grid of 0 asked from the command line keeps the image already there.
(tests/test_mammothmoda2.py has the refusals' messages and the grid checks on the model itself.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch
from mammothmoda2_fixture import tiny_dev_dir, tiny_preview_dir  # noqa: F401  (fixtures, one per session)

from scd_core import ModelLoadError, SamplerConfig, generate, load_model
from scd_core.frontends.cli import main

PROMPT = "a red cube on the table"


def copied(folder: Path, tmp_path: Path, name: str, change: Callable[[Path], None]) -> Path:
    """A copy of `folder` under tmp_path / name with `change` applied to it."""
    copy = Path(shutil.copytree(folder, tmp_path / name / folder.name))
    change(copy)
    return copy


def edit_json(file_name: str, **values) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        path = folder / file_name
        data = json.loads(path.read_text())
        for key, value in values.items():
            data[key] = {**data[key], **value} if isinstance(value, dict) else value
        path.write_text(json.dumps(data))
    return change


def contents(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("do_sample", ("false", "true", 0, 1, [True]))
def test_a_do_sample_other_than_true_or_false_is_one_line(tiny_preview_dir: Path, tmp_path: Path,
                                                         do_sample: object) -> None:
    """JSON `"false"` read as a truth value would sample where the file means the argmax: refused instead."""
    folder = copied(tiny_preview_dir, tmp_path, "a", edit_json("t2i_generation_config.json", do_sample=do_sample))
    with pytest.raises(ModelLoadError, match=r"do_sample .*; it must be true or false") as err:
        load_model(folder, device="cpu")
    assert "\n" not in str(err.value)


def test_refused_folders_lose_nothing(tiny_preview_dir: Path, tiny_dev_dir: Path, tmp_path: Path) -> None:
    """Each refusal leaves the folder's files as they were, and the model loaded before still samples its tokens."""
    model = load_model(tiny_preview_dir, device="cpu")
    model.set_grid(2, 3)
    config = SamplerConfig(window=4, seed=5)
    before = generate(model, model.encode(PROMPT), config).tokens
    refused = [
        copied(tiny_preview_dir, tmp_path, "dev_code", edit_json("config.json",
                                                                llm_config=dict(model_type="mammothmoda2_qwen3_vl"))),
        copied(tiny_dev_dir, tmp_path, "preview_code",
               edit_json("config.json", llm_config=dict(model_type="mammothmoda2_qwen2_5_vl"))),
        copied(tiny_preview_dir, tmp_path, "no_t2i", lambda folder: (folder / "t2i_generation_config.json").unlink()),
        copied(tiny_preview_dir, tmp_path, "do_sample", edit_json("t2i_generation_config.json", do_sample="no")),
    ]
    for folder in refused:
        kept = contents(folder)
        with pytest.raises(ModelLoadError) as err:
            load_model(folder, device="cpu")
        assert "\n" not in str(err.value) and contents(folder) == kept, folder
    assert torch.equal(generate(model, model.encode(PROMPT), config).tokens, before)


def test_a_grid_of_0_from_the_command_line_is_one_line_and_keeps_the_output(tiny_preview_dir: Path, tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture) -> None:
    """16 x 16 px is 0 x 0 codes at one code per 32 px: refused in one line before sampling; out.png stays."""
    out = tmp_path / "out.png"
    out.write_bytes(b"an image made before")
    code = main(["generate", "--model", str(tiny_preview_dir), "--prompt", "a red cube", "--width", "16",
                 "--height", "16", "--device", "cpu", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines()[-1] == "error: the grid must be at least 1 x 1 codes, got 0 x 0", err
    assert out.read_bytes() == b"an image made before"
