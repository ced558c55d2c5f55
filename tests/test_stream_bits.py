"""In bfloat16 a job's logits in a stream are its logits alone, bit for bit, whatever prompts run beside it.

A job's keys sit where its own prompt puts them (`RowSession.layout`: its width rounded up to the session's
bucket, hidden slots first) and its calls attend over the same key length, alone and in any stream; `admit` joins
only jobs of one layout, and generate_many runs each layout's jobs together.  Before, a joined cache left-padded
every row to the widest prompt: a job beside a longer prompt had its keys moved, and the attention reduced them
in other groups (the tiny Emu3 widened to head_dim 128: 7 of 8 positions had other logits after 560 positions).
Each check runs with this machine's kernels and with stand-ins whose attention reduces the keys in blocks of
`KEY_BLOCK` slots (row_count_kernels.py), so that on any machine a moved key changes the bits: the power check
moves a job's keys (another bucket) and sees its logits change.  (This CPU's kernels gave the tiny checkpoints
the same bits under the old padding; the stand-ins did not: 5 of 5 text families differed, and one job of the
generate_many stream drew other tokens.)  A class label's prompt is one slot in every job, and a Cosmos context
of a given number of frames has one width: there each job's layout is its prompt's own width.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

import pytest
import torch
from emu3p5_fixture import tiny_emu3p5_dir  # noqa: F401  (fixture, one checkpoint per session)
from lumina_fixture import tiny_lumina_dir  # noqa: F401  (fixture)
from test_invariant import emu3_case, emu3p5_case, glm_case, janus_case, llamagen_case, lumina_case
from test_invariant import emu3_dir, glm_dir  # noqa: F401  (fixtures)

import row_count_kernels
from row_count_kernels import RowCountKernels
from scd_core import SamplerConfig, generate, generate_many, load_model

WINDOW = 4
FED = 40  # teacher-forced positions (fewer where the image is smaller)
KEY_BLOCK = 16  # the stand-in attention's key blocks here: keys moved by other than a multiple regroup


def text_jobs(model, _, prompts=("a red cube", "a red cube on it", "cat"), negative: Optional[str] = "x"):
    """A job, prompts of its layout longer and shorter than its own, and a prompt of another layout (a short
    negative prompt: a long default one would give every job its width)."""
    encode = lambda prompt: model.encode(prompt) if negative is None else model.encode(prompt, negative_prompt=negative)
    job, longer, shorter = map(encode, prompts)
    return job, [longer, shorter], encode("a small blue sphere on a long wooden table " * 6)


def emu3p5_jobs(model, cond):
    return text_jobs(model, cond, ("a red", "a red cube", "cat"), None)  # its uncond branch is its template


def llamagen_jobs(model, _):
    """A class label's prompt is one slot wide: every job has one layout, and no prompt is longer or shorter."""
    return model.encode("3"), [model.encode("5")], None


def cosmos_case_and_jobs(root: Path):
    """A context of one frame beside another of one frame; a context of 9 frames takes other slots (contexts
    encoded in float32, as `test_invariant.cosmos_case`'s)."""
    from cosmos_fixture import context_frames, write_cosmos

    folder = write_cosmos(root, "4B")
    encoder = load_model(folder, "cpu", "float32")
    one, other, nine = (encoder.encode_video(context_frames(count, seed=seed))
                        for count, seed in ((1, 0), (1, 3), (9, 1)))
    return load_model(folder, "cpu", "bfloat16"), one, [other], nine


CASES = {"janus": (janus_case, "tiny_janus_dir", text_jobs), "emu3": (emu3_case, "emu3_dir", text_jobs),
         "emu3p5": (emu3p5_case, "tiny_emu3p5_dir", emu3p5_jobs),
         "lumina": (lumina_case, "tiny_lumina_dir", text_jobs), "glm_image": (glm_case, "glm_dir", text_jobs),
         "llamagen": (llamagen_case, None, llamagen_jobs)}


