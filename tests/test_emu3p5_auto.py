"""Emu3.5 text-to-image at the size the model writes (the authors' aspect "auto"), against their processor.

A plain loop written here follows src/utils/logits_processor.py (github.com/baaivision/Emu3.5 at 8fcf1da) with no
target size: after <|image start|> the header under the format mask (digits 1-9 / 0-9, '*', digits, <|image
token|>), unguided, with the image temperature / top-k / top-p; every step fed to the unconditional context; then the
grid parse_hw reads from it, guided, EOL / EOI forced.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from emu3p5_fixture import STORY_SIZE, reference_network
from emu3p5_fixture import tiny_emu3p5_base_dir, tiny_emu3p5_dir  # noqa: F401  (fixtures)
from test_emu3p5_story import STAR, ZERO, authors_grid_step, authors_guided, one_line_error, warp
from test_lossless import P_MIN, chi_square_pvalue

from scd_core import SamplerConfig, load_model
from scd_core.models.families import emu3p5
from scd_core.models.families.emu3p5_auto import auto_size, before_header, generate_auto, with_written_size

QUESTION = "a lighthouse at dusk"


def masked(scores: torch.Tensor, step: int) -> torch.Tensor:
    """The authors' format mask at header step `step` (1 = after <|image start|>) over the digits and '*'."""
    allowed = [STAR] if step == 3 else range(ZERO + 1, ZERO + 10) if step in (1, 4) else range(ZERO, ZERO + 10)
    keep = torch.zeros(scores.numel(), dtype=torch.bool)
    keep[list(allowed)] = True
    return scores.masked_fill(~keep, float("-inf"))


def authors_greedy_t2i(net: torch.nn.Module, model: emu3p5.Emu3p5Model, cfg: float) -> list[int]:
    """The authors' loop from <|image start|> on, greedy (image top-k 1): the header it writes, then the grid."""
    ids = model._tokenizer.ids
    boi, img, eoi, eol = (ids[t] for t in ("<|image start|>", "<|image token|>", "<|image end|>", "<|extra_200|>"))
    prompt = model.encode(QUESTION)
    seq, unc, new = before_header(prompt.cond, boi), before_header(prompt.uncond, boi)[:-1], []  # BOI fed below
    first_visual = int(model.code_ids[0])
    logits = lambda ids_: net(torch.tensor([ids_])).logits[0, -1]
    with torch.no_grad():
        while not new or new[-1] != eoi:
            c, step = logits(seq), len(new) + 1
            unc.append(seq[-1])  # image mode: every step feeds the last token to the unconditional context
            if img not in new:
                token = img if step == 6 else int(warp(masked(c, step), 1.0, 1, 1.0).argmax())
            else:
                height, width = (int("".join(str(t - ZERO) for t in side)) for side in
                                 (new[:new.index(STAR)], new[new.index(STAR) + 1:new.index(img)]))
                token = authors_grid_step(len(new) - new.index(img), (height, width), (eoi, eol),
                                          lambda: authors_guided(c, logits(unc), cfg, first_visual),
                                          lambda scores: int(scores.argmax()))
            seq.append(token)
            new.append(token)
    return new


@pytest.fixture(scope="module")
def base_model(tiny_emu3p5_base_dir: Path) -> emu3p5.Emu3p5Model:
    return load_model(tiny_emu3p5_base_dir, device="cpu", dtype=torch.float64)


@pytest.fixture(scope="module")
def image_model(tiny_emu3p5_dir: Path) -> emu3p5.Emu3p5Model:
    return load_model(tiny_emu3p5_dir, device="cpu", dtype=torch.float64)


@pytest.mark.parametrize("window", [1, 8])
def test_greedy_auto_equals_the_authors_loop(base_model: emu3p5.Emu3p5Model, tiny_emu3p5_base_dir: Path,
                                             window: int) -> None:
    """The copy writes "10*20" itself; its grid, guided against an unconditional context that holds that header,
    equals the authors' greedy tokens at window 1 and 8 (CFG 2, the base model's)."""
    expected = authors_greedy_t2i(reference_network(tiny_emu3p5_base_dir), base_model, 2.0)
    result, written = generate_auto(base_model, base_model.encode(QUESTION), SamplerConfig(window=window, top_k=1))
    header = expected[:expected.index(base_model._tokenizer.ids["<|image token|>"]) + 1]
    assert written.size == STORY_SIZE and written.cond[-len(header):] == written.uncond[-len(header):] == tuple(header)
    assert result.tokens[0].tolist() == expected[len(header):]
    assert tuple(base_model.decode(result.tokens).shape) == (1, 160, 320, 3)
    if window != 1:
        assert result.nfe < 10 * 20


def test_written_size_has_the_authors_law(image_model: emu3p5.Emu3p5Model, tiny_emu3p5_dir: Path) -> None:
    """Emu3.5-Image (its head cut to the visual rows and the size digits): chi-square of the written sizes at image
    top-k 2 against the authors' masked, top-k'd, unguided law, enumerated over its 16 headers."""
    net = reference_network(tiny_emu3p5_dir)
    boi = image_model._tokenizer.ids["<|image start|>"]
    cond = before_header(image_model.encode(QUESTION).cond, boi)
    headers = torch.tensor([with_written_size(image_model, image_model.encode(QUESTION),
                                              SamplerConfig(seed=seed, top_k=2, cfg_scale=5.0)).cond[len(cond):-1]
                            for seed in range(400)])
    law: dict[tuple[int, ...], float] = {(): 1.0}
    with torch.no_grad():
        for step in range(1, 6):
            grown = {}
            for prefix, p in law.items():
                probs = torch.softmax(warp(masked(net(torch.tensor([cond + list(prefix)])).logits[0, -1], step),
                                           1.0, 2, 1.0), -1)
                for token in torch.nonzero(probs).flatten().tolist():
                    grown[(*prefix, token)] = p * float(probs[token])
            law = grown
    assert len(law) == 16 and math.isclose(sum(law.values()), 1.0)
    assert chi_square_pvalue(headers, law) > P_MIN


def test_bad_auto_requests_get_one_line(image_model: emu3p5.Emu3p5Model) -> None:
    prompt = image_model.encode(QUESTION)
    one_line_error(lambda: generate_auto(image_model, prompt, SamplerConfig(), batch_size=2), "one image at a time")
    one_line_error(lambda: with_written_size(image_model, "a string", SamplerConfig()), "Emu3.5 prompt")
    one_line_error(lambda: auto_size(object(), prompt), "Emu3.5", "width and height")
    one_line_error(lambda: auto_size(image_model, replace(prompt, references=((1,),))), "text-to-image")
    assert image_model.encode(QUESTION) == prompt  # nothing changed


def test_command_line_size_auto(tiny_emu3p5_base_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`generate --size-auto`: the image at the size the copy writes (10 x 20 codes: 320 x 160 px); with a size
    or a batch, one line and exit 2."""
    from PIL import Image

    from scd_core.frontends.cli import main

    out = tmp_path / "auto.png"
    args = ["generate", "--model", str(tiny_emu3p5_base_dir), "--prompt", QUESTION, "-o", str(out), "--dtype",
            "float64", "--device", "cpu", "--window", "4", "--size-auto"]
    assert main(args) == 0 and Image.open(out).size == (320, 160)
    capsys.readouterr()
    assert main([*args, "--batch-size", "2"]) == 2 and main([*args, "--width", "64", "--height", "64"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and all("--size-auto" in line for line in errors)
