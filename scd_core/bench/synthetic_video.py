"""A synthetic video-token model for benchmarks: frames that change a little from one to the next.

Each frame is a 2-D grid Markov field like `synthetic.GridModel` (the law of a
token depends on its left and above neighbours); a token of a later frame keeps
the token at the same place one frame earlier with probability 1 - `change`
and is otherwise drawn from the grid law:

    p(x | left, above, previous) = (1 - change) * onehot(previous) + change * grid(left, above)

`change` is the knob for how much the video moves.  As Cosmos does, the model
continues a context: one fixed context frame (sampled from the grid law)
precedes the generated frames and is offered to the engine as
`prefix_tokens`, so previous-frame drafts exist from the first generated frame on.
"""

from __future__ import annotations

from typing import Optional

import torch

from .synthetic import GridModel


class VideoGridModel:
    default_draft_init = "previous_frame"  # as the real video family's (Cosmos)

    def __init__(self, frames: int = 4, rows: int = 16, cols: int = 16, vocab_size: int = 1024, change: float = 0.2,
                 sharpness: float = 1.5, seed: int = 0, device: str = "cpu") -> None:
        if not 0 < change <= 1:
            raise ValueError(f"change must be in (0, 1], got {change}")
        self.grid = (frames, rows, cols)
        self.num_tokens, self.vocab_size = frames * rows * cols, vocab_size
        self.frame_tokens = rows * cols
        self.change = change
        self.device = torch.device(device)
        self.spatial = GridModel(rows, cols, vocab_size, sharpness, seed=seed, device=device)
        self.context = self._sample_frame(torch.Generator(device=device).manual_seed(seed + 1))

    def _sample_frame(self, gen: torch.Generator) -> torch.Tensor:
        """One frame (rows * cols,) drawn token by token from the grid law."""
        frame = torch.zeros(1, self.frame_tokens, dtype=torch.long, device=self.device)
        for position in range(self.frame_tokens):
            logits = self.spatial.logits(frame, torch.tensor([[position]], device=self.device))
            frame[0, position] = torch.multinomial(logits[0, 0].softmax(-1), 1, generator=gen)[0]
        return frame[0]

    def start(self, cond: Optional[object], batch_size: int) -> "VideoGridSession":
        return VideoGridSession(self, batch_size)

    def logits(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits of sequence `positions` (B, T) given `tokens` (B, context + N), the context frame first."""
        in_frame = positions % self.frame_tokens
        # each query sees its own frame as a grid of its own, so the grid law's borders stay per frame
        starts = (positions - in_frame).unsqueeze(-1) + torch.arange(self.frame_tokens, device=positions.device)
        frames = tokens.gather(1, starts.flatten(1)).view(-1, self.frame_tokens)
        spatial = self.spatial.logits(frames, in_frame.view(-1, 1)).view(*positions.shape, -1)
        previous = tokens.gather(1, positions - self.frame_tokens)
        p = self.change * spatial.softmax(-1)
        p.scatter_add_(-1, previous.unsqueeze(-1), torch.full_like(p[..., :1], 1 - self.change))
        return p.log()


class VideoGridSession:
    """Stateless apart from the fed tokens; sequence positions count the context frame."""

    def __init__(self, model: VideoGridModel, batch: int) -> None:
        self.model = model
        self.prefix_tokens = model.context
        context = model.frame_tokens
        self.tokens = torch.zeros(batch, context + model.num_tokens, dtype=torch.long, device=model.device)
        self.tokens[:, :context] = model.context
        self.length = context

    def prefill(self):
        positions = torch.full((self.tokens.shape[0], 1), self.length, dtype=torch.long, device=self.model.device)
        return self.model.logits(self.tokens, positions), None

    def forward(self, new: torch.Tensor):
        width = new.shape[1]
        positions = self.length + torch.arange(width, device=new.device).expand_as(new)
        self.tokens[:, self.length:self.length + width] = new
        self.length += width
        return self.model.logits(self.tokens, (positions + 1).clamp(max=self.tokens.shape[1] - 1)), None

    def rewind(self, n: int) -> None:
        self.length -= n
