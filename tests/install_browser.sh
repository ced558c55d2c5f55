#!/usr/bin/env bash
# Installs the browser the browser test drives: Debian's chromium, and nothing else.
# Playwright (the Python package, without its own browser download) comes from tests/requirements.txt.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    echo "chromium already installed: $(command -v chromium)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends chromium
command -v chromium
