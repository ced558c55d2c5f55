"""Engine behaviour beyond the output law: determinism, statistics, bad input, cancel."""

from __future__ import annotations

import pytest
import torch

from scd_core import GenerationCancelled, ModelOutputError, SamplerConfig, generate
from scd_core.decoding import engine
from scd_core.bench.synthetic import GridModel
from toy_models import TablePrefixModel


def grid_model(**kwargs) -> GridModel:
    return GridModel(rows=6, cols=8, vocab_size=64, **kwargs)


@pytest.mark.parametrize("draft_init", ["random", "left", "above"])
def test_faithful_gives_the_window_1_tokens_for_every_window(draft_init):
    model = TablePrefixModel(vocab_size=16, num_tokens=40, dtype=torch.float64, grid=(5, 8), table_rows=4096,
                             scale=1.0)
    ar = generate(model, None, SamplerConfig(coupler="faithful", window=1, seed=3), batch_size=4)
    for window in range(2, 17):
        jacobi = generate(model, None, SamplerConfig(coupler="faithful", window=window, seed=3,
                                                     draft_init=draft_init), batch_size=4)
        assert torch.equal(jacobi.tokens, ar.tokens), f"window {window}"
        assert jacobi.nfe < ar.nfe


@pytest.mark.parametrize("window", [1, 16])
def test_rows_do_not_depend_on_batch_size_or_neighbours(window):
    """Rows advance at their own pace and leave the batch when done; none of it changes a row's tokens."""
    model = grid_model()
    alone = generate(model, None, SamplerConfig(window=window, seed=11), batch_size=1)
    batched = generate(model, None, SamplerConfig(window=window, seed=11), batch_size=3)
    assert torch.equal(batched.tokens[:1], alone.tokens) and batched.nfe >= alone.nfe
    assert not torch.equal(batched.tokens[1], batched.tokens[0])


def test_finished_rows_leave_the_batch():
    """Rows at their own pace: once half are done the session keeps only the others.  Faithful decoding shows
    the bookkeeping is right: every row still gets its window-1 tokens, and the callback sees the whole batch."""
    model = TablePrefixModel(vocab_size=16, num_tokens=40, dtype=torch.float64, grid=(5, 8), table_rows=4096,
                             rows_per_cache=1)
    ar = generate(model, None, SamplerConfig(coupler="faithful", window=1, seed=3), batch_size=6)
    fed, seen = [], []
    start = model.start

    def recording_start(cond, batch_size):
        session = start(cond, batch_size)
        forward = session.forward
        session.forward = lambda tokens: fed.append(tokens.shape[0]) or forward(tokens)
        return session

    model.start = recording_start
    fast = generate(model, None, SamplerConfig(coupler="faithful", window=4, seed=3, draft_init="left"),
                    batch_size=6, callback=seen.append)
    assert torch.equal(fast.tokens, ar.tokens)
    assert all(stats.tokens.shape == (6, stats.total) for stats in seen)
    assert fed[0] == 6 and fed[-1] <= 3 and fed == sorted(fed, reverse=True)


def test_statistics_add_up_and_callback_sees_every_iteration():
    model = grid_model(sharpness=0.5)
    seen = []
    result = generate(model, None, SamplerConfig(window=16, seed=0), batch_size=2, callback=seen.append)
    assert sum(result.committed) == model.num_tokens
    assert len(result.committed) == len(seen) == result.nfe < model.num_tokens
    assert [s.iteration for s in seen] == list(range(result.nfe))
    assert [s.total for s in seen][-1] == model.num_tokens
    assert all(s.tokens.shape == (2, s.total) for s in seen)
    assert all(len(s.acceptance) <= 15 and all(0 <= a <= 1 for a in s.acceptance) for s in seen)
    assert seen[-1].tokens.cpu().equal(result.tokens)


@pytest.mark.parametrize("field,value", [
    ("coupler", "greedy"), ("window", 0), ("window", 2000), ("window", 2.5), ("cfg_scale", -1.0),
    ("cfg_scale", float("nan")), ("temperature", 0.0), ("temperature", -1.0), ("top_k", 0), ("top_k", 1.5),
    ("top_p", 0.0), ("top_p", 1.5), ("seed", -1), ("seed", 2**64), ("draft_init", "diagonal"),
    ("alpha", 1.5), ("alpha", -0.1), ("candidates", 0), ("candidates", 9), ("candidates", 1.0),
])
def test_invalid_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplerConfig(**{field: value})


