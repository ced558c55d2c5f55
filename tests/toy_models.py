"""A toy token model small enough to enumerate every sequence.

The logits of position j are an arbitrary random function of the whole prefix
x_0..x_{j-1} (a table row picked by a hash of j and the prefix), so the exact
AR law is a product of table lookups.  With `code_ids` the model samples a
sub-vocabulary of ids (logits over the codes only); forced ids need not be codes.  Sessions keep no cache beyond the fed tokens, so
rows may advance independently (`rows_per_cache` can be any divisor).
"""

from __future__ import annotations

import itertools
from typing import Any, Optional

import torch

from scd_core.models.families.janus import edit_guidance
from scd_core.decoding.sampling import Sampling, to_probs
from scd_core.bench.synthetic import admitted, feed_tokens, kept_branch


class TablePrefixModel:
    """Logits of position j = table[hash(j, x_0..x_{j-1})]: any prefix dependence, exactly reproducible."""

    HASH_BASE, HASH_PRIME = 1_000_003, 2_147_483_647

    def __init__(self, vocab_size: int = 3, num_tokens: int = 5, cfg: bool = False, seed: int = 0,
                 scale: float = 1.0, dtype: torch.dtype = torch.float32, grid: Optional[tuple[int, int]] = None,
                 forced_tokens: Optional[dict[int, int]] = None, rows_per_cache: Optional[int] = None,
                 table_rows: int = 1024, code_ids: Optional[list[int]] = None,
                 prefix_tokens: Optional[list[int]] = None, default_draft_init: Optional[str] = None,
                 cfg_factors: Optional[list[float]] = None, image_cfg: Optional[float] = None) -> None:
        self.vocab_size, self.num_tokens = vocab_size, num_tokens
        # Janus-4o editing's three branches (full, part, uncond), the part branch weighed by `image_cfg`
        self.image_cfg = image_cfg
        self.cfg_factors = cfg_factors  # a guidance scale per position: the configured one times these
        self.grid, self.forced_tokens, self.rows_per_cache = grid, forced_tokens, rows_per_cache
        self.code_ids = None if code_ids is None else torch.tensor(code_ids)
        self.prefix_tokens, self.default_draft_init = prefix_tokens, default_draft_init
        powers = [1]
        for _ in range(num_tokens - 1):
            powers.append(powers[-1] * self.HASH_BASE % self.HASH_PRIME)
        self.powers = torch.tensor(powers, dtype=torch.int64)
        gen = torch.Generator().manual_seed(seed)
        self.table = (torch.randn(table_rows, vocab_size, generator=gen, dtype=torch.float64) * scale).to(dtype)
        self.uncond_table = ((torch.randn(table_rows, vocab_size, generator=gen, dtype=torch.float64) * scale)
                             .to(dtype) if cfg or image_cfg is not None else None)
        self.part_table = ((torch.randn(table_rows, vocab_size, generator=gen, dtype=torch.float64) * scale)
                           .to(dtype) if image_cfg is not None else None)
        self.calls = 0

    def logits_for(self, tokens: torch.Tensor, positions: torch.Tensor):
        """Logits of `positions` (B, T) given the prefixes in tokens (B, N)."""
        positions = positions.clamp(max=self.num_tokens - 1)
        used = torch.arange(self.num_tokens).view(1, 1, -1) < positions.unsqueeze(-1)
        prefix = ((tokens[:, None, :self.num_tokens] + 1) * self.powers * used).sum(-1) % self.HASH_PRIME
        index = (prefix * 7919 + positions) % self.table.shape[0]
        uncond = None if self.uncond_table is None else self.uncond_table[index]
        if self.part_table is not None:
            return self.table[index], self.part_table[index], uncond
        return self.table[index], uncond

    def cfg_schedule(self, scale: float) -> Optional[torch.Tensor]:
        return None if self.cfg_factors is None else scale * torch.tensor(self.cfg_factors)

    def start(self, cond, batch_size: int) -> "TableSession":
        return TableSession(self, batch_size)

    def exact_law(self, cfg_scale: float = 1.0, **options: Any) -> dict[tuple[int, ...], float]:
        """Probability of every full sequence of ids under AR sampling from to_probs(...), with these sampler
        options (`sampling.Sampling`'s other fields: temperature, top_k, top_p, ...)."""
        codes = torch.tensor(list(itertools.product(range(self.vocab_size), repeat=self.num_tokens)))
        forced = self.forced_tokens or {}
        for position in forced:  # one representative per forced position; its id is then overwritten
            codes = codes[codes[:, position] == 0]
        seqs = codes.clone() if self.code_ids is None else self.code_ids[codes]
        for position, token in forced.items():
            seqs[:, position] = token
        cond, *rest, uncond = self.logits_for(seqs, torch.arange(self.num_tokens).expand(len(seqs), -1))
        if rest:  # the authors' three-way guidance, written as they write it
            cond = (cond + self.image_cfg * rest[0]) / (1 + self.image_cfg)
        schedule = self.cfg_schedule(cfg_scale)
        scale = cfg_scale if schedule is None else schedule.float().unsqueeze(-1)  # (T, 1): one per position
        p = to_probs(cond, uncond, Sampling(cfg_scale=scale, **options)).double()
        per_position = p.gather(-1, codes.unsqueeze(-1)).squeeze(-1)
        for position in forced:
            per_position[:, position] = 1.0
        probs = per_position.prod(-1)
        return {tuple(seq): float(prob) for seq, prob in zip(seqs.tolist(), probs)}


