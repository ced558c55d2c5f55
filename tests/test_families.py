"""Each family declares itself once (scd_core.models.family): loading, the folder lists, the messages, the node
tooltips and the CLI read the declarations, so a family added to the registry is recognised and named everywhere."""

from __future__ import annotations

import argparse
import re
import sys
import types
from pathlib import Path
from typing import Iterator

import pytest

from scd_core import ModelLoadError, load_model
from scd_core.frontends.cli_shared import add_model_arguments
from scd_core.models import family as registry
from scd_core.models.family import Family, compilable, families, hooks, joined
from scd_core.models.loading import detect_family, download_hint, estimate_memory, unrecognised_message

REPO = Path(__file__).resolve().parents[1]
# what reads the declarations instead of naming families
DERIVED = ("nodes/sampler.py", "nodes/loader.py", "nodes/encode.py", "scd_core/frontends/cli_shared.py",
           "scd_core/compiled/compiled_regions.py", "scd_core/compiled/cuda_graphs.py")
TOY = Family(label="Toy-GPT", holds="a Toy-GPT folder (toy.json)", downloads=(("toy-gpt", "the toy repository"),),
             roots=("Toy-GPT",), cfg="Toy-GPT 2", sizes=("Toy-GPT (any size)",), quantize=False)


def test_every_registered_module_declares_a_family() -> None:
    declared = families()
    assert len(declared) == len(registry.MODULES) and all(isinstance(family, Family) for family in declared)
    roots = [root for family in declared for root in family.roots]
    assert len(roots) == len(set(roots)) and "scd" not in roots


def test_the_front_ends_name_no_family() -> None:
    names = re.compile("|".join(re.escape(name) for name in (*registry.MODULES, *(f.label for f in families()))),
                       re.IGNORECASE)
    found = {path: names.findall((REPO / path).read_text()) for path in DERIVED}
    assert not any(found.values()), found


def test_a_diffusion_decoders_declared_defaults_are_its_models() -> None:
    """Family.decoder (the CLI's and the node's help) states the steps and guidance `set_decoding` starts from."""
    from scd_core.models.families import glm_image, mammothmoda2

    for module, model in ((glm_image, glm_image.GlmImageModel), (mammothmoda2, mammothmoda2.MammothModa2Model)):
        defaults = model.default_decoding
        assert module.FAMILY.decoder.startswith(f"{module.FAMILY.label} {defaults.steps} steps, guidance "
                                                f"{defaults.guidance:g}"), module.__name__
    assert {family.label for family in families() if family.decoder} == {"GLM-Image", "MammothModa2"}


def test_joined() -> None:
    assert [joined([]), joined(["a"]), joined(["a", "b"]), joined("abc", last="or")] == \
        ["", "a", "a and b", "a, b or c"]


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A family module registered as a new family is: its module plus its name in MODULES."""
    module = types.ModuleType(f"{registry.__package__}.families.toy")  # where family_modules imports from
    module.FAMILY = TOY
    module.detect = lambda folder: (Path(folder) / "toy.json").is_file()
    module.load = lambda folder, device, dtype, quantize="none": ("toy model", folder, quantize)
    module.CACHE_TOKENS = 64 + 256  # a prompt and its image (memory estimates)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(registry, "MODULES", (*registry.MODULES, "toy"))
    registry.family_modules.cache_clear()
    yield module
    registry.family_modules.cache_clear()  # before MODULES is restored: the next call reads the real list


def test_a_registered_family_is_recognised_and_named(toy: types.ModuleType, tmp_path: Path) -> None:
    folder = tmp_path / "Toy-GPT-small"
    folder.mkdir()
    assert detect_family(folder) is None
    assert f"or {TOY.holds}; see the README" in unrecognised_message(folder)
    assert download_hint(folder.name) == "the toy repository"
    (folder / "toy.json").write_text("{}")
    assert detect_family(folder) is toy
    assert load_model(folder, device="cpu") == ("toy model", folder, "none")
    parser = argparse.ArgumentParser()
    add_model_arguments(parser.add_argument_group("model"))
    assert "(Emu3.5, Emu3, Lumina-mGPT, GLM-Image, Toy-GPT)" in " ".join(parser.format_help().split())


def test_what_a_family_does_not_support_is_refused(toy: types.ModuleType, tmp_path: Path) -> None:
    (tmp_path / "toy.json").write_text("{}")
    assert "Toy-GPT" not in compilable()
    with pytest.raises(ModelLoadError, match=rf"compile=True is not available .*\(toy family\) yet: only "
                                             rf"{re.escape(compilable())} have"):
        load_model(tmp_path, device="cpu", compile=True)
    with pytest.raises(ModelLoadError, match=r"quantize='int8' is not available .*\(toy family\)"):
        load_model(tmp_path, device="cpu", quantize="int8")


def test_every_registered_module_gives_its_hooks() -> None:
    """Each family module gives the required hooks and misspells none (`family.FamilyHooks` declares them)."""
    for module in registry.family_modules():
        family = hooks(module)
        assert family.FAMILY is module.FAMILY and family.CACHE_TOKENS > 0, module.__name__
        assert isinstance(family.UNUSED_WEIGHTS, tuple) and all(
            hook is None or callable(hook) for hook in (family.text_encoder_folder, family.memory_estimate)), \
            module.__name__


@pytest.mark.parametrize("change,message", [
    (dict(CACHE_TOKENS=None), "lacks CACHE_TOKENS"),
    (dict(UNUSED_WEIGHT=("encoder.",)), r"has UNUSED_WEIGHT \(meant UNUSED_WEIGHTS\?\)"),
    (dict(text_encoder_folders=lambda folder: None), r"meant text_encoder_folder\?"),
])
def test_a_missing_or_misspelt_hook_fails_loudly(toy: types.ModuleType, tmp_path: Path, change: dict,
                                                 message: str) -> None:
    """Not silently another memory estimate: loading and the estimate refuse the module."""
    (tmp_path / "toy.json").write_text("{}")
    for name, value in change.items():
        if value is None:
            delattr(toy, name)
        else:
            setattr(toy, name, value)
    for read in (lambda: load_model(tmp_path, device="cpu"), lambda: estimate_memory(tmp_path)):
        with pytest.raises(TypeError, match=rf"family module 'toy' .*{message}"):
            read()
