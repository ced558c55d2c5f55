"""Counter-based randomness: every draw is a hash of (seed, purpose, counter, row, position).

Nothing is stored and no generator state is threaded through the loop, so a
draw depends only on what it is for: results do not change with the device, the
order of rows, or (for position-keyed draws) the window size.  Each image row
has a seed of its own (row i of a batch with seed s draws with seed s + i) and
counts its own calls, so its draws do not depend on its batch or on when it
joined one; the row entry of the key stays 0, which keeps every seed's image.  The hash is
a lowbias32-style integer finaliser in int64 lanes whose multipliers are below
2**31, so no product overflows and CPU and GPU give identical bits.
"""

from __future__ import annotations

from typing import Sequence

import torch

M32 = 0xFFFFFFFF

# What a draw is for; each purpose gets its own independent stream.  The numbers are part of every seed's
# image: 8 and 9 belonged to the removed draft_mix and stay unused, so the other streams keep their draws.
ACCEPT, RESIDUAL, FRESH, ALPHA, INIT, GUMBEL, BLOCK, BLOCK_RESIDUAL = range(8)
CANDIDATE, CANDIDATE_ACCEPT, CANDIDATE_RESIDUAL = 10, 11, 12
SEQUENCE = 13  # the tokens an interleaved story samples outside its images (text, size digits)


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


def seed_keys(seeds: Sequence[int], device: torch.device) -> torch.Tensor:
    """(rows, 1) hashes of each row's seed (0 .. 2**64 - 1): where that row's draws start."""
    seeds = [seed % 2**64 for seed in seeds]
    low = torch.tensor([seed & M32 for seed in seeds], dtype=torch.int64, device=device)
    high = torch.tensor([seed >> 32 for seed in seeds], dtype=torch.int64, device=device)
    return _mix32(_mix32(low) ^ high).unsqueeze(1)


class KeyedRandom:
    """Uniform and Gumbel draws keyed by (row seed, purpose, counter, position).

    `keys` (rows, 1) are the rows' `seed_keys`; `counters` (rows, 1) or an int count what the rows did before
    (their calls); both broadcast with `positions`.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def _key(self, purpose: int, keys: torch.Tensor, positions: torch.Tensor,
             counter: torch.Tensor | int) -> torch.Tensor:
        h = _absorb(keys, purpose)
        h = _absorb(h, counter)
        h = _absorb(h, 0)  # the row: every row has its own seed instead
        return _absorb(h, positions.to(torch.int64))

    def uniform(self, purpose: int, keys: torch.Tensor, positions: torch.Tensor,
                counter: torch.Tensor | int) -> torch.Tensor:
        """One uniform per (row, position); `counter` may be a device tensor (a compiled step's calls), with
        the same draws as the int."""
        return _to_uniform(self._key(purpose, keys, positions, counter))

    def gumbel(self, keys: torch.Tensor, positions: torch.Tensor, vocab_size: int, purpose: int = GUMBEL,
               counter: torch.Tensor | int = 0) -> torch.Tensor:
        """Gumbel noise of shape broadcast(keys, positions) + (vocab,); by default the coupler's, fixed for each
        absolute position."""
        key = self._key(purpose, keys, positions, counter).unsqueeze(-1)
        vocab = torch.arange(vocab_size, dtype=torch.int64, device=self.device)
        u = _to_uniform(_mix32(_mix32(key ^ vocab)))
        return -torch.log(-torch.log(u))
