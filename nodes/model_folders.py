"""Where the loader finds models: ComfyUI's models/scd/ and each family's own folders (`Family.roots`, e.g.
models/Janus-Pro/).

Hugging Face style models are folders, which folder_paths.get_filename_list does not
list, so the folders under each registered path are enumerated here; only those a model
family recognises are offered (a tokenizer or text-encoder folder next to the models, an
empty or unrelated folder is not).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Optional

import folder_paths
from scd_core.models.family import families
from scd_core.models.loading import detect_family, download_hint, unrecognised_message

DEMO = "demo"
# folder_paths names; each is models/<name>/ by default (extra_model_paths.yaml may add more paths).
MODEL_ROOTS = ("scd", *(root for family in families() for root in family.roots))


def register_model_roots() -> None:
    for name in MODEL_ROOTS:
        folder_paths.add_model_folder_path(name, os.path.join(folder_paths.models_dir, name))


def _label(root_name: str, folder_name: Optional[str]) -> str:
    # models/scd/X is just "X"; the family folders keep their prefix so names stay unique.
    if folder_name is None:
        return root_name
    return folder_name if root_name == "scd" else f"{root_name}/{folder_name}"


def _candidate_folders() -> Iterator[tuple[str, Path]]:
    """(label, folder) for each registered model root (a model put straight into models/Janus-Pro/ is
    "Janus-Pro") and each visible folder in one, recognised or not."""
    for root_name in MODEL_ROOTS:
        for root in map(Path, folder_paths.get_folder_paths(root_name)):
            if not root.is_dir():
                continue
            yield _label(root_name, None), root
            for child in sorted(root.iterdir()):
                if child.is_dir() and not child.name.startswith("."):
                    yield _label(root_name, child.name), child


def model_choices() -> dict[str, Optional[Path]]:
    """Combo label -> model folder ("demo" -> None, the embedded demo model); the first path wins a name."""
    choices: dict[str, Optional[Path]] = {DEMO: None}
    for label, folder in _candidate_folders():
        if label not in choices and detect_family(folder) is not None:
            choices[label] = folder
    return choices


def _where(name: str) -> str:
    """The folder a label stands for, as the user sees it."""
    return f"models/{name}/" if name.partition("/")[0] in MODEL_ROOTS else f"models/scd/{name}/"


def unknown_model_message(name: str, choices: dict[str, Optional[Path]]) -> str:
    hint = download_hint(name)
    download = f"download {hint} into {_where(name)}" if hint else \
        f"put each model in its own folder under {', '.join(f'models/{root}/' for root in MODEL_ROOTS)}"
    unrecognised = next((folder for label, folder in _candidate_folders() if label == name), None)
    problem = unrecognised_message(unrecognised) if unrecognised is not None else f"model '{name}' not found"
    return f"{problem}; {download} and refresh. Available: {', '.join(choices)}"
