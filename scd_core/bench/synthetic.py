"""A synthetic image-token model for benchmarks: a 2-D grid Markov field.

The next-token law of position (r, c) depends on its left and above
neighbours through random low-rank embeddings, like the local statistics of
VQ image tokens; `sharpness` moves the per-token entropy from ~6 nats (flat)
down to ~2 (peaked).  It needs no weights, costs almost nothing per call, and
implements the TokenModel protocol, so NFE differences between couplers are
the engine's alone.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from ..models.sessions.row_cache import tree_layout

Logits = tuple[torch.Tensor, Optional[torch.Tensor]]


def feed_tokens(tokens: torch.Tensor, start: torch.Tensor, new: torch.Tensor, branches: int,
                logits: Callable[[torch.Tensor, torch.Tensor], Logits]) -> tuple[Logits, list[torch.Tensor]]:
    """Write `new` (B, T) after each row's `start` (B, 1) fed tokens into `tokens` (B, N) and score them with
    `logits(table, positions)`, for sessions that keep no cache but the token table.  With `branches` > 1 the
    new tokens are a tree (`row_cache.tree_layout`): each later chain is scored on a copy of the table that
    holds it instead of the first chain.  Returns (logits of the next positions in the order fed, the tables
    of the later chains)."""
    last = tokens.shape[1] - 1
    width = new.shape[1]
    offset, _ = tree_layout(width, branches, new.device)
    chain = (width - 1) // branches
    # a row running past the last position (while a slower one finishes) parks its extra tokens there
    positions = (start + offset).clamp(max=last)
    outputs, tables = [], []
    for branch in range(branches):
        columns = torch.arange(chain + 1) if branch == 0 else 1 + chain * branch + torch.arange(chain)
        table = tokens if branch == 0 else tokens.clone()
        table.scatter_(1, positions[:, columns], new[:, columns])
        outputs.append(logits(table, (positions[:, columns] + 1).clamp(max=last)))
        if branch:
            tables.append(table)
    joined = tuple(None if parts[0] is None else torch.cat(parts, dim=1) for parts in zip(*outputs))
    return joined, tables


def kept_branch(tokens: torch.Tensor, tables: list[torch.Tensor], branch: torch.Tensor) -> torch.Tensor:
    """The token table after a tree call when row r keeps chain `branch[r]`: `tokens` (chain 0) or one of the
    later chains' `tables` from `feed_tokens`."""
    for number, table in enumerate(tables, start=1):
        tokens = torch.where((branch == number).unsqueeze(1), table, tokens)
    return tokens


def admitted(session: Any, fresh: Sequence[Any]) -> int:
    """`admit` for sessions that keep nothing but a token table (`tokens`, `length`): append the rows of `fresh`
    and return how many rows the call prefills, the session's own too when it was not prefilled."""
    own = 0 if getattr(session, "prefilled", False) else session.tokens.shape[0]
    session.tokens = torch.cat([session.tokens] + [other.tokens for other in fresh])
    session.length = torch.cat([session.length] + [other.length for other in fresh])
    session.prefilled = True
    return own + sum(other.tokens.shape[0] for other in fresh)


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

    def hidden(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(B, T, rank) features of `positions` (B, T): the embeddings of their left and upper neighbours."""
        cols, none = self.grid[1], self.vocab_size
        left = torch.where(positions % cols > 0, tokens.gather(1, (positions - 1).clamp(min=0)), none)
        above = torch.where(positions >= cols, tokens.gather(1, (positions - cols).clamp(min=0)), none)
        return self.left[left] + self.above[above]

    def logits(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits of `positions` (B, T) given the tokens (B, N) written so far."""
        return self.hidden(tokens, positions) @ self.out.T + self.bias

    def scores(self, tokens: torch.Tensor, positions: torch.Tensor) -> Logits:
        """What a session returns for `positions`: (logits, uncond logits or None: no guidance here)."""
        return self.logits(tokens, positions), None


class GridSession:
    """Stateless apart from the fed tokens: rewinding just moves a row's length back, so rows advance at their
    own pace and a finished row can be dropped."""

    rows_per_cache = 1

    def __init__(self, model: GridModel, batch: int) -> None:
        self.model = model
        self.tokens = torch.zeros(batch, model.num_tokens, dtype=torch.long, device=model.device)
        self.length = torch.zeros(batch, 1, dtype=torch.long, device=model.device)

    def prefill(self, tokens: Optional[torch.Tensor] = None):
        """With `tokens` (batch, K), a kept top of an image: fed in the same call (`model.Session`)."""
        self.prefilled = True
        if tokens is not None:
            self.tokens[:, :tokens.shape[1]] = tokens.to(self.tokens.device)
            self.length += tokens.shape[1]
        return self.model.scores(self.tokens, self.length.clone())

    def admit(self, fresh: Sequence["GridSession"], tokens: Optional[torch.Tensor] = None):
        """Go on with the rows of `fresh` (not prefilled) too: one call feeds `tokens` to this session's rows
        (when given) and gives the new rows' position-0 logits."""
        fed = None if tokens is None else self.forward(tokens)
        added = admitted(self, fresh)
        return fed, self.model.scores(self.tokens[-added:], torch.zeros_like(self.length[-added:]))

    def forward(self, new: torch.Tensor, branches: int = 1):
        logits, self.branch_tables = feed_tokens(self.tokens, self.length, new, branches, self.model.scores)
        self.length += new.shape[1]
        return logits

    def rewind(self, n) -> None:
        self.length -= n.view(-1, 1) if isinstance(n, torch.Tensor) else n

    def keep_rows(self, index: torch.Tensor) -> None:
        self.tokens, self.length = self.tokens[index], self.length[index]

    def keep_branch(self, branch: torch.Tensor, width: int, branches: int) -> None:
        self.tokens = kept_branch(self.tokens, self.branch_tables, branch)
