"""Where the loader finds models: ComfyUI's models/scd/ and the family folders models/Janus-Pro/,
models/LlamaGen/, models/Cosmos/ and models/Emu3/.

Hugging Face style models are folders, which folder_paths.get_filename_list does not
list, so the folders under each registered path are enumerated here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import folder_paths

DEMO = "demo"
# folder_paths names; each is models/<name>/ by default (extra_model_paths.yaml may add more paths).
MODEL_ROOTS = ("scd", "Janus-Pro", "LlamaGen", "Cosmos", "Emu3")
# folders next to the models that hold a part of one, not a model: Cosmos's sibling tokenizer folder
HELPER_FOLDERS = ("Cosmos-1.0-Tokenizer-DV8x16x16",)
MODEL_FILE_SUFFIXES = (".safetensors", ".pt", ".pth", ".ckpt", ".bin")


def register_model_roots() -> None:
    for name in MODEL_ROOTS:
        folder_paths.add_model_folder_path(name, os.path.join(folder_paths.models_dir, name))


def _holds_model_files(folder: Path) -> bool:
    return any(p.is_file() and (p.name == "config.json" or p.suffix in MODEL_FILE_SUFFIXES)
               for p in folder.iterdir())


def _label(root_name: str, folder_name: Optional[str]) -> str:
    # models/scd/X is just "X"; the family folders keep their prefix so names stay unique.
    if folder_name is None:
        return root_name
    return folder_name if root_name == "scd" else f"{root_name}/{folder_name}"


def model_choices() -> dict[str, Optional[Path]]:
    """Combo label -> model folder ("demo" -> None, the embedded demo model); the first path wins a name."""
    choices: dict[str, Optional[Path]] = {DEMO: None}
    for root_name in MODEL_ROOTS:
        for root in map(Path, folder_paths.get_folder_paths(root_name)):
            if not root.is_dir():
                continue
            # a model put straight into models/Janus-Pro/ is offered as "Janus-Pro"
            if _holds_model_files(root):
                choices.setdefault(_label(root_name, None), root)
            for child in sorted(root.iterdir()):
                if child.is_dir() and not child.name.startswith(".") and child.name not in HELPER_FOLDERS:
                    choices.setdefault(_label(root_name, child.name), child)
    return choices


def unknown_model_message(name: str, choices: dict[str, Optional[Path]]) -> str:
    roots = ", ".join(f"models/{root}/" for root in MODEL_ROOTS)
    return (f"model '{name}' not found; put each model in its own folder under {roots} "
            f"and refresh. Available: {', '.join(choices)}")
