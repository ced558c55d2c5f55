"""The loader's download option: a published model fetched into models/scd/<name> on request, with its progress
on the node (ComfyUI's progress bar in bytes and a status line) and on the terminal (huggingface_hub's bars).

A folder already there is loaded without asking the hub, so a workflow saved with the option set runs offline
once the model has arrived."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import comfy.utils
import folder_paths
from scd_core.models.family import published_repos
from scd_core.models.fetch import fetch_model, folder_name
from server import PromptServer

OFF = "off"
DOWNLOAD_CHOICES = (OFF, *published_repos())
GB = 1e9


def download_tooltip() -> str:
    return ("Fetch a published model from the Hugging Face hub into models/scd/<its name> and load it instead of "
            "'model' (off: nothing is downloaded). Resumes an interrupted download, checks every file against "
            "the hub's list, never downloads code or pickles; once there it loads offline and is listed in "
            "'model'. Families that need files from several repositories are downloaded by hand (README).")


def download_root() -> Path:
    """models/scd/ (the first path registered for it)."""
    return Path(folder_paths.get_folder_paths("scd")[0])


def fetched_folder(repo_id: str, node_id: Optional[str]) -> tuple[str, Path]:
    """The label and folder of `repo_id` under models/scd/, fetched first when it is not there."""
    root = download_root()
    target = root / folder_name(repo_id)
    if target.exists():
        return target.name, target
    bar = comfy.utils.ProgressBar(1, node_id=node_id)
    server = PromptServer.instance
    print(f"SCD: downloading {repo_id} into {target}")

    def progress(done: int, total: int, name: str) -> None:
        bar.update_absolute(done, max(total, 1))
        if node_id is not None:
            at = f" ({name})" if name else ""
            server.send_progress_text(f"downloading {repo_id}: {done / GB:.2f} / {total / GB:.2f} GB{at}", node_id)

    folder = fetch_model(repo_id, root, progress=progress)
    print(f"SCD: {repo_id} is in {folder}")
    return folder.name, folder
