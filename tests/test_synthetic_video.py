"""The synthetic video model of `bench --video` and its table."""

from __future__ import annotations

import pytest
import torch

from scd_core import SamplerConfig, generate
from scd_core.bench.video import video_rows
from scd_core.bench.synthetic_video import VideoGridModel


def small(change: float) -> VideoGridModel:
    return VideoGridModel(frames=3, rows=4, cols=5, vocab_size=64, change=change)


def test_window_logits_equal_sequential() -> None:
    model = small(0.3)
    tokens = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(0))
    window = model.start(None, 2)
    first, _ = window.prefill()
    at_once, _ = window.forward(tokens)
    single = model.start(None, 2)
    steps = [single.prefill()[0]] + [single.forward(tokens[:, i:i + 1])[0] for i in range(30)]
    torch.testing.assert_close(torch.cat([first, at_once], 1), torch.cat(steps, 1))


def test_change_is_the_share_of_tokens_redrawn_per_frame() -> None:
    kept = {}
    for change in (0.1, 0.6):
        model = small(change)
        tokens = generate(model, None, SamplerConfig(window=1), batch_size=64).tokens
        video = torch.cat([model.context.expand(64, -1), tokens], dim=1)
        kept[change] = float((video[:, 20:] == video[:, :-20]).float().mean())
        # a redrawn token may land on the same code: kept >= 1 - change, and not by much at 64 codes
        assert 1 - change - 0.05 < kept[change] < 1 - change + 0.15
    assert kept[0.1] > kept[0.6]


def test_previous_frame_drafts_save_calls_and_the_table_reports_the_gap() -> None:
    model = small(0.1)
    calls = {init: generate(model, None, SamplerConfig(window=20, draft_init=init, seed=1)).nfe
             for init in ("random", "previous_frame")}
    assert calls["previous_frame"] < calls["random"]
    assert model.start(None, 1).prefix_tokens.shape == (20,)
    rows = video_rows(model, windows=[20], seeds=[0])
    assert rows[0]["method"] == "AR" and rows[0]["nfe"] == 60 == rows[0]["limit"]
    for row in rows[1:]:
        assert row["limit"] == 3 and row["gap"] == pytest.approx(row["nfe"] / 3)
