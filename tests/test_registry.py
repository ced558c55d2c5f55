"""What the Comfy registry (and ComfyUI-Manager) reads from pyproject.toml: one version for the release, an icon
that exists in the repository, the OS and accelerator classifiers the registry documents, and a
`requires-comfyui` that the core the tests run on satisfies."""

from __future__ import annotations

import ast
import re
import tomllib
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# The registry's classifier families (docs.comfy.org/registry/specifications)
REGISTRY_OS = {"Operating System :: OS Independent", "Operating System :: Microsoft :: Windows",
               "Operating System :: POSIX :: Linux", "Operating System :: MacOS"}
REGISTRY_ACCELERATORS = {"Environment :: GPU :: NVIDIA CUDA", "Environment :: GPU :: AMD ROCm",
                         "Environment :: GPU :: Intel Arc", "Environment :: NPU :: Huawei Ascend",
                         "Environment :: GPU :: Apple Metal"}
ICON_MAX = (800, 400)  # the registry's largest icon, width x height
SEMVER = re.compile(r"\d+\.\d+\.\d+")


def library_version() -> str:
    """scd_core.__version__, read from the source (importing it would load torch)."""
    tree = ast.parse((REPO / "scd_core" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("scd_core/__init__.py sets no __version__")


def test_one_release_version_in_pyproject_and_the_library() -> None:
    version = PYPROJECT["project"]["version"]
    assert SEMVER.fullmatch(version), f"the registry wants X.Y.Z, pyproject.toml says {version!r}"
    assert library_version() == version, \
        f"scd_core.__version__ {library_version()!r} differs from pyproject.toml's {version!r}; bump both"


def test_classifiers_name_the_systems_and_accelerators_the_registry_knows() -> None:
    classifiers = PYPROJECT["project"]["classifiers"]
    systems = [c for c in classifiers if c.startswith("Operating System ::")]
    accelerators = [c for c in classifiers if c.startswith("Environment :: ")]
    assert systems and set(systems) <= REGISTRY_OS, systems
    assert accelerators and set(accelerators) <= REGISTRY_ACCELERATORS, accelerators
    assert "Environment :: GPU :: NVIDIA CUDA" in accelerators  # the device the compiled path is built for


def test_icon_is_a_file_of_this_repository_within_the_registrys_size() -> None:
    icon = PYPROJECT["tool"]["comfy"]["Icon"]
    repository = PYPROJECT["project"]["urls"]["Repository"].removeprefix("https://github.com/")
    prefix = f"https://raw.githubusercontent.com/{repository}/main/"
    assert icon.startswith(prefix), f"Icon {icon!r} is not a raw file of {repository}'s main branch"
    path = REPO / icon.removeprefix(prefix)
    assert path.is_file(), f"Icon points at {path.relative_to(REPO)}, which is not in the repository"
    assert path.suffix in (".svg", ".png", ".jpg", ".gif")
    svg = ElementTree.parse(path).getroot()
    size = (int(svg.get("width")), int(svg.get("height")))
    assert size[0] <= ICON_MAX[0] and size[1] <= ICON_MAX[1], f"icon is {size}, the registry takes {ICON_MAX}"


def test_requires_comfyui_admits_the_core_the_tests_run_on() -> None:
    from comfy_server import COMFYUI_DIR

    tested = re.search(r'__version__ = "([^"]+)"', (COMFYUI_DIR / "comfyui_version.py").read_text())[1]
    required = SpecifierSet(PYPROJECT["tool"]["comfy"]["requires-comfyui"])
    assert tested in required, f"requires-comfyui {required} excludes {tested}, the core the tests run on"
