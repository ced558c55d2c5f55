"""Per-image seeds and continuous batching: a row's tokens depend on its own seed and conditioning only.

Row i of a batch with seed s samples what a batch of one samples with seed s + i (mod 2**64), for every
coupler, window and candidates setting, on toy models and on every family's tiny checkpoint; and every job of
`generate_many` gets the tokens (and the calls) `generate` gives it alone, whatever joins or leaves the batch.
"""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path

import pytest
import torch
from cosmos_fixture import context_frames, write_cosmos
from emu3_fixture import tiny_emu3_dir  # noqa: F401  (fixture, one checkpoint per session)
from llamagen_fixture import write_original_c2i
from lumina_fixture import tiny_lumina_dir  # noqa: F401
from pace import _cat, _sequential, assert_each_row_matches
from toy_models import TablePrefixModel

from scd_core import SamplerConfig, generate, generate_many, load_model
from scd_core.decoding import couplers
from scd_core.bench.synthetic import GridModel
from scd_core.decoding.config import MAX_SEED

# every coupler at two windows, and the options that draw on streams of their own
SETTINGS = [dict(coupler=coupler, window=window) for coupler in couplers.NAMES
            for window in (1, 6)]
SETTINGS += [dict(coupler="maximal", window=6, candidates=2), dict(coupler="gumbel", window=4, candidates=3),
             dict(coupler="maximal", window=6, alpha=0.5), dict(coupler="gumbel", window=6, alpha=0.3),
             dict(coupler="independent", window=6, verification="block"),
             dict(coupler="independent", window=5, fixed_shapes=True),
             dict(coupler="maximal", window=6, draft_init="random")]
FAMILY_SETTINGS = [SETTINGS[i] for i in (1, 3, 5, 7, 8, 10, 12)]
WRAPPING = MAX_SEED - 1  # a batch of 4 from here uses seeds 2**64 - 2, 2**64 - 1, 0, 1


def assert_rows_are_their_own_seeds(model, cond, options: dict, seed: int, batch: int = 4) -> None:
    config = SamplerConfig(seed=seed, **options)
    batched = generate(model, cond, config, batch_size=batch)
    for row in range(batch):
        alone = generate(model, cond, SamplerConfig(seed=(seed + row) % 2**64, **options))
        assert torch.equal(batched.tokens[row:row + 1], alone.tokens), f"row {row}, {options}"
    assert len({tuple(row) for row in batched.tokens.tolist()}) > 1  # the rows are not one image repeated


@pytest.mark.parametrize("options", SETTINGS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_each_row_of_a_toy_batch_is_the_image_of_its_own_seed(options):
    table = TablePrefixModel(vocab_size=8, num_tokens=20, grid=(4, 5), table_rows=4096, scale=2.0, rows_per_cache=1)
    assert_rows_are_their_own_seeds(table, None, options, seed=WRAPPING)
    assert_rows_are_their_own_seeds(GridModel(rows=4, cols=6, vocab_size=32, sharpness=1.0), None, options, seed=9)


def test_a_batch_of_one_keeps_its_image_when_more_rows_follow():
    """Seed s alone, row 0 of a batch with seed s, and row 2 of a batch with seed s - 2 are one image."""
    model = GridModel(rows=4, cols=6, vocab_size=32)
    config = SamplerConfig(window=6, seed=1)
    alone = generate(model, None, config).tokens
    assert torch.equal(generate(model, None, config, batch_size=3).tokens[:1], alone)
    assert torch.equal(generate(model, None, SamplerConfig(window=6, seed=MAX_SEED), batch_size=3).tokens[2:], alone)


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory, tiny_janus_dir: Path, tiny_emu3_dir: Path,
             tiny_lumina_dir: Path) -> dict:
    """name -> (model, conditioning) for every family's tiny checkpoint, float64 where the family allows."""
    root = tmp_path_factory.mktemp("families")
    janus = load_model(tiny_janus_dir, device="cpu", dtype=torch.float64)
    emu3 = load_model(tiny_emu3_dir, device="cpu", dtype=torch.float64)
    emu3.set_resolution("4:3", 768)
    lumina = load_model(tiny_lumina_dir, device="cpu", dtype=torch.float64)
    llamagen = load_model(write_original_c2i(root / "llamagen"), "cpu", torch.float64)
    cosmos = load_model(write_cosmos(root, "4B"), "cpu", torch.float64)
    return {"janus": (janus, janus.encode("a red cube", negative_prompt="blurry")),
            "emu3": (emu3, emu3.encode("a red cube")),
            "lumina": (lumina, lumina.encode("a red cube")),
            "llamagen": (llamagen, llamagen.encode("3")),
            "cosmos": (cosmos, cosmos.encode_video(context_frames(1)))}


