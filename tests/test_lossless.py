"""Losslessness by exact enumeration: every coupler, window, logits option, draft
initialisation and batch layout must reproduce the AR law of full sequences."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from scipy import stats

from scd_core import SamplerConfig, generate
from scd_core.windows import auto_window
from scd_core.decoding import couplers, engine
from scd_core.decoding.sampling import sample
from toy_models import TablePrefixModel

SAMPLES = 200_000
P_MIN = 1e-4  # deterministic seeds: a pass is reproducible, so a strict threshold costs nothing


def chi_square_pvalue(tokens: torch.Tensor, law: dict[tuple[int, ...], float]) -> float:
    """Chi-square of the sampled sequences against the exact law; bins expecting < 5 are pooled."""
    counts = collections.Counter(map(tuple, tokens.tolist()))
    n = tokens.shape[0]
    impossible = sum(c for seq, c in counts.items() if law.get(seq, 0.0) == 0.0)
    assert impossible == 0, f"{impossible} samples of sequences with probability 0"
    possible = [s for s, prob in law.items() if prob > 0]
    total = sum(law[s] for s in possible)
    expected = np.array([law[s] / total * n for s in possible])
    observed = np.array([counts.get(s, 0) for s in possible], dtype=float)
    small = expected < 5
    if small.any():
        expected = np.append(expected[~small], expected[small].sum())
        observed = np.append(observed[~small], observed[small].sum())
    return float(stats.chisquare(observed, expected).pvalue)


# (id, model kwargs, sampler kwargs, rows per shared cache): each coupler meets every
# option at least once; rows_per_cache 1 is batch-1 semantics, 2 and 3 share a cache.
CASES = [
    ("plain-w2-random", dict(vocab_size=3, num_tokens=5), dict(window=2, draft_init="random"), 1),
    ("cfg-temp-w3-left", dict(vocab_size=3, num_tokens=5, cfg=True),
     dict(window=3, cfg_scale=2.5, temperature=0.7, draft_init="left"), 2),
    ("topk-topp-w4-above", dict(vocab_size=4, num_tokens=6, grid=(2, 3)),
     dict(window=4, top_k=3, top_p=0.85, draft_init="above"), 3),
    ("forced-cfg-w4-random", dict(vocab_size=3, num_tokens=6, cfg=True, forced_tokens={2: 1, 5: 0}),
     dict(window=4, cfg_scale=1.5, draft_init="random"), 1),
    ("hot-w3-above-batch2", dict(vocab_size=5, num_tokens=4, grid=(2, 2), scale=0.5),
     dict(window=3, temperature=1.3, draft_init="above"), 2),
    # image codes are a sub-vocabulary (ids 7, 3, 5); each grid row ends with a forced non-code row-end id 9
    ("codes-rowend-cfg-topk-w4-above", dict(vocab_size=3, num_tokens=6, cfg=True, grid=(2, 3), code_ids=[7, 3, 5],
                                            forced_tokens={2: 9, 5: 9}),
     dict(window=4, cfg_scale=2.0, top_k=2, draft_init="above"), 2),
    # rows at their own pace regroup as they finish (top-k, CFG, above drafts from a row-end grid)
    ("rows-cfg-topk-w3-above", dict(vocab_size=4, num_tokens=6, cfg=True, grid=(2, 3), forced_tokens={2: 3}),
     dict(window=3, cfg_scale=2.0, top_k=2, draft_init="above"), 1),
    # a video of 3 frames of 1 x 2 after a context frame: drafts copied from one frame earlier
    ("video-w3-previous-frame", dict(vocab_size=3, num_tokens=6, grid=(3, 1, 2), prefix_tokens=[2, 1],
                                     code_ids=[4, 1, 2]),
     dict(window=3, draft_init="previous_frame"), 3),
    # a guidance scale that changes along the sequence (Lumina-mGPT 2.0's decays), 1 (no CFG) at one position
    ("scheduled-cfg-w3-above", dict(vocab_size=3, num_tokens=6, cfg=True, grid=(2, 3),
                                    cfg_factors=[3.0, 0.5, 2.0, 1.0, 0.25, 1.5]),
     dict(window=3, cfg_scale=1.0, draft_init="above"), 1),
    # guidance over three branches, weighed by the session (Janus-4o editing: full, part, uncond)
    ("three-branches-temp-w3-above", dict(vocab_size=3, num_tokens=6, grid=(2, 3), image_cfg=2.0),
     dict(window=3, cfg_scale=2.5, temperature=0.8, draft_init="above"), 1),
]
COUPLERS = list(couplers.NAMES)
WITH_ALPHA = couplers.names_where("alpha")
WITH_CANDIDATES = couplers.names_where("candidates")
REFUSING_BLOCK = [c.name for c in couplers.COUPLERS if c.reads_proposals and not c.block]


def sample_case(coupler: str, model_kwargs: dict, sampler_kwargs: dict, rows_per_cache: int, seed: int = 7,
                **extra):
    model = TablePrefixModel(seed=seed, rows_per_cache=rows_per_cache, **model_kwargs)
    config = SamplerConfig(coupler=coupler, seed=seed, **sampler_kwargs, **extra)
    result = generate(model, None, config, batch_size=SAMPLES - SAMPLES % 6)
    law = model.exact_law(cfg_scale=config.cfg_scale or 1.0, temperature=config.temperature or 1.0,
                          top_k=config.top_k, top_p=config.top_p or 1.0)
    return result, law


@pytest.mark.parametrize("coupler", COUPLERS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_output_law_equals_ar(coupler, case):
    _, model_kwargs, sampler_kwargs, rows_per_cache = case
    result, law = sample_case(coupler, model_kwargs, sampler_kwargs, rows_per_cache)
    assert chi_square_pvalue(result.tokens, law) > P_MIN


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_block_verification_output_law_equals_ar(case):
    _, model_kwargs, sampler_kwargs, rows_per_cache = case
    result, law = sample_case("independent", model_kwargs, sampler_kwargs, rows_per_cache, verification="block")
    assert chi_square_pvalue(result.tokens, law) > P_MIN


@pytest.mark.parametrize("coupler", REFUSING_BLOCK)
def test_block_verification_with_coupled_drafts_is_biased(coupler, monkeypatch):
    """Why SamplerConfig refuses it: the block decision looks at every draft, so a next draft coupled to its
    old value is no longer distributed as p given the decision.  The suite sees it (p ~ 1e-14 .. 1e-66)."""
    _, model_kwargs, sampler_kwargs, rows_per_cache = CASES[2]
    config_check = SamplerConfig.__post_init__
    monkeypatch.setattr(SamplerConfig, "__post_init__", lambda self: None)  # let the refused pairing through
    result, law = sample_case(coupler, model_kwargs, sampler_kwargs, rows_per_cache, verification="block")
    monkeypatch.setattr(SamplerConfig, "__post_init__", config_check)
    assert chi_square_pvalue(result.tokens, law) < 1e-6
    with pytest.raises(ValueError, match="verification"):
        SamplerConfig(coupler=coupler, verification="block")


# (case, candidates, window): on these 4-6-token sequences most trees hold more tokens than positions are left
CANDIDATE_CASES = [(CASES[0], 2, 2), (CASES[1], 3, 2), (CASES[2], 3, 2), (CASES[3], 2, 3), (CASES[5], 2, 2),
                   (CASES[6], 2, 3), (CASES[7], 2, 2), (CASES[8], 3, 3), (CASES[9], 2, 3)]


@pytest.mark.parametrize("coupler", WITH_CANDIDATES)
@pytest.mark.parametrize("case,candidates,window", CANDIDATE_CASES, ids=[c[0][0] for c in CANDIDATE_CASES])
def test_candidates_at_the_first_draft_are_lossless(coupler, case, candidates, window):
    """A tree of chains differing in the first draft, one picked by recursive rejection sampling."""
    _, model_kwargs, sampler_kwargs, rows_per_cache = case
    result, law = sample_case(coupler, model_kwargs, {**sampler_kwargs, "window": window}, rows_per_cache,
                              candidates=candidates)
    assert max(result.fed[1:]) > max(result.windows[1:])  # trees were fed
    assert chi_square_pvalue(result.tokens, law) > P_MIN


def tries_every_candidate_against_p(p, q, candidates, valid, u_accept, u_residual):
    """Wrong: each alternative is tested against p and q again instead of the residual left by the ones before."""
    chosen = torch.full(candidates.shape[:1], -1, dtype=torch.long)
    for m in range(candidates.shape[1]):
        c = candidates[:, m:m + 1]
        keep = valid[:, m] & (chosen < 0) & (u_accept[:, m] * q.gather(-1, c).squeeze(-1) < p.gather(-1, c).squeeze(-1))
        chosen = torch.where(keep, m, chosen)
    picked = candidates.gather(-1, chosen.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return chosen, torch.where(chosen >= 0, picked, sample((p - q).clamp_min(0) + 1e-12 * p, u_residual))


def test_enumeration_test_rejects_candidates_without_recursion(monkeypatch):
    monkeypatch.setattr(engine, "recursive_rejection", tries_every_candidate_against_p)
    result, law = sample_case("maximal", dict(vocab_size=4, num_tokens=6, scale=2.0),
                              dict(window=2, draft_init="random"), 1, candidates=3)
    assert chi_square_pvalue(result.tokens, law) < 1e-6


@pytest.mark.parametrize("coupler", WITH_ALPHA)
def test_alpha_mixing_is_lossless(coupler):
    result, law = sample_case(coupler, dict(vocab_size=3, num_tokens=5, cfg=True),
                              dict(window=3, cfg_scale=2.0, draft_init="random"), 1, alpha=0.5)
    assert chi_square_pvalue(result.tokens, law) > P_MIN


@pytest.mark.parametrize("coupler", COUPLERS)
def test_window_chosen_from_commit_counts_is_lossless(coupler, monkeypatch):
    """window="auto" with fixed costs: the widths (4, 1, 2, ...) follow the commit counts seen so far.

    The law stays exact because the width of a call is fixed before the call from earlier calls' commit
    counts only, and given that history a call is an ordinary fixed-width call, whose verification is
    exact for any width; drafts outside the window are re-initialised after every call, so a window that
    grows never feeds a draft without its recorded proposal.
    """
    monkeypatch.setattr(auto_window, "measure_costs", lambda call, widths: {1: 1.0, 2: 1.4, 4: 2.6})
    result, law = sample_case(coupler, dict(vocab_size=3, num_tokens=6, cfg=True, grid=(2, 3)),
                              dict(window="auto", cfg_scale=2.0, draft_init="above"), 2)
    assert len(set(result.windows[1:])) > 1
    assert chi_square_pvalue(result.tokens, law) > P_MIN


@pytest.mark.parametrize("coupler", ["maximal", "gumbel"])
def test_window_chosen_from_learned_costs_and_exploration_is_lossless(coupler, monkeypatch):
    """window="auto" with call costs that jump from call to call: the chooser learns them and explores every
    other call, so the widths move with the costs as well as the counts.  Still exact: the costs a call's width
    comes from are those of earlier calls, whatever they are."""
    monkeypatch.setattr(auto_window, "measure_costs", lambda call, widths: {1: 1.0, 2: 1.4, 4: 2.6})
    monkeypatch.setattr(auto_window, "EXPLORE_EVERY", 2)
    monkeypatch.setattr(auto_window, "EARLY_EVERY", 2)
    noise = torch.Generator().manual_seed(11)
    learned = []
    learn = auto_window.CallCosts.learn

    def jumpy(costs, width, seconds):  # the measured seconds replaced by a cost that jumps tenfold
        seconds = {1: 1.0, 2: 1.4, 4: 2.6}[width] * float(torch.empty(1).log_normal_(0, 1.2, generator=noise))
        learned.append((width, seconds))
        learn(costs, width, seconds)

    monkeypatch.setattr(auto_window.CallCosts, "learn", jumpy)
    result, law = sample_case(coupler, dict(vocab_size=3, num_tokens=6, cfg=True, grid=(2, 3)),
                              dict(window="auto", cfg_scale=2.0, draft_init="above"), 2)
    assert len(learned) == result.nfe - 1 and set(result.windows[1:]) == {1, 2, 4}  # every call after the prefill
    assert chi_square_pvalue(result.tokens, law) > P_MIN


def test_plain_ar_is_lossless():
    result, law = sample_case("maximal", dict(vocab_size=4, num_tokens=5), dict(window=1), 1)
    assert result.nfe == 5
    assert chi_square_pvalue(result.tokens, law) > P_MIN


class StoresOldProposalOnKeep(engine._Decoder):
    """The public reference's bug: a kept draft keeps the proposal it was drawn from."""

    def step(self, p, *args):
        self._before = (self.seq.clone(), self.proposals.clone(), self.committed.clone())
        return super().step(p, *args)

    def _next_proposals(self, p, shift, limit):
        super()._next_proposals(p, shift, limit)
        old_seq, old_q, old_committed = self._before
        source = (shift.unsqueeze(1) + self.slots[:limit]).clamp(max=min(p.shape[1], old_q.shape[1]) - 1)
        positions = self.committed.unsqueeze(1) + self.slots[:limit]
        kept = (self.seq.gather(1, positions) == old_seq.gather(1, positions)) & (source < p.shape[1] - 1)
        old = old_q.gather(1, source.unsqueeze(-1).expand(-1, -1, self.vocab))
        self.proposals[:, :limit] = torch.where(kept.unsqueeze(-1), old, self.proposals[:, :limit])


