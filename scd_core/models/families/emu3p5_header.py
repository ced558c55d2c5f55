"""The image header Emu3.5 writes after <|image start|>: the size "H*W" in 16 px codes, then <|image token|>.

From the authors' src/utils/logits_processor.py (in_image_logits_processor, parse_hw; github.com/baaivision/Emu3.5):
- a size given (their target_height / target_width) forces the tokenizer's tokens of "H*W", then <|image token|>;
- with none, the model writes it under a format mask: header step 1 and 4 a digit 1-9, step 2 and 5 a digit 0-9,
  step 3 '*', step 6 <|image token|> (so a model-written side is 10..99 codes);
- the size steps are not guided (their uncond branch is fed the tokens, which is all it gets), and the image
  temperature / top-k / top-p apply after the mask (apply_differential_topk in image mode);
- the size is read back from the tokens between <|image start|> and <|image token|> (parse_hw: "H*W").

`SizeMask` holds the ids of that mask for a tokenizer; T2I with the model's own size (the authors' aspect "auto")
samples the same steps: `SizeMask.masked(logits, step)` for each step, then `forced_header` is what the model wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

HEADER_STEPS = 6  # "d d * d d" and <|image token|>
NONZERO, DIGITS, STAR = "123456789", "0123456789", "*"


@dataclass(frozen=True)
class SizeMask:
    """The ids the authors' mask allows at each step of a model-written header."""

    nonzero: tuple[int, ...]  # '1' .. '9'
    digits: tuple[int, ...]   # '0' .. '9'
    star: int
    image_token: int
    characters: dict[int, str]  # digit and star ids -> their character (parse_size)

    @classmethod
    def for_tokenizer(cls, encode: Callable[[str], list[int]], image_token: int) -> "SizeMask":
        """From the tokenizer's single-character tokens; a tokenizer that splits one of them is refused."""
        ids = {}
        for character in DIGITS + STAR:
            tokens = encode(character)
            if len(tokens) != 1:
                raise ValueError(f"the tokenizer writes {character!r} as {len(tokens)} tokens; Emu3.5's writes "
                                 "each digit and '*' as one (emu3.tiktoken)")
            ids[character] = tokens[0]
        return cls(nonzero=tuple(ids[c] for c in NONZERO), digits=tuple(ids[c] for c in DIGITS), star=ids[STAR],
                   image_token=image_token, characters={token: c for c, token in ids.items()})

    def allowed(self, step: int) -> tuple[int, ...]:
        """The ids the model may write at header step `step` (1 = the token after <|image start|>)."""
        if step in (1, 4):
            return self.nonzero
        if step in (2, 5):
            return self.digits
        if step == 3:
            return (self.star,)
        if step == HEADER_STEPS:
            return (self.image_token,)
        raise ValueError(f"a written header has {HEADER_STEPS} steps, got step {step}")

    def masked(self, logits: torch.Tensor, step: int) -> torch.Tensor:
        """`logits` (..., V) over ids 0..V-1 with every id the mask forbids at `step` set to -inf."""
        keep = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        keep[list(self.allowed(step))] = True
        return logits.masked_fill(~keep, float("-inf"))

    def parse_size(self, written: Sequence[int]) -> tuple[int, int]:
        """(rows, cols) from the tokens between <|image start|> and <|image token|> ("H*W")."""
        text = "".join(self.characters.get(int(token), "?") for token in written)
        rows, star, cols = text.partition(STAR)
        if not (star and rows.isdigit() and cols.isdigit() and int(rows) > 0 and int(cols) > 0):
            raise ValueError(f"an image header must read 'H*W' in codes, got {text!r}")
        return int(rows), int(cols)


def forced_header(encode: Callable[[str], list[int]], size: tuple[int, int], image_token: int) -> list[int]:
    """The header tokens after <|image start|> for a given (rows, cols): the tokenizer's "H*W", <|image token|>."""
    rows, cols = size
    return [*encode(f"{rows}*{cols}"), image_token]