@pytest.mark.parametrize("family", ["janus", "emu3", "lumina", "llamagen", "cosmos"])
def test_each_row_of_a_family_batch_is_the_image_of_its_own_seed(families, family):
    model, cond = families[family]
    for options in FAMILY_SETTINGS:
        assert_rows_are_their_own_seeds(model, cond, options, seed=WRAPPING, batch=3)


# ----------------------------------------------------------------------------- continuous batching

def assert_stream_equals_job_by_job(model, jobs, config, slots, own_calls=True, **options) -> list:
    """generate_many's results, each checked against generate for its job alone (with `own_calls`, its calls
    too: a row in a stream takes part in as many calls as alone, and commits as much in each); returns the
    yield order."""
    order = []
    for index, result in generate_many(model, jobs, config, slots=slots, **options):
        cond, seed = jobs[index]
        alone = generate(model, cond, dataclasses.replace(config, seed=seed))
        assert torch.equal(result.tokens, alone.tokens), f"job {index}"
        assert not own_calls or (result.nfe == alone.nfe and result.committed == alone.committed), f"job {index}"
        order.append(index)
    assert sorted(order) == list(range(len(jobs)))
    return order


class WrappedModel:
    """`model` with sessions of a subclass's making; every other attribute is the model's."""

    def __init__(self, model) -> None:
        self._model = model

    def __getattr__(self, name):
        return getattr(self._model, name)


class CountingSessions(WrappedModel):
    """`model` whose sessions count the rows each call feeds: (prefill rows, forward rows) per call."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self.calls = []
        self.admitted = []  # (the live session's layout, the admitted sessions'), where they have one

    def start(self, cond, batch_size):
        session, calls, admitted = self._model.start(cond, batch_size), self.calls, self.admitted

        class Counting:
            def __getattr__(self, name):
                return getattr(session, name)

            def admit(self, fresh, tokens=None):
                calls.append(("prefill" if tokens is None else "prefill+forward", len(fresh)))
                admitted.append((getattr(self, "layout", None), [getattr(f, "layout", None) for f in fresh]))
                return session.admit([getattr(f, "_session", f) for f in fresh], tokens)

            def forward(self, tokens, *args):
                calls.append(("forward", tokens.shape[0]))
                return session.forward(tokens, *args)

        counting = Counting()
        counting._session = session
        return counting


@pytest.mark.parametrize("options", [dict(coupler="maximal", window=6), dict(coupler="gumbel", window=5),
                                     dict(coupler="maximal", window=6, candidates=2),
                                     dict(coupler="independent", window=6, verification="block"),
                                     dict(coupler="maximal", window=6, alpha=0.5),
                                     dict(coupler="faithful", window=4, fixed_shapes=True)],
                         ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_a_toy_stream_gives_every_job_its_own_tokens(options):
    model = TablePrefixModel(vocab_size=8, num_tokens=20, grid=(4, 5), table_rows=4096, scale=2.0, rows_per_cache=1)
    jobs = [(None, seed) for seed in (3, 7, 7, MAX_SEED, 0, 11, 2, 5, 9, 1)]
    order = assert_stream_equals_job_by_job(model, jobs, SamplerConfig(**options), slots=4, refill_at=2)
    assert order != sorted(order) or options["coupler"] == "faithful"  # yielded as they finish, not in order


@pytest.mark.parametrize("candidates", [1, 2])
def test_refills_share_a_prefill_call_and_slots_stay_bounded(candidates):
    model = CountingSessions(TablePrefixModel(vocab_size=8, num_tokens=20, table_rows=4096, scale=2.0,
                                              rows_per_cache=1))
    jobs = [(None, seed) for seed in range(12)]
    assert_stream_equals_job_by_job(model, jobs, SamplerConfig(coupler="maximal", window=6, candidates=candidates), slots=4,
                                    refill_at=2)
    kinds = [kind for kind, _ in model.calls]
    assert model.calls[0] == ("prefill", 3)  # the first session admits the other three of the first group
    if candidates > 1:  # a tree call cannot hold prompts: a group's prefill is a call of its own
        assert "prefill+forward" not in kinds and kinds.count("prefill") > 2
        return
    assert kinds.count("prefill") == 1  # later groups are prefilled in a decoding call
    refills = [rows for kind, rows in model.calls if kind == "prefill+forward"]
    assert 0 < len(refills) < 12 - 4 and all(rows >= 2 for rows in refills[:-1])  # groups of refill_at or more
    assert all(rows <= 4 for kind, rows in model.calls if kind == "forward")


class LayoutSessions(CountingSessions):
    """`model` whose sessions have the key layout their conditioning names (`RowSession.layout`)."""

    def start(self, cond, batch_size):
        session = super().start(cond, batch_size)
        session.layout = cond
        return session


def test_a_stream_runs_each_layouts_jobs_together():
    """Jobs of two layouts, mixed: every admission joins jobs of the live session's layout, both layouts run,
    every job gets its tokens alone, and the jobs read ahead stay bounded (rows, at most `slots` waiting aside,
    one looked ahead)."""
    model = LayoutSessions(TablePrefixModel(vocab_size=8, num_tokens=20, table_rows=4096, scale=2.0,
                                            rows_per_cache=1))
    layouts, read, done = "aabbbabaaabb", [], 0
    config = SamplerConfig(coupler="maximal", window=6)

    def jobs():
        for seed, layout in enumerate(layouts):
            read.append(seed)
            yield layout, seed

    for index, result in generate_many(model, jobs(), config, slots=2, refill_at=1):
        done += 1
        assert len(read) - done <= 2 * 2 + 1
        own = generate(model, layouts[index], dataclasses.replace(config, seed=index))
        assert torch.equal(result.tokens, own.tokens)
    assert done == len(layouts)
    assert all(layout == live for live, fresh in model.admitted for layout in fresh)
    assert {live for live, _ in model.admitted} == {"a", "b"}


def test_stream_edges_empty_fewer_jobs_than_slots_and_lazy_reading():
    model = GridModel(rows=4, cols=6, vocab_size=32)
    config = SamplerConfig(window=6)
    assert list(generate_many(model, [], config, slots=4)) == []
    assert_stream_equals_job_by_job(model, [(None, 5), (None, 6)], config, slots=8)

    read = []

    def jobs():
        for seed in range(6):
            read.append(seed)
            yield None, seed

    stream = generate_many(model, jobs(), config, slots=2, refill_at=1)
    next(stream)
    assert len(read) <= 4  # two in the batch, one refilled, one looked ahead
    assert len(list(stream)) == 5


def test_stream_refuses_bad_input():
    model = GridModel(rows=4, cols=6, vocab_size=32)
    with pytest.raises(ValueError, match="slots"):
        list(generate_many(model, [(None, 0)], SamplerConfig(), slots=0))
    for coupler in couplers.names_where("width_free", False):  # auto is for faithful, whose tokens ignore the widths
        with pytest.raises(ValueError, match=f"pinned window with the {coupler} coupler.*faithful"):
            list(generate_many(model, [(None, 0)], SamplerConfig(coupler=coupler, window="auto")))
    with pytest.raises(ValueError, match="seed"):
        list(generate_many(model, [(None, 0), (None, -1)], SamplerConfig()))
    with pytest.raises(ValueError, match="pair"):
        list(generate_many(model, [None], SamplerConfig()))


class WithoutAdmit(WrappedModel):
    """`model` whose sessions cannot take new rows."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self.started = []

    def start(self, cond, batch_size):
        session = self._model.start(cond, batch_size)
        self.started.append(batch_size)

        class Session:
            rows_per_cache = 1
            prefill, forward, rewind, keep_rows = session.prefill, session.forward, session.rewind, session.keep_rows

        return Session()


