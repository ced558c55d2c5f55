"""Reading a Hugging Face text tokenizer from its files with the `tokenizers` library alone, and the JSON
settings files the families read themselves.

transformers' tokenizer classes changed a lot between 4.x and 5.x; the
tokenizer.json file did not.  Reading it directly gives the same ids under
every supported transformers version.  Special tokens (BOS) are added by the
caller, explicitly, so no post-processor setting can silently change them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from .checkpoints import ModelLoadError

TOKENIZER_FILE = "tokenizer.json"
# Where Hugging Face folders name their special tokens, most specific first.
SPECIAL_TOKEN_FILES = ("tokenizer_config.json", "special_tokens_map.json")


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`, or a ModelLoadError naming the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelLoadError(f"{path} is not a readable JSON file ({err})") from err
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} does not hold a JSON object")
    return data


def without_nulls(data: dict[str, Any]) -> dict[str, Any]:
    """`data` without its null entries, in nested objects too: a null setting means "the default"."""
    return {key: without_nulls(value) if isinstance(value, dict) else value
            for key, value in data.items() if value is not None}


def positive_int(value: Any, name: str, where: Path) -> int:
    """`value` if it is a positive integer (not a bool), else a ModelLoadError naming `name` in `where`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ModelLoadError(f"{where}: {name} must be a positive integer, got {value!r}")
    return value


def _token_content(value: Any) -> Optional[str]:
    # Special tokens are stored either as plain strings or as {"content": ...} objects.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class TextTokenizer:
    """A tokenizer.json plus the special-token names from the folder's config files."""

    def __init__(self, folder: Path, filename: str = TOKENIZER_FILE) -> None:
        from tokenizers import Tokenizer

        path = Path(folder) / filename
        if not path.is_file():
            raise ModelLoadError(f"{folder} has no {filename}; download the complete model folder "
                                 "(the tokenizer files sit next to config.json)")
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as err:  # tokenizers raises its own Exception subclass for unreadable files
            raise ModelLoadError(f"{path} is not a readable tokenizer file ({err})") from err
        self._special: dict[str, str] = {}
        for name in reversed(SPECIAL_TOKEN_FILES):  # the most specific file wins
            config_path = Path(folder) / name
            if config_path.is_file():
                for key, value in read_json(config_path).items():
                    content = _token_content(value)
                    if key.endswith("_token") and content is not None:
                        self._special[key] = content

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` without any special tokens added."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def vocabulary(self) -> dict[str, int]:
        """Every token string and its id, special tokens included."""
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def token_id(self, token: str) -> int:
        """The id of one token string; ModelLoadError if the vocabulary lacks it."""
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            raise ModelLoadError(f"the tokenizer has no token {token!r}; is this the right model folder?")
        return token_id

    def special_name(self, role: str) -> Optional[str]:
        """The token the folder names for a role such as "bos_token"; None where it names none (or null)."""
        return self._special.get(role)

    def special_id(self, role: str, default: str) -> int:
        """The id of a named special token such as "bos_token", falling back to `default`'s name."""
        return self.token_id(self._special.get(role, default))