def test_alpha_needs_a_coupling_coupler():
    with pytest.raises(ValueError, match="alpha"):
        SamplerConfig(coupler="independent", alpha=0.5)


def test_candidates_need_token_verification_a_coupler_that_verifies_and_a_tree_session():
    for settings in (dict(coupler="faithful"), dict(coupler="independent", verification="block"),
                     dict(coupler="maximal", fixed_shapes=True)):
        with pytest.raises(ValueError, match="candidates"):
            SamplerConfig(candidates=2, **settings)

    class ChainOnly(GridModel):
        def start(self, cond, batch_size):
            session = super().start(cond, batch_size)
            session.keep_branch = None  # a session that cannot score a tree
            return session

    with pytest.raises(ValueError, match="candidates=2 needs a model whose session scores a tree"):
        generate(ChainOnly(rows=4, cols=4, vocab_size=16), None, SamplerConfig(coupler="maximal", candidates=2))


def test_invalid_batch_size():
    with pytest.raises(ValueError, match="batch_size"):
        generate(grid_model(), None, SamplerConfig(), batch_size=0)


class BrokenSession:
    def __init__(self, logits):
        self.logits = logits

    def prefill(self):
        return self.logits, None

    def forward(self, tokens):
        return self.logits, None

    def rewind(self, n):
        pass


class BrokenModel:
    vocab_size, num_tokens = 8, 10

    def __init__(self, logits):
        self.logits = logits

    def start(self, cond, batch_size):
        return BrokenSession(self.logits)


def test_wrong_logits_shape_is_reported():
    with pytest.raises(ModelOutputError, match=r"shape \(1, 1, 7\).*expected \(1, 1, 8\)"):
        generate(BrokenModel(torch.zeros(1, 1, 7)), None, SamplerConfig())


def test_nan_logits_are_reported():
    with pytest.raises(ModelOutputError, match="NaN"):
        generate(BrokenModel(torch.full((1, 1, 8), float("nan"))), None, SamplerConfig())


def test_cancel_stops_promptly_and_the_next_run_is_unaffected():
    model = grid_model(sharpness=0.5)
    reference = generate(model, None, SamplerConfig(window=4, seed=5))
    calls = []

    def cancel_after_three():
        calls.append(1)
        return len(calls) > 3

    with pytest.raises(GenerationCancelled, match="cancelled after"):
        generate(model, None, SamplerConfig(window=4, seed=5), should_cancel=cancel_after_three)
    assert len(calls) == 4  # polled once per iteration, stopped at the first True
    again = generate(model, None, SamplerConfig(window=4, seed=5))
    assert torch.equal(again.tokens, reference.tokens)


@pytest.mark.parametrize("coupler, options, batch", [
    ("gumbel", dict(window=12), 2), ("faithful", dict(window=12), 2),
    ("gumbel", dict(window="auto", candidates=2), 5), ("faithful", dict(window=9, fixed_shapes=True), 3)])
@pytest.mark.usefixtures("unlearned_auto_window")  # compares two automatic runs on one model
def test_reused_window_noise_equals_fresh_noise(coupler, options, batch, monkeypatch):
    """Each row reuses its window's Gumbel noise (rows at their own pace, widths that change, rows dropped once
    half are done); the result must equal hashing the whole window anew every call."""
    model = grid_model(sharpness=0.5)
    config = SamplerConfig(coupler=coupler, seed=4, **options)
    reused = generate(model, None, config, batch_size=batch)
    original = engine._Decoder.gumbel
    monkeypatch.setattr(engine._Decoder, "gumbel",
                        lambda self, positions, max_shift: original(self, positions, 10**9))  # all new
    fresh = generate(model, None, config, batch_size=batch)
    assert torch.equal(reused.tokens, fresh.tokens)
    assert reused.nfe == fresh.nfe < model.num_tokens
    assert reused.windows == fresh.windows


@pytest.mark.parametrize("coupler, draft_init, batch", [
    ("maximal", "above", 3), ("gumbel", "random", 2), ("independent", "left", 1)])