def test_enumeration_test_rejects_the_reference_bug(monkeypatch):
    """The test above has power: the known-wrong variant fails it by a wide margin."""
    monkeypatch.setattr(engine, "_Decoder", StoresOldProposalOnKeep)
    result, law = sample_case("maximal", dict(vocab_size=3, num_tokens=5, scale=2.0),
                              dict(window=4, draft_init="random"), 1)
    assert chi_square_pvalue(result.tokens, law) < 1e-6


def test_enumeration_test_sees_a_scale_put_at_the_wrong_positions(monkeypatch):
    """The scheduled-CFG cases have power: a schedule ignored, or a tree's chains scaled as if they were one
    window, fails them."""
    case = CASES[8]
    _, model_kwargs, sampler_kwargs, rows_per_cache = case
    monkeypatch.setattr(TablePrefixModel, "cfg_schedule", lambda self, scale: None)
    result, _ = sample_case("maximal", model_kwargs, sampler_kwargs, rows_per_cache)
    monkeypatch.undo()
    law = TablePrefixModel(seed=7, **model_kwargs).exact_law(cfg_scale=sampler_kwargs["cfg_scale"])
    assert chi_square_pvalue(result.tokens, law) < 1e-6
    monkeypatch.setattr(engine, "slot_positions", lambda committed, count, branches:
                        committed.unsqueeze(1) + torch.arange(count))
    result, law = sample_case("maximal", model_kwargs, sampler_kwargs, rows_per_cache, candidates=3)
    assert chi_square_pvalue(result.tokens, law) < 1e-6