class TableSession:
    def __init__(self, model: TablePrefixModel, batch: int) -> None:
        self.model = model
        self.tokens = torch.zeros(batch, model.num_tokens, dtype=torch.long)
        self.length = torch.zeros(batch, dtype=torch.long)
        if model.rows_per_cache is not None:
            self.rows_per_cache = model.rows_per_cache
        if model.prefix_tokens is not None:
            self.prefix_tokens = torch.tensor([model.prefix_tokens])
        if model.image_cfg is not None:
            self.guidance = lambda cfg_scale: edit_guidance(cfg_scale, model.image_cfg)

    def prefill(self, tokens: Optional[torch.Tensor] = None):
        """With `tokens` (batch, K): fed after the (empty) prompt in the same call."""
        self.model.calls += 1
        self.prefilled = True
        if tokens is not None:
            self.tokens[:, :tokens.shape[1]] = tokens
            self.length += tokens.shape[1]
        return self.model.logits_for(self.tokens, self.length.unsqueeze(1))

    def admit(self, fresh: list["TableSession"], tokens: Optional[torch.Tensor] = None):
        """Go on with the rows of `fresh` (not prefilled) too: one call feeds `tokens` to this session's rows
        (when given) and gives the new rows' position-0 logits."""
        if tokens is None:
            fed, self.model.calls = None, self.model.calls + 1
        else:
            fed = self.forward(tokens)
        added = admitted(self, fresh)
        return fed, self.model.logits_for(self.tokens[-added:], torch.zeros(added, 1, dtype=torch.long))

    def forward(self, new: torch.Tensor, branches: int = 1):
        self.model.calls += 1
        logits, self.branch_tables = feed_tokens(self.tokens, self.length.unsqueeze(1), new, branches,
                                                 self.model.logits_for)
        self.length += new.shape[1]
        return logits

    def keep_branch(self, branch: torch.Tensor, width: int, branches: int) -> None:
        self.tokens = kept_branch(self.tokens, self.branch_tables, branch)

    def rewind(self, n) -> None:
        self.length -= n
        assert (self.length >= 0).all(), "rewound past the start"

    def keep_rows(self, index: torch.Tensor) -> None:
        self.tokens, self.length = self.tokens[index], self.length[index]
