"""Tokens Emu3.5 writes one at a time outside an image grid: the text of a story and the size digits of a header.

Each is drawn by inverse CDF from its law on the cond row alone (one plain AR call; tokens the law forces ride with
the next call), with a uniform keyed by (seed, position): the same tokens whatever window the images are sampled at.
Used by emu3p5_story (text and written sizes) and emu3p5_auto (T2I with the model's own size).
"""

from __future__ import annotations

from typing import Optional

import torch

from ...decoding import rng
from ...decoding.sampling import Sampling, sample, to_probs
from ..sessions.cfg_session import CFGSession
from ..sessions.row_attention import RowAttentionBackbone
from .emu3p5_header import HEADER_STEPS, SizeMask


class PlainSteps:
    """The new tokens after `prompt`, each fed with the next call; `head` computes ids 0 .. V-1 of the logits."""

    def __init__(self, model: torch.nn.Module, prompt: list[int], head: torch.nn.Module, seed: int,
                 budget: int, device: torch.device) -> None:
        self.net, self.prompt, self.head, self.budget, self.device = model, prompt, head, budget, device
        self.noise, self.keys = rng.KeyedRandom(device), rng.seed_keys([seed], device)
        self.tokens: list[int] = []
        self.calls = 0  # the calls made, prefills included
        self.session: Optional[CFGSession] = None
        self.pending: list[int] = []  # tokens sampled or forced but not fed yet
        self.last = torch.empty(0)  # the head's logits after the tokens fed

    def left(self) -> int:
        return self.budget - len(self.tokens)

    def restart(self) -> None:
        """Drop the cache (an image's tokens were appended by another sampler): the next call feeds them all."""
        self.session = None

    def logits(self) -> torch.Tensor:
        """The cond row's logits (V,) after every token so far: the pending ones fed in one call (the whole
        sequence after a restart)."""
        if self.session is None:
            net = self.net
            ids = torch.tensor([self.prompt + self.tokens], device=self.device)
            self.session = CFGSession(ids, torch.ones_like(ids), self.left(), copies=1,
                                      backbone=lambda cache: RowAttentionBackbone(net.model, cache),
                                      embed_prefix=net.get_input_embeddings(), embed_image=net.get_input_embeddings(),
                                      head=self.head)
            self.pending, self.last = [], self.session.prefill()[0][0, -1]
            self.calls += 1
        elif self.pending:
            fed = torch.tensor([self.pending], device=self.device)
            self.pending, self.last = [], self.session.forward(fed)[0][0, -1]
            self.calls += 1
        return self.last

    def draw(self, logits: torch.Tensor, sampling: Sampling) -> int:
        """A token from `to_probs(logits)` by inverse CDF with the uniform of its position."""
        probs = to_probs(logits.view(1, 1, -1), None, sampling)[0, 0]
        position = torch.tensor([[len(self.tokens)]], device=probs.device)
        return int(sample(probs, self.noise.uniform(rng.SEQUENCE, self.keys, position, 0)[0, 0]))

    def append(self, token: int) -> None:
        self.tokens.append(token)
        self.pending.append(token)

    def write_header(self, mask: SizeMask, sampling: Sampling) -> Optional[tuple[int, int]]:
        """The header the model writes after <|image start|> under the authors' format mask, `sampling` applied
        after it (not guided); its (rows, cols), None where the budget ends first."""
        for step in range(1, HEADER_STEPS + 1):
            if self.left() < 1:
                return None
            last = step == HEADER_STEPS  # <|image token|>, the only id allowed: no call
            self.append(mask.image_token if last else self.draw(mask.masked(self.logits(), step), sampling))
        return mask.parse_size(self.tokens[-HEADER_STEPS:-1])
