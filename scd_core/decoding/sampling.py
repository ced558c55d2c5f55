"""From raw logits to the sampling distribution p, and the draws made from it.

Everything the engine verifies or couples operates on `to_probs(...)` output:
float32 probabilities after CFG, temperature, top-k and top-p.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence, Union

import torch


Number = Union[float, torch.Tensor]


@dataclass(kw_only=True)
class Sampling:
    """What `to_probs` applies to the logits, by name (`sampler_options.OPTIONS` declares each).

    `cfg_scale` is one number, or a float32 tensor of scales per position that broadcasts against the logits
    ((batch, T, 1) or (T, 1)).  Every number may also be a device tensor (`sampler_tensors`): the same
    probabilities, and a compiled step is not specialised on its value.  (Not frozen: a kept CUDA graph's
    memory is put in place of a new generation's tensors, `graph_state`.)
    """

    cfg_scale: Number = 1.0
    temperature: Number = 1.0
    top_k: Union[int, torch.Tensor, None] = None
    top_p: Number = 1.0
    keep_at_least: int = 1  # the fewest tokens top-k and top-p keep (the model's `min_tokens_kept`)

    def with_scale(self, cfg_scale: Number) -> "Sampling":
        """These settings with another guidance scale (a schedule's, per position)."""
        return replace(self, cfg_scale=cfg_scale)


def to_probs(cond: torch.Tensor, uncond: Optional[torch.Tensor], sampling: Sampling) -> torch.Tensor:
    """Raw (batch, T, V) logits to float32 probabilities (batch, T, V) under `sampling`."""
    cfg_scale, temperature, top_k, top_p = sampling.cfg_scale, sampling.temperature, sampling.top_k, sampling.top_p
    keep = sampling.keep_at_least
    if keep > 1 and top_k is not None:  # transformers' warpers' min_tokens_to_keep: k is at least `keep`
        top_k = top_k.clamp_min(keep) if isinstance(top_k, torch.Tensor) else max(top_k, keep)
    logits = cond.float()
    if uncond is not None and (isinstance(cfg_scale, torch.Tensor) or cfg_scale != 1.0):
        logits = torch.lerp(uncond.float(), logits, cfg_scale)  # u + s (c - u)
    logits = logits / temperature
    if isinstance(top_k, torch.Tensor):  # k as an index into the sorted logits: no shape follows k
        kth = torch.sort(logits, dim=-1, descending=True).values.index_select(-1, top_k - 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    elif top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if isinstance(top_p, torch.Tensor) or top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # keep the smallest prefix of the sorted tokens whose mass reaches top_p
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p
        if keep > 1:
            drop_sorted[..., :keep] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def branch_weights(guidance: Callable[[float], Sequence[float]], cfg_scale: float, device: torch.device
                   ) -> torch.Tensor:
    """A session's `guidance(cfg_scale)` (the weight of each branch's logits) as a float32 device tensor; the
    weights must sum to 1, so that guidance moves the logits and never scales them (which would act as a
    temperature)."""
    weights = [float(w) for w in guidance(cfg_scale)]
    if len(weights) < 1 or not all(math.isfinite(w) for w in weights) or abs(sum(weights) - 1) > 1e-6:
        raise ValueError(f"session.guidance({cfg_scale}) must give finite branch weights summing to 1, got {weights}")
    return torch.tensor(weights, dtype=torch.float32, device=device)


def weighted_logits(logits: Sequence[torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
    """The sum of the branches' (batch, T, V) logits, each times its weight, in float32 on the weights' device."""
    if len(logits) != weights.numel():
        raise ValueError(f"the session gave {len(logits)} branches of logits and {weights.numel()} weights")
    return torch.einsum("k,k...->...", weights, torch.stack([branch.to(weights.device).float() for branch in logits]))


def sampler_tensors(sampling: Sampling, vocab: int, device: torch.device) -> Sampling:
    """`to_probs`'s numbers as float32 / int64 device tensors (0-d; top-k's of shape (1,)), so that one compiled
    or captured step serves every value.  A setting that changes nothing stays a host constant (no CFG at
    1, no top-k at None or the whole vocabulary, no top-p at 1): whether a step applies it is a shape, and
    skipping it keeps the probabilities bit-equal to before.  A field not listed here carries over as it is, a
    host constant: the same probabilities, but a graph captured with one value serves that value only."""
    number = lambda value: torch.tensor(value, dtype=torch.float32, device=device)
    top_k = sampling.top_k
    return replace(sampling, cfg_scale=1.0 if sampling.cfg_scale == 1.0 else number(sampling.cfg_scale),
                   temperature=number(sampling.temperature),
                   top_k=None if top_k is None or top_k >= vocab else torch.tensor([top_k], dtype=torch.long,
                                                                                    device=device),
                   top_p=1.0 if sampling.top_p >= 1.0 else number(sampling.top_p))


def sample(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from non-negative (unnormalised) weights (..., V) with uniforms u (...) in (0, 1).

    The first index whose CDF reaches u * total always has positive weight, and
    u < 1 keeps the target at or below the total even after rounding.
    """
    cdf = torch.cumsum(weights, dim=-1)
    target = (u * cdf[..., -1]).unsqueeze(-1)
    index = torch.searchsorted(cdf, target).squeeze(-1)
    return index.clamp(max=weights.shape[-1] - 1)


def gumbel_argmax(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """argmax_v(log p(v) + g(v)): a draw from p when g is fresh Gumbel noise."""
    return torch.argmax(torch.log(probs) + noise, dim=-1)


def modified_rejection(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, u_accept: torch.Tensor,
                       u_residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep `draft` (drawn from q) with probability min(1, p/q), else draw from norm(max(0, p - q)).

    Returns (accepted mask, resulting token); the token is distributed as p.
    """
    p_x = p.gather(-1, draft.unsqueeze(-1)).squeeze(-1)
    q_x = q.gather(-1, draft.unsqueeze(-1)).squeeze(-1)
    accepted = u_accept * q_x < p_x
    residual = (p - q).clamp_min(0.0)
    # p == q leaves no residual mass; rejection is then impossible, but stay well defined
    empty = residual.sum(-1, keepdim=True) <= 0
    residual = torch.where(empty, p, residual)
    return accepted, torch.where(accepted, draft, sample(residual, u_residual))


def without_replacement(q: torch.Tensor, first: torch.Tensor, count: int, noise: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` more draws from q (B, V) after `first` (B,), each from q without the tokens drawn before it.

    Gumbel-top-k on log q with fresh noise (B, V) is exactly sequential sampling without replacement.
    Returns (tokens (B, count), valid (B, count)): a draw is invalid once q has no mass left.
    """
    scores = (torch.log(q) + noise).scatter(-1, first.unsqueeze(-1), float("-inf"))
    top = torch.topk(scores, count, dim=-1)
    return top.indices, torch.isfinite(top.values)


def recursive_rejection(p: torch.Tensor, q: torch.Tensor, candidates: torch.Tensor, valid: torch.Tensor,
                        u_accept: torch.Tensor, u_residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick at most one of several candidates for one position so that the result is distributed as p (B, V).

    candidates (B, k): the first drawn from q, each later one from q without the earlier ones (`valid` False
    where none was left).  Candidate m is kept with probability min(1, r_m(c)/Q_m(c)), r_1 = p, Q_1 = q; on
    rejection r_{m+1} = norm(max(0, r_m - Q_m)) and Q_{m+1} = Q_m without c, renormalised.  Each stage is
    modified rejection sampling of r_m from a candidate distributed as Q_m given everything before it, so the
    output of stage m is distributed as r_m; after the last stage the token is drawn from the final residual.
    Returns (chosen (B,) index of the kept candidate or -1, token (B,)).
    """
    r, proposal = p, q / q.sum(-1, keepdim=True)
    chosen = torch.full(candidates.shape[:1], -1, dtype=torch.long, device=p.device)
    for m in range(candidates.shape[1]):
        c = candidates[:, m:m + 1]
        open_ = valid[:, m] & (chosen < 0)
        keep = open_ & (u_accept[:, m] * proposal.gather(-1, c).squeeze(-1) < r.gather(-1, c).squeeze(-1))
        chosen = torch.where(keep, m, chosen)
        rejected = (open_ & ~keep).unsqueeze(-1)
        residual = (r - proposal).clamp_min(0.0)
        mass = residual.sum(-1, keepdim=True)
        r = torch.where(rejected & (mass > 0), residual / mass.clamp_min(1e-30), r)
        rest = proposal.scatter(-1, c, 0.0)
        rest_mass = rest.sum(-1, keepdim=True)
        proposal = torch.where(rejected, rest / rest_mass.clamp_min(1e-30), proposal)
    picked = candidates.gather(-1, chosen.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return chosen, torch.where(chosen >= 0, picked, sample(r, u_residual))


def block_verify(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, free: torch.Tensor, eta: torch.Tensor,
                 u_residual: torch.Tensor, length: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification (Sun et al., ICLR 2025): accept a prefix of the drafts by a joint rule.

    p: (B, m+1, V) target laws of the m draft slots and the bonus slot; q: (B, m, V) proposals;
    draft: (B, m) code indices; free: (B, m+1) False where a slot is forced (p = q = one token there);
    eta, u_residual: (B, m+1) uniforms of their own stream.
    The weight of accepting the first i drafts is w_i = min(1, w_{i-1} p(x_i) / q(x_i)), w_0 = 1.  Stopping
    after i drafts emits a token from norm(max(0, w_i p_{i+1} - q_{i+1})) (p itself after all m); the stop is
    the largest i whose eta_i <= h_i, h_i = S_i / (S_i + 1 - w_i) with S_i that residual's mass, h_m = w_m.
    Never accepts fewer drafts in expectation than token-wise verification, and the output law is exact.
    `length` (B,) <= m ends each row's block after that many drafts (the rest of the window lies past the
    row's last position), so a row's decision does not depend on how wide the batch's window is.
    Returns (tau (B,) drafts accepted, replacement (B,) the token emitted at slot tau).
    """
    m = draft.shape[1]
    p_x = p[:, :m].gather(-1, draft.unsqueeze(-1)).squeeze(-1)
    q_x = q.gather(-1, draft.unsqueeze(-1)).squeeze(-1)
    log_ratio = torch.where(free[:, :m], torch.log(p_x) - torch.log(q_x), torch.zeros_like(p_x))
    # w_i = min(1, w_{i-1} r_i) is a clamped cumulative sum in log space: c_i - max_{k<=i} c_k, c_0 = 0
    c = torch.cat([log_ratio.new_zeros(log_ratio.shape[0], 1), log_ratio.cumsum(1)], dim=1)
    w = torch.exp(c - c.cummax(1).values)                      # (B, m+1): w_0 .. w_m
    residual = (w[:, :m].unsqueeze(-1) * p[:, :m] - q).clamp_min(0.0)
    mass = residual.sum(-1)                                    # S_0 .. S_{m-1}
    denominator = mass + 1.0 - w[:, :m]
    h = torch.where(free[:, :m] & (denominator > 0), mass / denominator.clamp_min(1e-30), torch.zeros_like(mass))
    h = torch.cat([h, w[:, m:]], dim=1)
    index = torch.arange(m + 1, device=p.device)
    end = torch.full_like(h[:, 0], m, dtype=torch.long) if length is None else length
    h = torch.where(index == end.unsqueeze(1), w, torch.where(index < end.unsqueeze(1), h, 0.0))
    h[:, 0] = 0.0  # stopping before the first draft is what happens when no later index passes
    passes = eta <= h
    tau = torch.where(passes, index, torch.zeros_like(index)).amax(1)
    rows = torch.arange(p.shape[0], device=p.device)
    at_stop = torch.where((tau == end).unsqueeze(1), p[rows, tau],
                          torch.cat([residual, p[:, m:]], dim=1)[rows, tau])  # (B, V)
    empty = at_stop.sum(-1, keepdim=True) <= 0                 # p == q where the rule stopped: cannot happen
    at_stop = torch.where(empty, p[rows, tau], at_stop)
    return tau, sample(at_stop, u_residual[rows, tau])
