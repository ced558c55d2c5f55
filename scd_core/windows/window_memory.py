"""What the automatic window learned, kept across processes: a small JSON file of per-width call costs.

A new process (a restarted ComfyUI server, the next `python -m scd_core generate`) starts from the costs the
last one learned for the same model and cost key (`auto_window.cost_key`), with the widths it had compared and
the pooled rejection hazard of its last run (the first call's commit law), instead of a fresh timed pass whose
one noisy measurement could cost the whole process.  The learning then goes on from there as in one process.

The file: $SCD_WINDOW_COSTS if set ("off": nothing is read or written); under ComfyUI the user directory's
comfyui-scd/ (`set_folder`, from nodes/); else $XDG_CACHE_HOME/comfyui-scd/ or ~/.cache/comfyui-scd/.  It is
written when an automatic run finishes (`save`, from the window policy) and when the process exits, each time
read again and merged: the entries of other models, keys or machines that other processes wrote are kept, and
an entry this process learned something new for since it last wrote it replaces the one saved (the newest
learning wins).  Writers take turns
(a lock file beside it, where the system has fcntl) and replace the file whole (a temporary file, os.replace),
so a reader never sees half a file.  A file that does not parse (cut off, not text) is ignored with one warning
and replaced by a valid one; a foreign one (another format or version) or one that cannot be read (a folder,
no permission) is ignored with one warning and left alone.  Only numbers are read from it; nothing is
unpickled.  Delete the file to start afresh.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import math
import os
import platform
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import torch

try:
    import fcntl
except ImportError:  # Windows: writers do not take turns (two at once may drop one's newest entries till its next save)
    fcntl = None

FILE_NAME = "window_costs.json"
FORMAT, VERSION = "comfyui-scd window costs", 1
ENV = "SCD_WINDOW_COSTS"
MAX_ENTRIES = 64  # the most recently saved models and keys; the file stays a few kB

_folder: Optional[Path] = None  # set under ComfyUI
# the costs this process learns (auto_window.CallCosts: estimates(), compared, hazard, fixed), by file and entry
_tracked: dict[tuple[Path, str], Any] = {}
# what this process last wrote of each tracked entry: one it has learned nothing new for since is not written
# again (over what another process learned since)
_written: dict[tuple[Path, str], dict] = {}
# what an entry holds: seconds per call by width, the widths compared, the pooled rejection hazard
Saved = tuple[dict[int, float], set[int], Optional[float]]
_warned: set[Path] = set()
_exit_hook = False


def set_folder(folder: Path) -> None:
    """Keep the file in `folder` (ComfyUI's user directory) unless $SCD_WINDOW_COSTS says otherwise."""
    global _folder
    _folder = Path(folder)


def costs_file() -> Optional[Path]:
    """The file the costs are kept in; None when $SCD_WINDOW_COSTS is "off"."""
    chosen = os.environ.get(ENV)
    if chosen:
        return None if chosen == "off" else Path(chosen).expanduser()
    if _folder is not None:
        return _folder / FILE_NAME
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "comfyui-scd" / FILE_NAME


def model_identity(model: Any) -> str:
    """The same for the same model in another process: its class, its image size and its weights' shapes (what
    a call's cost follows; two fine-tunes of one network share their costs)."""
    module = getattr(model, "module", None)
    shapes = [tuple(p.shape) for p in module.parameters()] if isinstance(module, torch.nn.Module) else []
    digest = hashlib.sha256(repr(shapes).encode()).hexdigest()[:16]
    grid = tuple(getattr(model, "grid", None) or ())
    return f"{type(model).__module__}.{type(model).__qualname__} {model.num_tokens} {grid} {digest}"


def hardware(model: Any) -> str:
    """The machine a call's cost was measured on: the GPU's name, or the CPU's architecture and cores (a user
    directory shared between machines keeps each one's costs apart)."""
    device = torch.device(str(getattr(model, "device", "cpu")))
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return f"{platform.machine()} x{os.cpu_count()}"


def entry_name(model: Any, key: tuple) -> str:
    """The name of `model`'s entry under `key` (`auto_window.cost_key`) in the file."""
    return f"{model_identity(model)} {json.dumps(list(key))} on {hardware(model)}"


def _warn_once(path: Path, problem: str) -> None:
    if path not in _warned:
        _warned.add(path)
        logging.warning("comfyui-scd: the automatic window's saved costs in %s: %s", path, problem)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _entry_costs(entry: Any) -> Saved:
    """What one saved entry holds; ValueError if it is not one."""
    costs, compared, hazard = entry["costs"], entry["compared"], entry["hazard"]
    seeds = {int(width): seconds for width, seconds in costs.items()}
    if not seeds or not all(width >= 1 and _number(seconds) and seconds > 0 for width, seconds in seeds.items()):
        raise ValueError("costs must be positive seconds by width")
    if not all(isinstance(width, int) and width in seeds for width in compared):
        raise ValueError("compared must list costed widths")
    if hazard is not None and not (_number(hazard) and 0 <= hazard <= 1):
        raise ValueError("hazard must be a share")
    return seeds, set(compared), hazard


def _read(path: Path) -> Optional[dict]:
    """The file's entries, {} where there is none or it does not parse (ours, cut off: to be replaced); None
    (after one warning) where it is not ours to use or replace."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return {}
    except OSError as err:
        _warn_once(path, f"cannot be read ({err}); ignored and left alone")
        return None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        _warn_once(path, f"unreadable ({err}); ignored, and replaced by what this process learns")
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION \
            or not isinstance(data.get("models"), dict):
        _warn_once(path, f"not a {FORMAT!r} file of version {VERSION}; ignored and left alone")
        return None
    return data["models"]


def recall(model: Any, key: tuple) -> Optional[Saved]:
    """The costs an earlier process saved for `model` under `key`, or None."""
    path = costs_file()
    entries = None if path is None else _read(path)
    entry = (entries or {}).get(entry_name(model, key))
    if entry is None:
        return None
    try:
        return _entry_costs(entry)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        _warn_once(path, f"a malformed entry ({err!r}); ignored")
        return None


def track(model: Any, key: tuple, costs: Any) -> None:
    """Save `costs` (and what else this process learns under `key`) at each `save`, and when the process exits;
    fixed cost profiles (`auto_window.remember_costs`) are not learned, so not saved."""
    global _exit_hook
    path = costs_file()
    if path is None or costs.fixed:
        return
    _tracked[(path, entry_name(model, key))] = costs
    if not _exit_hook:
        atexit.register(save)
        _exit_hook = True


def save() -> None:
    """Merge every tracked entry into its file, as it is now on disk (see the module's docstring)."""
    for path in {path for path, _ in _tracked}:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with _turn(path):
                entries = _read(path)
                if entries is None:
                    continue  # not ours: left alone
                now, fresh = time.time(), {}
                for (where, name), costs in _tracked.items():
                    learned = {"costs": {str(w): s for w, s in costs.estimates().items()},
                               "compared": sorted(costs.compared), "hazard": costs.hazard}
                    if where == path and _written.get((where, name)) != learned:
                        entries[name], fresh[(where, name)] = {**learned, "saved": now}, learned
                if not fresh:
                    continue  # nothing learned since: the file stays as other processes left it
                newest = sorted(entries.items(), key=lambda item: _saved_at(item[1]), reverse=True)[:MAX_ENTRIES]
                partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
                partial.write_text(json.dumps({"format": FORMAT, "version": VERSION, "models": dict(newest)},
                                              indent=1), encoding="utf-8")
                os.replace(partial, path)
                _written.update(fresh)
        except OSError as err:
            _warn_once(path, f"cannot be written ({err}); the costs are learned afresh in the next process")


@contextlib.contextmanager
def _turn(path: Path) -> Iterator[None]:
    """Hold the lock beside `path` (one writer at a time reads, merges and replaces it)."""
    with open(path.with_name(f"{path.name}.lock"), "a", encoding="utf-8") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def _saved_at(entry: Any) -> float:
    saved = entry.get("saved") if isinstance(entry, dict) else None
    return saved if _number(saved) else 0.0
