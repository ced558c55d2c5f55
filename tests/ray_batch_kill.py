"""Run `python -m scd_core batch ... --ray local --workers 2` in this process and SIGKILL one worker actor once the
first image is in the manifest.  tests/test_batch.py starts it inside a network namespace with only loopback.

    python tests/ray_batch_kill.py OUT [batch arguments...]

Prints `KILLED {"pid": ..., "manifest_lines": ...}` (what was killed, and how many images were in place then)
and exits with the command's exit code.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scd_core.frontends.cli import main  # noqa: E402

WAIT_S = 300


def descendants(root: int) -> set[int]:
    """The processes below `root` (the Ray cluster this process started), never anyone else's."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def map_workers() -> list[int]:
    workers = []
    for pid in sorted(descendants(os.getpid())):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::MapWorker"):
                workers.append(pid)
        except OSError:
            continue
    return workers


def kill_a_worker_after_the_first_image(manifest: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        lines = manifest.read_text().splitlines() if manifest.is_file() else []
        if any('"status": "ok"' in line for line in lines):
            workers = map_workers()
            if workers:
                os.kill(workers[0], signal.SIGKILL)
                print("KILLED " + json.dumps({"pid": workers[0], "workers": workers, "manifest_lines": len(lines)}),
                      flush=True)
                return
        time.sleep(0.05)
    print("KILLED " + json.dumps({"pid": None}), flush=True)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    threading.Thread(target=kill_a_worker_after_the_first_image, args=(out / "manifest.jsonl",),
                     daemon=True).start()
    sys.exit(main(["batch", *sys.argv[2:], "--out", str(out), "--ray", "local", "--workers", "2"]))
