"""The project installs as a package: `pip install .`, `pip install -e .` and `pip install '.[ray]'` in a fresh
venv outside the checkout, after which `scd_core` (and its demo model's files) import from any folder.

The fresh venv has no pip or torch of its own: a .pth file lets it see this interpreter's site-packages (pip,
setuptools, torch and the rest, so nothing is downloaded again), and the project is installed with --no-deps
--no-build-isolation.  Its own site-packages comes first, so `scd_core` resolves to what the install put there.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what a checkout holds but a clone would not: virtual environments, caches, build outputs
NOT_CLONED = shutil.ignore_patterns(".git", ".venv*", ".cache", "__pycache__", "*.pyc", "build", "*.egg-info",
                                    ".pytest_cache", "test-artifacts")
DIST = "comfyui-scd"
FAMILIES = ("Janus-Pro", "LlamaGen", "Lumina-mGPT 1 and 2", "Emu3", "Cosmos")
TIMEOUT = 600  # a loaded CI machine: pip and torch's import take tens of seconds each

# Run in the fresh venv from another folder: where scd_core comes from, which files the distribution installed,
# and the demo model loaded from the package's own files.
PROBE = """
import importlib.metadata, importlib.util, json
import scd_core
from scd_core import load_model
from scd_core.models.loading import DEMO_DIR
files = importlib.metadata.files("comfyui-scd") or []
summary = importlib.metadata.metadata("comfyui-scd")["Summary"]
nodes = importlib.util.find_spec("nodes")
print(json.dumps({"package": scd_core.__file__, "demo": str(DEMO_DIR), "tokens": load_model("demo", "cpu").num_tokens,
                  "installed": sorted(str(f) for f in files if not str(f).startswith("comfyui_scd-")),
                  "nodes": nodes and nodes.origin, "summary": summary}))
"""


def run(*argv: object, cwd: Path) -> str:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    done = subprocess.run([str(arg) for arg in argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.returncode == 0, f"{argv}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def fresh_venv(where: Path) -> Path:
    """A venv without packages of its own that sees this interpreter's; returns its python."""
    run(sys.executable, "-m", "venv", "--without-pip", where / "venv", cwd=where)
    python = where / "venv" / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    purelib = Path(run(python, "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
                       cwd=where).strip())
    outer = [*site.getsitepackages(), sysconfig.get_path("purelib")]
    if site.ENABLE_USER_SITE:
        outer.append(site.getusersitepackages())
    (purelib / "_outer_site_packages.pth").write_text("".join(f"{path}\n" for path in dict.fromkeys(outer)))
    return python


def project_copy(where: Path) -> Path:
    """The checkout as a clone has it (the ComfyUI pack around the library included), copied so that the build
    leaves nothing (build/, *.egg-info) in the checkout."""
    return Path(shutil.copytree(ROOT, where / "comfyui-scd", ignore=NOT_CLONED))


def probe(python: Path, where: Path) -> dict:
    elsewhere = where / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    return json.loads(run(python, "-I", "-c", PROBE, cwd=elsewhere).strip().splitlines()[-1])


def test_pip_install_puts_the_library_and_its_demo_model_in_site_packages(tmp_path):
    python, source = fresh_venv(tmp_path), project_copy(tmp_path)
    run(python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", source, cwd=tmp_path)
    shutil.rmtree(source)  # the installed copy stands alone
    found = probe(python, tmp_path)
    package = Path(found["package"])
    assert package.is_relative_to(tmp_path / "venv") and package.parent.name == "scd_core"
    assert found["tokens"] == 256  # the demo model loaded from the installed files
    assert {"demo/gpt.safetensors", "demo/vq.safetensors", "demo/llamagen.json"} <= {
        Path(name).relative_to("scd_core").as_posix() for name in found["installed"]}
    # the library only: not the ComfyUI pack around it (__init__.py, nodes/, web/) nor the tests
    assert all(name.startswith("scd_core/") for name in found["installed"]), found["installed"]
    assert "scd_core/models/loading.py" in found["installed"] and "scd_core/bench/cli.py" in found["installed"]
    assert found["nodes"] is None or not Path(found["nodes"]).is_relative_to(tmp_path)
    assert all(family in found["summary"] for family in FAMILIES), found["summary"]


def test_editable_install_imports_the_source_from_any_folder(tmp_path):
    python, source = fresh_venv(tmp_path), project_copy(tmp_path)
    run(python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", source, cwd=tmp_path)
    found = probe(python, tmp_path)
    assert Path(found["package"]) == source / "scd_core" / "__init__.py"
    assert Path(found["demo"]) == source / "scd_core" / "demo" and found["tokens"] == 256
    assert found["nodes"] is None or not Path(found["nodes"]).is_relative_to(tmp_path)  # nodes/ stays the pack's


def test_ray_extra_resolves(tmp_path):
    python, source = fresh_venv(tmp_path), project_copy(tmp_path)
    out = run(python, "-m", "pip", "install", "--dry-run", "--no-build-isolation", f"{source}[ray]", cwd=tmp_path)
    assert "Would install" in out and DIST in out.split("Would install")[-1]
    resolved = [line for line in out.splitlines() if f"(from {DIST}==" in line or line.startswith("Would install")]
    assert any("ray" in line for line in resolved), out  # already here, or what pip would fetch
