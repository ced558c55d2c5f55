"""The automatic window (cost measurement, commit-count estimate, choice) and fixed-shape calls."""

from __future__ import annotations

import math

import pytest
import torch

from scd_core import SamplerConfig, auto_window, generate, load_model
from scd_core.auto_window import WindowChooser, measure_costs
from scd_core.bench.synthetic import GridModel
from toy_models import TablePrefixModel

FLAT = {1: 1.0, 2: 1.01, 4: 1.02, 8: 1.03}  # a wider call costs barely more


def test_no_counts_yet_is_optimistic_and_ties_go_to_the_narrower_width():
    assert WindowChooser(FLAT).choose() == 8
    assert WindowChooser({1: 1.0, 2: 2.0, 4: 4.0}).choose() == 1  # cost grows like the width: no gain


def test_commit_counts_set_the_width():
    chooser = WindowChooser({1: 1.0, 2: 1.1, 4: 1.2, 8: 1.6})
    for _ in range(20):
        chooser.observe(8, [0, 0, 0, 5])  # five rows, each rejected at its third slot
    assert chooser.expected_commits()[8] == pytest.approx(3.0, abs=0.05)
    assert chooser.choose() == 4  # 3 of 4 slots used; 8 costs a third more for barely more tokens


def test_counts_seen_at_one_width_are_scaled_to_the_others():
    """Drafts in a wider window are refined for more calls: commits grow like width ** REFINEMENT."""
    chooser = WindowChooser({w: 1.0 for w in (4, 8, 16, 32)})
    for _ in range(50):
        chooser.observe(8, [0, 0, 5])  # always rejected at the second slot: the counts alone say 2 anywhere
    expected = chooser.expected_commits()
    assert expected[8] == pytest.approx(2.0, abs=0.05)
    for width in (4, 16, 32):
        assert expected[width] == pytest.approx(2.0 * (width / 8) ** auto_window.REFINEMENT, abs=0.05)
    assert chooser.expected_commits(remaining=2)[32] == 2.0  # never more than the tokens left


def test_a_call_that_accepted_everything_is_censored_not_a_rejection():
    chooser = WindowChooser(FLAT)
    for _ in range(20):
        chooser.observe(4, [0, 0, 0, 0, 3])  # every draft accepted: K >= 4, nothing known beyond
    assert chooser.choose() == 8
    assert chooser.expected_commits()[8] == pytest.approx(8.0)