@pytest.fixture(autouse=True)
def one_thread():
    """One thread: a row's bits do not depend on the thread count (docs/invariance_review.md, e5), and two threads
    on this loaded machine ran these tiny calls 50 times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=[*CASES, "cosmos"])
def family(request: pytest.FixtureRequest, tmp_path: Path):
    """(model in bfloat16, the job, neighbours of its layout, a prompt of another layout or None)."""
    if request.param == "cosmos":
        return cosmos_case_and_jobs(tmp_path)
    load, folder, jobs = CASES[request.param]
    model, cond = load(request.getfixturevalue(folder) if folder else tmp_path)
    return (model, *jobs(model, cond))


def fed_tokens(model) -> torch.Tensor:
    """(1, T) random image ids to teacher-force, T a multiple of WINDOW."""
    fed = min(FED, model.num_tokens - 1) // WINDOW * WINDOW
    return torch.randint(0, model.vocab_size, (1, fed), generator=torch.Generator().manual_seed(0))


def sample(logits, index: int) -> torch.Tensor:
    """Sample `index`'s rows of a session's (cond, uncond) logits, one tensor."""
    return torch.cat([part[index:index + 1] for part in logits if part is not None])


def alone(model, cond, tokens: torch.Tensor, bucket: int = 0) -> list[torch.Tensor]:
    """A job's position-0 logits, then its logits of each WINDOW of `tokens`, alone (with `bucket`: its session's
    prompt bucket set to that)."""
    session = model.start(cond, 1)
    if bucket:
        session.prompt_bucket = bucket
    logits = [sample(session.prefill(), 0)]
    return logits + [sample(session.forward(tokens[:, start:start + WINDOW]), 0)
                     for start in range(0, tokens.shape[1], WINDOW)]


def beside(model, live_cond, cond, tokens: torch.Tensor) -> tuple[list, list]:
    """(the live job's logits, the admitted job's logits), as `alone` lists them: the job `cond` joins the session
    of the job `live_cond` with the call that feeds that one's first window (or just before it, where the prompt
    is wider: `admit`), then the two go on, each with its own next window."""
    live = model.start(live_cond, 1)
    old = [sample(live.prefill(), 0)]
    fed, joined = live.admit([model.start(cond, 1)], tokens[:, :WINDOW])
    old.append(sample(fed, 0))
    new = [sample(joined, 0)]
    for start in range(WINDOW, tokens.shape[1], WINDOW):
        logits = live.forward(torch.cat([tokens[:, start:start + WINDOW], tokens[:, start - WINDOW:start]]))
        old.append(sample(logits, 0))
        new.append(sample(logits, 1))
    return old, new


def differing(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> list[int]:
    """The calls whose logits are not bit for bit the same (`theirs` may go on further)."""
    return [index for index, (a, b) in enumerate(zip(ours, theirs)) if not torch.equal(a, b)]


def test_a_job_keeps_its_logits_alone_beside_longer_and_shorter_prompts_in_bfloat16(family, monkeypatch):
    """A job admitted into the session of a longer and of a shorter prompt (and they into its): every job's
    logits are its logits alone, with this machine's kernels and with kernels that regroup moved keys.  With the
    left padding of before, under the stand-ins, the job beside a longer prompt differed (checked by hand)."""
    model, job, neighbours, _ = family
    tokens = fed_tokens(model)
    monkeypatch.setattr(row_count_kernels, "KEY_BLOCK", KEY_BLOCK)
    for kernels in (contextlib.nullcontext, RowCountKernels):
        with kernels(), torch.no_grad():
            own = alone(model, job, tokens)
            for other in neighbours:
                theirs = alone(model, other, tokens)
                for first, second, firsts, seconds in ((other, job, theirs, own), (job, other, own, theirs)):
                    old, new = beside(model, first, second, tokens)
                    assert (differing(old, firsts), differing(new, seconds)) == ([], []), kernels
    session = model.start(job, 1)
    if all(model.start(other, 1).context.shape[1] == session.context.shape[1] for other in neighbours):
        # one width (a class label, contexts of one frame count): no hidden slots, nothing a neighbour could move
        assert session.layout == session.context.shape[1]
        return
    with RowCountKernels(), torch.no_grad():  # the power: keys moved by other than whole key blocks change them
        moved = session.layout + KEY_BLOCK // 2 + 1  # the prompt's slots rounded up to this instead
        assert differing(alone(model, job, tokens, bucket=moved), alone(model, job, tokens)) != []


def test_a_job_of_another_layout_is_refused_and_the_session_goes_on_in_bfloat16(family):
    """A prompt of another layout (wider than the bucket; a context of more frames) is refused with one line, by a
    live session and by one not prefilled yet, and either goes on as if it had not been asked."""
    model, job, _, other = family
    if other is None:  # a class label: every job takes one slot
        assert {model.start(model.encode(label), 1).layout for label in ("0", "3", "9")} == {1}
        return
    tokens = fed_tokens(model)[:, :WINDOW]
    with torch.no_grad():
        own = alone(model, job, tokens)
        live, fresh = model.start(job, 1), model.start(job, 1)
        live.prefill()
        for session in (live, fresh):
            with pytest.raises(ValueError, match=r"slots cannot share a torch.bfloat16 session.*one layout"):
                session.admit([model.start(other, 1)])
        assert differing([sample(fresh.prefill(), 0), sample(fresh.forward(tokens), 0)], own) == []
        assert differing([sample(live.forward(tokens), 0)], own[1:]) == []
        assert live.batch == fresh.batch == 1


@pytest.mark.parametrize("kernels", [contextlib.nullcontext, RowCountKernels], ids=["cpu", "stand-ins"])
def test_generate_many_gives_every_job_of_mixed_prompts_its_image_alone_in_bfloat16(emu3_dir, kernels, monkeypatch):
    """The README's faithful stream: jobs of prompts longer and shorter than their neighbours, and of another
    layout (which run as a group of their own), in 2 slots at window 8: each job's tokens are its window-1
    tokens alone."""
    model, cond = emu3_case(emu3_dir)
    job, (longer, shorter), other = text_jobs(model, cond)
    jobs = [(job, 0), (longer, 1), (other, 2), (shorter, 3), (other, 4), (job, 5)]
    monkeypatch.setattr(row_count_kernels, "KEY_BLOCK", KEY_BLOCK)
    with kernels():
        results = dict(generate_many(model, jobs, SamplerConfig(coupler="faithful", window=8), slots=2))
        for index, (cond, seed) in enumerate(jobs):
            own = generate(model, cond, SamplerConfig(coupler="faithful", window=1, seed=seed))
            assert torch.equal(results[index].tokens, own.tokens), index


def test_a_session_without_admit_keeps_its_own_layout_in_bfloat16(tmp_path):
    """GLM-Image's image-to-image session reads its prompt's positions by slot and joins no stream: its cache
    keeps no hidden slots before the prompt (laid out as a stream's job, its prefill indexed past its positions)."""
    from glm_image_fixture import write_tiny_glm_image
    from test_glm_image import PROMPT, loaded, source_picture

    model = loaded(write_tiny_glm_image(tmp_path), "bfloat16")
    cond = model.encode(PROMPT, "x", image=source_picture())
    session = model.start(cond, 1)
    assert session.admit is None and session.context.shape[1] != session.layout
    session.prefill()
    assert session.prefix == session.context.shape[1]
    assert generate(model, cond, SamplerConfig(window=4, seed=0)).tokens.shape == (1, model.num_tokens)