def test_a_model_without_admit_runs_generate_per_group_of_jobs():
    """Consecutive seeds of one conditioning share a batch (per-image seeds make that exact), others go alone."""
    model = WithoutAdmit(GridModel(rows=4, cols=6, vocab_size=32))
    jobs = [(None, 4), (None, 5), (None, 6), (None, 9), (None, 10)]
    config = SamplerConfig(window=6)
    results = dict(generate_many(model, jobs, config, slots=2))
    assert model.started == [1, 2, 1, 2]  # the probe, then seeds 4-5, 6, 9-10
    for index, (cond, seed) in enumerate(jobs):
        assert torch.equal(results[index].tokens, generate(model, cond, dataclasses.replace(config, seed=seed)).tokens)


@pytest.fixture(scope="module")
def demo():
    return load_model("demo", device="cpu", dtype="float32")


def test_a_stream_its_caller_stops_reading_frees_its_cache_at_once(demo):
    """A caller that stops reading a stream (ComfyUI's cancel, an error in the caller) closes it: with Python's
    cycle collector off, the tensor bytes alive after are those alive before (the run and its calls refer to
    each other: only `Run.close` breaks that)."""
    from test_compile import tensor_bytes

    jobs = [(demo.encode("3"), seed) for seed in range(6)]
    config = SamplerConfig(window=16)
    list(generate_many(demo, jobs[:1], config))  # the process's one-time state
    gc.collect()
    gc.disable()
    try:
        before = tensor_bytes()
        stream = generate_many(demo, iter(jobs), config, slots=2)
        next(stream)
        stream.close()
        del stream
        assert tensor_bytes() == before
    finally:
        gc.enable()


