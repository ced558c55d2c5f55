"""A synthetic image-token model for benchmarks: a 2-D grid Markov field.

The next-token law of position (r, c) depends on its left and above
neighbours through random low-rank embeddings, like the local statistics of
VQ image tokens; `sharpness` moves the per-token entropy from ~6 nats (flat)
down to ~2 (peaked).  It needs no weights, costs almost nothing per call, and
implements the TokenModel protocol, so NFE differences between couplers are
the engine's alone.
"""

from __future__ import annotations

from typing import Optional

import torch


class GridModel:
    def __init__(self, rows: int = 16, cols: int = 16, vocab_size: int = 1024, sharpness: float = 1.0,
                 rank: int = 32, seed: int = 0, device: str = "cpu") -> None:
        self.grid = (rows, cols)
        self.num_tokens, self.vocab_size = rows * cols, vocab_size
        gen = torch.Generator().manual_seed(seed)
        shape = (vocab_size + 1, rank)  # the extra row stands for "no neighbour" at the borders
        self.left = (torch.randn(shape, generator=gen) / rank**0.5).to(device)
        self.above = (torch.randn(shape, generator=gen) / rank**0.5).to(device)
        self.out = (torch.randn(vocab_size, rank, generator=gen) * sharpness).to(device)
        self.bias = (torch.randn(vocab_size, generator=gen) * sharpness).to(device)
        self.device = torch.device(device)

    def start(self, cond: Optional[object], batch_size: int) -> "GridSession":
        return GridSession(self, batch_size)

    def logits(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits of `positions` (B, T) given the tokens (B, N) written so far."""
        cols, none = self.grid[1], self.vocab_size
        left = torch.where(positions % cols > 0, tokens.gather(1, (positions - 1).clamp(min=0)), none)
        above = torch.where(positions >= cols, tokens.gather(1, (positions - cols).clamp(min=0)), none)
        hidden = self.left[left] + self.above[above]
        return hidden @ self.out.T + self.bias


class GridSession:
    """Stateless apart from the fed tokens: rewinding just moves the length back."""

    def __init__(self, model: GridModel, batch: int) -> None:
        self.model = model
        self.tokens = torch.zeros(batch, model.num_tokens, dtype=torch.long, device=model.device)
        self.length = 0

    def prefill(self):
        positions = torch.zeros(self.tokens.shape[0], 1, dtype=torch.long, device=self.model.device)
        return self.model.logits(self.tokens, positions), None

    def forward(self, new: torch.Tensor):
        width = new.shape[1]
        positions = self.length + torch.arange(width, device=new.device).expand_as(new)
        self.tokens[:, self.length:self.length + width] = new
        self.length += width
        return self.model.logits(self.tokens, positions + 1), None

    def rewind(self, n: int) -> None:
        self.length -= n
