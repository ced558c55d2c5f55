"""A tiktoken-format byte-level BPE (Emu3.5's `emu3.tiktoken`), read and applied without the tiktoken package.

The file holds one `base64(token bytes) rank` line per mergeable token.  Encoding splits the NFC-normalised text
at special tokens (any `<|...|>` surface form in `specials` is one id, as the authors' tokenizer encodes with
every special allowed), cuts the text between them with the authors' pre-tokenisation pattern, and merges each
piece's bytes pairwise, always the adjacent pair of lowest rank first (leftmost on a tie): tiktoken's algorithm,
which the tests compare against tiktoken itself.  Prompts are short, so plain Python is fast enough.
"""

from __future__ import annotations

import base64
import binascii
import unicodedata
from pathlib import Path
from typing import Iterable

import regex

from ..weights.checkpoints import ModelLoadError

# Emu3.5's pre-tokenisation (src/tokenizer_emu3_ibq/tokenization_emu3.py, PAT_STR): digits one at a time.
PATTERN = regex.compile(r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                        r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


def read_ranks(path: Path) -> dict[bytes, int]:
    """The mergeable tokens of a .tiktoken file and their ranks; ModelLoadError naming the line that is wrong."""
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(Path(path).read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error):
            raise ModelLoadError(f"{path}: line {number} is not 'base64-token rank'; is this a .tiktoken file?") \
                from None
    if not ranks:
        raise ModelLoadError(f"{path} holds no tokens; download it again")
    return ranks


class TiktokenBPE:
    """`encode(text)`: ids of the mergeable tokens and of the special tokens (`specials`: surface form -> id)."""

    def __init__(self, ranks: dict[bytes, int], specials: dict[str, int]) -> None:
        self.ranks, self.specials = ranks, specials
        self._pieces = {rank: token for token, rank in ranks.items()}  # id -> bytes, for decode
        self._pieces.update({i: surface.encode("utf-8") for surface, i in specials.items()})

    def encode(self, text: str) -> list[int]:
        text, ids, start = unicodedata.normalize("NFC", text), [], 0
        at = text.find("<|")
        while at >= 0:
            end = text.find("|>", at + 2)
            if end < 0:
                break
            surface = text[at:end + 2]
            if surface in self.specials:  # no special holds "|>" inside: this is the only one that may start here
                ids += self.encode_ordinary(text[start:at]) + [self.specials[surface]]
                start = end + 2
                at = text.find("<|", start)
            else:
                at = text.find("<|", at + 1)
        return ids + self.encode_ordinary(text[start:])

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`: their bytes read as UTF-8 (a character cut between ids reads as U+FFFD), specials
        as their surface forms."""
        try:
            return b"".join(self._pieces[int(i)] for i in ids).decode("utf-8", errors="replace")
        except KeyError as err:
            raise ValueError(f"id {err.args[0]} is no token of this tokenizer") from None

    def encode_ordinary(self, text: str) -> list[int]:
        """Ids of `text` read as plain text (special surface forms too)."""
        ids: list[int] = []
        for piece in PATTERN.findall(text):
            data = piece.encode("utf-8")
            rank = self.ranks.get(data)
            ids += [rank] if rank is not None else self._merged(data)
        return ids

    def _merged(self, data: bytes) -> list[int]:
        parts = [data[i:i + 1] for i in range(len(data))]
        while len(parts) > 1:
            pairs = [self.ranks.get(parts[i] + parts[i + 1]) for i in range(len(parts) - 1)]
            known = [(rank, i) for i, rank in enumerate(pairs) if rank is not None]
            if not known:
                break
            _, i = min(known)
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        try:
            return [self.ranks[part] for part in parts]
        except KeyError as err:
            raise ValueError(f"the tokenizer has no token for the byte {err.args[0]!r}: emu3.tiktoken is incomplete") \
                from None
