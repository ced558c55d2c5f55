"""In bfloat16 a position's logits do not depend on the width of the call that computes it: every family's window
calls over the same cached prefix give each position the same bits at widths 1, 8 and 32
(scd_core.models.invariant), and so the seed decides the image at any window.  Each check compares whole logits
bit for bit; the same check with the invariant calls off (`SCD_INVARIANT_CALLS=off`, today's calls) fails, so
it has the power to."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from scd_core import load_model
from scd_core.models import invariant

WIDTHS = (1, 8, 32)
FED = 40  # teacher-forced positions (fewer where the image is smaller)


def logits_by_width(model, cond, batch: int = 1) -> dict[int, torch.Tensor]:
    """The cond rows' logits of image positions 1..n over one random teacher-forced prefix, computed by calls of
    each width of WIDTHS back to back (the last call of a width may be narrower)."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        session = model.start(cond, batch)
        session.prefill()
        fed = min(FED, model.num_tokens - 1)
        tokens = torch.randint(0, model.vocab_size, (batch, fed), generator=generator)
        out = {}
        for width in WIDTHS:
            out[width] = torch.cat([session.forward(tokens[:, start:start + width])[0]
                                    for start in range(0, fed, width)], dim=1)
            session.rewind(fed)
    return out


def differing_widths(model, cond) -> list[int]:
    logits = logits_by_width(model, cond)
    return [width for width in WIDTHS[1:] if not torch.equal(logits[width], logits[1])]


def demo_case():
    model = load_model("demo", "cpu", "bfloat16")
    return model, model.encode("3")


def janus_case(folder: Path):
    model = load_model(folder, device="cpu", dtype="bfloat16")
    return model, model.encode("a cat")


def emu3_case(folder: Path):
    model = load_model(folder, device="cpu", dtype="bfloat16")
    model.set_resolution("1:1", 64 * 64)  # an 8 x 8 code grid, 75 positions: the test size's 18 round alike
    return model, model.encode("a cat")


def glm_case(folder: Path):
    from test_glm_image import loaded

    model = loaded(folder, "bfloat16")
    return model, model.encode("a red cube")


@pytest.fixture(scope="module")
def emu3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from emu3_fixture import write_tiny_emu3

    return write_tiny_emu3(tmp_path_factory.mktemp("tiny_emu3"))


@pytest.fixture(scope="module")
def glm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from glm_image_fixture import write_tiny_glm_image

    return write_tiny_glm_image(tmp_path_factory.mktemp("tiny_glm_image"))


@pytest.fixture(params=["demo", "janus", "emu3", "glm_image"])
def case(request: pytest.FixtureRequest):
    name = request.param
    if name == "demo":
        return demo_case()
    if name == "janus":
        return janus_case(request.getfixturevalue("tiny_janus_dir"))
    if name == "emu3":
        return emu3_case(request.getfixturevalue("emu3_dir"))
    return glm_case(request.getfixturevalue("glm_dir"))


def test_bfloat16_logits_do_not_depend_on_the_call_width(case, monkeypatch):
    model, cond = case
    assert differing_widths(model, cond) == []
    monkeypatch.setenv(invariant.POLICY_VARIABLE, "off")  # today's calls: the same check fails
    assert differing_widths(model, cond) != []