def test_the_estimate_recovers_a_geometric_law_from_censored_counts():
    hazard, calls = 0.2, 4000
    u = torch.rand(calls, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ks = (torch.log(u) / math.log(1 - hazard)).floor().long() + 1  # P(K > k) = (1 - hazard)^k
    chooser = WindowChooser({1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0})
    for width, k in zip((4, 16) * (calls // 2), ks.tolist()):  # the width-4 calls are censored at 4
        counts = [0] * (width + 1)
        counts[min(k, width)] = 1
        chooser.observe(width, counts)
    survival = chooser.survival()
    for width in (4, 8, 16):
        truth = (1 - (1 - hazard) ** width) / hazard
        assert sum(survival[:width]) == pytest.approx(truth, rel=0.08), width


def test_the_last_calls_need_no_more_than_the_rest():
    assert WindowChooser(FLAT).choose(remaining=3) == 4
    assert WindowChooser(FLAT).choose(remaining=1) == 1


def test_costs_are_timed_interleaved_and_a_stall_cannot_make_a_width_dearer(monkeypatch):
    clock = [0.0]
    seconds = {1: 1.0, 2: 1.5, 4: 2.0, 8: 3.0}
    calls = []

    def call(width):
        calls.append(width)
        stall = 100.0 if width == 2 else 0.0  # every timing of width 2 hits a stall
        clock[0] += seconds[width] + stall
        return torch.zeros(1)

    monkeypatch.setattr(auto_window.time, "perf_counter", lambda: clock[0])
    costs = measure_costs(call, [1, 2, 4, 8], rounds=2)
    assert calls == [8, 1, 2, 4, 8, 1, 2, 4, 8]  # one warm-up, then passes over every width
    assert costs == {1: 1.0, 2: 2.0, 4: 2.0, 8: 3.0}


def test_costs_are_measured_once_per_model_and_the_timed_calls_leave_no_trace(monkeypatch):
    measured = []
    real = auto_window.measure_costs

    def fixed(call, widths):  # the real timed calls, but deterministic costs
        measured.append(list(widths))
        real(call, widths)
        return {w: 1.0 + 0.3 * w for w in widths}

    monkeypatch.setattr(auto_window, "measure_costs", fixed)
    model = TablePrefixModel(vocab_size=8, num_tokens=40, grid=(5, 8), table_rows=4096)
    config = SamplerConfig(window="auto", seed=2)
    first = generate(model, None, config, batch_size=3)
    calls_first, model.calls = model.calls, 0
    second = generate(model, None, config, batch_size=3)
    assert measured == [[1, 2, 4, 8, 16, 32]]  # widths up to the sequence length; the second run is cached
    assert calls_first == first.nfe + 1 + 2 * 6 and model.calls == second.nfe
    assert torch.equal(first.tokens, second.tokens) and first.windows == second.windows
    assert first.windows[0] == 1 and len(first.windows) == first.nfe


def test_auto_windows_follow_the_commit_counts_and_faithful_keeps_the_ar_tokens(monkeypatch):
    monkeypatch.setattr(auto_window, "measure_costs", lambda call, widths: {w: 1.0 + 0.1 * w for w in widths})
    model = TablePrefixModel(vocab_size=16, num_tokens=40, dtype=torch.float64, grid=(5, 8), table_rows=4096)
    ar = generate(model, None, SamplerConfig(coupler="faithful", window=1, seed=3), batch_size=2)
    auto = generate(model, None, SamplerConfig(coupler="faithful", window="auto", seed=3), batch_size=2)
    assert torch.equal(auto.tokens, ar.tokens)
    assert len(set(auto.windows[1:])) > 1  # the first guess was revised
    assert auto.nfe < ar.nfe


@pytest.mark.parametrize("coupler", ["maximal", "gumbel", "independent", "faithful"])
@pytest.mark.parametrize("window", [7, "auto"])
def test_fixed_shapes_give_the_same_tokens_with_one_call_width_per_window(coupler, window, monkeypatch):
    monkeypatch.setattr(auto_window, "measure_costs", lambda call, widths: {w: 1.0 + 0.05 * w for w in widths})
    model = GridModel(rows=6, cols=8, vocab_size=64, sharpness=0.5)
    widths = []
    start = model.start

    def recording_start(cond, batch_size):
        session = start(cond, batch_size)
        forward = session.forward
        session.forward = lambda tokens: (widths.append(tokens.shape[1]), forward(tokens))[1]
        return session

    monkeypatch.setattr(model, "start", recording_start)
    config = SamplerConfig(coupler=coupler, window=window, seed=5)
    plain = generate(model, None, config, batch_size=2)
    plain_widths, widths[:] = list(widths), []
    fixed = generate(model, None, SamplerConfig(**{**config.__dict__, "fixed_shapes": True}), batch_size=2)
    assert torch.equal(fixed.tokens, plain.tokens) and fixed.windows == plain.windows
    if window == "auto":
        assert set(widths) <= set(auto_window.CANDIDATES)  # the chooser's widths only, never a remainder
    else:
        assert set(widths) == {7} and min(plain_widths) < 7  # without the option the last call narrows


def test_fixed_shapes_on_a_real_kv_cache():
    """The demo's LlamaGen adapter: committed tokens fed again overwrite their cache slots with the same keys."""
    model = load_model("demo")
    cond = model.encode("3")
    for window in (16, 24):
        config = SamplerConfig(window=window, seed=1)
        plain = generate(model, cond, config, batch_size=2)
        fixed = generate(model, cond, SamplerConfig(**{**config.__dict__, "fixed_shapes": True}), batch_size=2)
        assert torch.equal(fixed.tokens, plain.tokens), window
        assert plain.windows[-1] < window  # the run ended on a narrower call that the option padded


@pytest.mark.parametrize("value", ["fast", 0, 1.5])
def test_window_is_auto_or_a_number(value):
    with pytest.raises(ValueError, match="window must be 'auto' or an integer"):
        SamplerConfig(window=value)


def test_fixed_shapes_is_a_flag():
    with pytest.raises(ValueError, match="fixed_shapes"):
        SamplerConfig(fixed_shapes=1)
    assert SamplerConfig(window="auto", fixed_shapes=True).window == "auto"


def test_without_counts_a_call_is_expected_to_commit_its_width_capped_by_the_rest():
    chooser = WindowChooser({1: 1.0, 64: 2.0})
    assert chooser.expected_commits() == {1: 1.0, 64: 64.0}
    assert math.isclose(chooser.expected_commits(remaining=10)[64], 10.0)


def test_with_candidates_the_costs_are_timed_on_trees_and_kept_apart(monkeypatch):
    """A call of width L with k candidates feeds 1 + k (L - 1) tokens: the auto window must price that."""
    fed = []
    real = auto_window.measure_costs

    def recording(call, widths):
        for width in widths:
            fed.append((width, call(width).shape[1]))
        return real(call, widths)

    monkeypatch.setattr(auto_window, "measure_costs", recording)
    model = TablePrefixModel(vocab_size=8, num_tokens=40, grid=(5, 8), table_rows=4096)
    tree = generate(model, None, SamplerConfig(window="auto", candidates=3, seed=2), batch_size=2)
    assert fed == [(w, 1 + 3 * (w - 1)) for w in (1, 2, 4, 8, 16, 32)]
    generate(model, None, SamplerConfig(window="auto", seed=2), batch_size=2)
    assert fed[6:] == [(w, w) for w in (1, 2, 4, 8, 16, 32)]  # measured again: not the trees' costs
    same = generate(model, None, SamplerConfig(window="auto", candidates=3, seed=2), batch_size=2)
    assert len(fed) == 12 and torch.equal(same.tokens, tree.tokens)  # the trees' costs were kept