def test_drafting_only_a_calls_width_equals_drafting_the_whole_window(coupler, draft_init, batch, monkeypatch):
    """A call drafts only its own width's slots and a wider call drafts the rest (`_Decoder.grow`); with widths
    that move every few calls (a fixed cost profile, explorations) the tokens equal drafting every slot of the
    widest window after every call."""
    from scd_core.windows import auto_window

    model = grid_model(sharpness=0.5)
    config = SamplerConfig(coupler=coupler, draft_init=draft_init, seed=6, window="auto")

    def run():
        auto_window.remember_costs(model, batch, {1: 1.0, 2: 1.3, 4: 1.7, 8: 2.5, 16: 4.0, 32: 7.0})
        return generate(model, None, config, batch_size=batch)

    lazy = run()
    original = engine._Decoder._init_new_drafts
    monkeypatch.setattr(engine._Decoder, "_init_new_drafts",
                        lambda self, carried, limit: original(self, carried, self.window))
    whole = run()
    assert torch.equal(lazy.tokens, whole.tokens)
    assert lazy.windows == whole.windows
    assert len(set(lazy.windows[1:])) >= 3  # the widths did move


class RepeatingVideo:
    """Every frame repeats the one before it (the context frame for the first), through a sub-vocabulary."""

    vocab_size, grid = 4, (4, 2, 3)
    num_tokens = 24
    code_ids = torch.tensor([10, 11, 12, 13])
    context = torch.tensor([[12, 10, 13, 11, 11, 12]])

    def start(self, cond, batch_size):
        model = self

        class Session:
            prefix_tokens = model.context

            def __init__(self):
                self.fed = model.context.expand(batch_size, -1).clone()  # context frame, then generated tokens

            def logits(self, positions):
                # the token one frame (6 positions) before generated position j sits at fed[:, j]
                earlier = self.fed.gather(1, positions)
                return 50.0 * torch.nn.functional.one_hot(earlier - 10, 4).float(), None

            def prefill(self):
                return self.logits(torch.zeros(batch_size, 1, dtype=torch.long))

            def forward(self, tokens):
                start = self.fed.shape[1] - 6  # generated position of tokens[:, 0]
                self.fed = torch.cat([self.fed, tokens], dim=1)
                return self.logits(start + 1 + torch.arange(tokens.shape[1]).expand(batch_size, -1))

            def rewind(self, n):
                self.fed = self.fed[:, :self.fed.shape[1] - n]

        return Session()


def test_previous_frame_drafts_copy_one_frame_earlier_context_included():
    model = RepeatingVideo()
    result = generate(model, None, SamplerConfig(window=7, draft_init="previous_frame"), batch_size=2)
    assert torch.equal(result.tokens, model.context.repeat(2, 4))
    # every draft is right: each call commits the whole window (6 drafts + 1 bonus) after the prefill
    assert result.nfe == 1 + -(-(model.num_tokens - 1) // 7)
    above = generate(model, None, SamplerConfig(window=7, draft_init="above"), batch_size=2)
    assert above.nfe > result.nfe


def test_model_default_draft_init_applies_and_previous_frame_needs_a_video_grid():
    model = RepeatingVideo()
    model.default_draft_init = "previous_frame"
    assert generate(model, None, SamplerConfig(window=7), batch_size=1).nfe == 5
    with pytest.raises(ValueError, match="previous_frame.*video model"):
        generate(grid_model(), None, SamplerConfig(window=4, draft_init="previous_frame"))


def test_code_ids_must_be_distinct_and_match_the_vocabulary():
    model = grid_model()
    model.code_ids = torch.arange(model.vocab_size - 1)
    with pytest.raises(ValueError, match="code_ids"):
        generate(model, None, SamplerConfig(window=4))


def test_model_default_top_p_applies_when_unset():
    model = grid_model()
    model.default_top_p = 0.3
    by_default = generate(model, None, SamplerConfig(window=4, seed=5), batch_size=2).tokens
    assert torch.equal(by_default, generate(model, None, SamplerConfig(window=4, seed=5, top_p=0.3), batch_size=2).tokens)
    assert not torch.equal(by_default, generate(model, None, SamplerConfig(window=4, seed=5, top_p=1.0),
                                                batch_size=2).tokens)
