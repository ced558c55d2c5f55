#!/usr/bin/env bash
# Install the newest ComfyUI frontend the browser tests also run against, beside the one the core pins.
#
# Usage: tests/install_frontend.sh [VENV_DIR] [CACHE_DIR]
#   VENV_DIR   venv whose pip downloads the package (default .venv-test)
#   CACHE_DIR  where it goes; the server serves CACHE_DIR/comfyui_frontend_package/static (default
#              .cache/frontend-$FRONTEND_VERSION)
#
# Pinned so CI stays deterministic.  To bump: `pip index versions comfyui-frontend-package`, set FRONTEND_VERSION
# below (tests/comfy_server.py reads it from here), run `bash tests/install_frontend.sh` and the browser tests.
# The package is the frontend's built files alone (no dependencies); it goes into its own folder, not the venv,
# so the core keeps serving the frontend it pins.
set -euo pipefail

FRONTEND_VERSION="1.58.1"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV_DIR="$(realpath -m "${1:-$REPO_ROOT/.venv-test}")"
CACHE_DIR="$(realpath -m "${2:-$REPO_ROOT/.cache/frontend-$FRONTEND_VERSION}")"
STATIC="$CACHE_DIR/comfyui_frontend_package/static"

[[ -x "$VENV_DIR/bin/pip" ]] || { echo "no pip in venv $VENV_DIR; create it first" >&2; exit 1; }

if [[ ! -f "$STATIC/index.html" ]]; then
    # Install into a scratch folder and move into place at the end, so an interrupted run leaves no half tree.
    scratch="$(mktemp -d "$(dirname "$CACHE_DIR")/frontend.XXXXXX")"
    trap 'rm -rf "$scratch"' EXIT
    "$VENV_DIR/bin/pip" install --quiet --disable-pip-version-check --no-deps --target "$scratch" \
        "comfyui-frontend-package==$FRONTEND_VERSION"
    [[ -f "$scratch/comfyui_frontend_package/static/index.html" ]] || { echo "no static/index.html in the package" >&2; exit 1; }
    rm -rf "$CACHE_DIR"
    mv "$scratch" "$CACHE_DIR"
fi
echo "ComfyUI frontend $FRONTEND_VERSION ready: $STATIC"
