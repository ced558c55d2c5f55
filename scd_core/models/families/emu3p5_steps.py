"""Tokens Emu3.5 writes one at a time outside an image grid: the text of a story and the size digits of a header.

Each is drawn by inverse CDF from its law on the cond row alone (one plain AR call; tokens the law forces ride with
the next call, as do the last tokens of an image the engine sampled over the same kept rows), with a uniform keyed by
(seed, position): the same tokens whatever window the images are sampled at.
Used by emu3p5_story (text and written sizes) and emu3p5_auto (T2I with the model's own size).
"""

from __future__ import annotations

from typing import Optional

import torch

from ...decoding import rng
from ...decoding.sampling import Sampling, sample, to_probs
from ..sessions.kept_rows import KeptRows
from .emu3p5_header import HEADER_STEPS, SizeMask


class PlainSteps:
    """The new tokens after `prompt`, each fed with the next call on the first row of `rows` (kept rows, whose
    cache may hold more of the sequence: an image the engine sampled over them); `head` computes ids 0 .. V-1 of
    the logits."""

    def __init__(self, rows: KeptRows, prompt: list[int], head: torch.nn.Module, seed: int, budget: int) -> None:
        self.rows, self.prompt, self.head, self.budget = rows, prompt, head, budget
        device = rows.cache.lengths.device
        self.noise, self.keys = rng.KeyedRandom(device), rng.seed_keys([seed], device)
        self.tokens: list[int] = []
        self.calls = 0  # the calls made, the prompt's included
        self.last: Optional[tuple[int, torch.Tensor]] = None  # (tokens, the head's logits after them)

    def left(self) -> int:
        return self.budget - len(self.tokens)

    def logits(self) -> torch.Tensor:
        """The row's logits (V,) after every token so far: the ones its cache lacks fed in one call."""
        if self.last is None or self.last[0] != len(self.tokens):
            logits = self.rows.catch_up([self.prompt + self.tokens], self.head)[0]
            self.last = (len(self.tokens), logits)
            self.calls += 1
        return self.last[1]

    def draw(self, logits: torch.Tensor, sampling: Sampling) -> int:
        """A token from `to_probs(logits)` by inverse CDF with the uniform of its position."""
        probs = to_probs(logits.view(1, 1, -1), None, sampling)[0, 0]
        position = torch.tensor([[len(self.tokens)]], device=probs.device)
        return int(sample(probs, self.noise.uniform(rng.SEQUENCE, self.keys, position, 0)[0, 0]))

    def append(self, token: int) -> None:
        self.tokens.append(token)

    def write_header(self, mask: SizeMask, sampling: Sampling) -> Optional[tuple[int, int]]:
        """The header the model writes after <|image start|> under the authors' format mask, `sampling` applied
        after it (not guided); its (rows, cols), None where the budget ends first."""
        for step in range(1, HEADER_STEPS + 1):
            if self.left() < 1:
                return None
            last = step == HEADER_STEPS  # <|image token|>, the only id allowed: no call
            self.append(mask.image_token if last else self.draw(mask.masked(self.logits(), step), sampling))
        return mask.parse_size(self.tokens[-HEADER_STEPS:-1])