def test_a_demo_stream_of_mixed_classes_gives_every_job_its_own_tokens(demo):
    jobs = [(demo.encode(str(digit)), seed) for digit, seed in zip((3, 7, 3, 1, 3), (0, 0, 1, 5, 0))]
    assert_stream_equals_job_by_job(demo, jobs, SamplerConfig(window=32), slots=2)


@pytest.mark.parametrize("family", ["janus", "emu3", "lumina", "cosmos", "llamagen"])
def test_a_family_stream_of_mixed_prompts_gives_every_job_its_own_tokens(families, family):
    """Prompts of different lengths and negative prompts (contexts of 1 and 2 frames for Cosmos) in one stream."""
    model, _ = families[family]
    if family == "cosmos":
        # one length for all (by default a 1-frame context fills more latent frames than a 9-frame one)
        conds = [model.encode_video(context_frames(count, seed=seed), new_frames=16)
                 for count, seed in ((1, 0), (9, 1), (1, 2))]
    elif family == "llamagen":
        conds = [model.encode(str(index)) for index in (1, 2, 3)]
    else:
        negative = dict(negative_prompt="blurry, low quality")
        conds = [model.encode("a red cube"), model.encode("a small blue sphere on a long wooden table", **negative),
                 model.encode("cat")]
    jobs = [(conds[index % 3], seed) for index, seed in enumerate((4, 1, 1, 7, 0, MAX_SEED))]
    config = SamplerConfig(window=5, coupler="gumbel" if family == "janus" else "maximal")
    assert_stream_equals_job_by_job(model, jobs, config, slots=3, refill_at=2)


def test_a_stream_refuses_jobs_of_another_image_size(families):
    model, cond = families["emu3"]
    model.set_resolution("1:1", 768)
    other = model.encode("a red cube")
    try:
        with pytest.raises(ValueError, match="one image size"):
            list(generate_many(model, [(cond, 0), (other, 0)], SamplerConfig(window=4), slots=2))
    finally:
        model.set_resolution("4:3", 768)


@pytest.mark.parametrize("family", ["janus", "emu3", "lumina", "llamagen", "cosmos"])
def test_a_refill_folded_into_a_decoding_call_gives_every_row_its_own_logits(families, family):
    """admit(fresh, tokens): one call feeds the live rows' window and the new rows' prompts (padded to one width,
    the padding rewound); every row's logits then, and in the next call, are what it gets alone.  The tiny
    Janus and Lumina images are shorter than their prompts, so there the session runs two calls; Emu3 is made
    big enough (10 x 10 codes) for the CFG session to fold."""
    model, _ = families[family]
    if family == "emu3":
        model.set_resolution("1:1", 100 * 64)
    if family == "cosmos":
        conds = [model.encode_video(context_frames(count, seed=seed), new_frames=16)  # one length for all
                 for count, seed in ((9, 0), (1, 1), (1, 2))]
        width = max(cond.codes.numel() for cond in conds[1:])
    elif family == "llamagen":
        conds, width = [model.encode(label) for label in ("1", "2", "3")], 1
    else:
        conds = [model.encode(prompt, negative_prompt=negative)  # short negative prompts: Emu3's own is long
                 for prompt, negative in (("a", "c"), ("a blue sphere", "blurry"), ("b", "d"))]
        width = max(len(ids) for cond in conds[1:] for ids in (cond.cond, cond.uncond))
    folds = width < model.num_tokens
    assert folds == (family not in ("janus", "lumina"))
    width = min(width, model.num_tokens - 1)
    codes = getattr(model, "code_ids", None)
    codes = torch.arange(model.vocab_size) if codes is None else codes
    ids = codes[torch.randint(0, len(codes), (4, width + 2), generator=torch.Generator().manual_seed(0))]
    live, alone = model.start(conds[0], 2), model.start(conds[0], 2)
    live.prefill()
    alone.prefill()
    fed, joined = live.admit([model.start(cond, 1) for cond in conds[1:]], ids[:2, :width])
    valid = min(width, model.num_tokens - 1)  # later slots lie past the image's last position
    pairs = [(tuple(part[:, :valid] for part in fed if part is not None),
              tuple(part[:, :valid] for part in alone.forward(ids[:2, :width]) if part is not None)),
             (joined, _cat([model.start(cond, 1).prefill() for cond in conds[1:]], dim=0))]
    kept = min(width, 3)
    live.rewind(torch.tensor([width - kept, width - kept, 0, 0]))
    history = [ids[0, :kept].tolist(), ids[1, :kept].tolist(), [], []]
    after = live.forward(ids[:, width:])
    rows = [_sequential(model, cond, history[row] + ids[row, width:].tolist(), 2)
            for row, cond in enumerate([conds[0], conds[0], *conds[1:]])]
    pairs.append((after, _cat(rows, dim=0)))
    if family == "emu3":
        model.set_resolution("4:3", 768)
    assert_each_row_matches(pairs, 1e-9)
