"""Counter-based randomness: every draw is a hash of (seed, purpose, row, position, counter).

Nothing is stored and no generator state is threaded through the loop, so a
draw depends only on what it is for: results do not change with the device, the
order of rows, or (for position-keyed draws) the window size.  The hash is
a lowbias32-style integer finaliser in int64 lanes whose multipliers are below
2**31, so no product overflows and CPU and GPU give identical bits.
"""

from __future__ import annotations

import torch

M32 = 0xFFFFFFFF

# What a draw is for; each purpose gets its own independent stream.  The numbers are part of every seed's
# image: 8 and 9 belonged to the removed draft_mix and stay unused, so the other streams keep their draws.
ACCEPT, RESIDUAL, FRESH, ALPHA, INIT, GUMBEL, BLOCK, BLOCK_RESIDUAL = range(8)
CANDIDATE, CANDIDATE_ACCEPT, CANDIDATE_RESIDUAL = 10, 11, 12


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijection of [0, 2**32); x < 2**32 times a multiplier < 2**31 stays below 2**63."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & M32
    x = x ^ (x >> 15)
    x = (x * 0x4CA68B47) & M32
    return x ^ (x >> 16)


def _absorb(h: torch.Tensor, value: torch.Tensor | int) -> torch.Tensor:
    # a Python int stays a scalar operand: no tensor is made from it (none may be while a CUDA graph is captured)
    return _mix32(h ^ (value & M32))


def _to_uniform(h: torch.Tensor) -> torch.Tensor:
    """24 random bits to a float32 strictly inside (0, 1)."""
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / 2**24)


class KeyedRandom:
    """Uniform and Gumbel draws keyed by (seed, purpose, row, position, counter)."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.device = device
        seed_hash = _mix32(torch.tensor(seed & M32, dtype=torch.int64, device=device))
        self._seed_hash = _absorb(seed_hash, (seed >> 32) & M32)

    def _key(self, purpose: int, rows: torch.Tensor, positions: torch.Tensor, counter: int | torch.Tensor
             ) -> torch.Tensor:
        h = _absorb(self._seed_hash, purpose)
        h = _absorb(h, counter)
        h = _absorb(h, rows.to(torch.int64))
        return _absorb(h, positions.to(torch.int64))

    def uniform(self, purpose: int, rows: torch.Tensor, positions: torch.Tensor, counter: int | torch.Tensor
                ) -> torch.Tensor:
        """One uniform per (row, position); `rows` and `positions` broadcast together.  `counter` may be a
        0-d device tensor (a compiled step's iteration), with the same draws as the int."""
        return _to_uniform(self._key(purpose, rows, positions, counter))

    def gumbel(self, rows: torch.Tensor, positions: torch.Tensor, vocab_size: int, purpose: int = GUMBEL,
               counter: int = 0) -> torch.Tensor:
        """Gumbel noise of shape broadcast(rows, positions) + (vocab,); by default the coupler's, fixed for each
        absolute position."""
        key = self._key(purpose, rows, positions, counter).unsqueeze(-1)
        vocab = torch.arange(vocab_size, dtype=torch.int64, device=self.device)
        u = _to_uniform(_mix32(_mix32(key ^ vocab)))
        return -torch.log(-torch.log(u))
