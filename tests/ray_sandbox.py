"""Ray in a box: a command run inside a network namespace with only loopback (Ray probes outside addresses)
and a pid namespace (every Ray process ends with the command, and /proc shows only them)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

SANDBOX = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"]


def run_sandboxed(command: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """`command` in the sandbox with loopback up and Ray's usage reporting off; fails the test where the
    sandbox cannot be made (it needs root)."""
    probe = subprocess.run([*SANDBOX, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.fail(f"the Ray test must run under `{' '.join(SANDBOX)}`, which fails here (it needs root): "
                    f"{probe.stderr.strip()}")
    script = f"ip link set lo up && RAY_USAGE_STATS_ENABLED=0 exec {shlex.join(command)}"
    ray_dir = tempfile.mkdtemp(prefix="ray")  # short: Ray's socket paths must fit in 107 characters
    try:
        return subprocess.run([*SANDBOX, "sh", "-c", script], cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "RAY_TMPDIR": ray_dir})
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
