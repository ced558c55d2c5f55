"""Interleaved generation (story / howto / explore) on a tiny random copy of the base Emu3.5, against a plain AR loop
written here from the authors' logits processor (src/utils/logits_processor.py, differential sampling, "no_text")
on transformers' Qwen3 network with every head row.

The copy follows planted bigrams greedily (emu3p5_fixture.STORY_BIGRAMS): "Q", an image whose size it writes
("10*20"), "Z", the next image at the same size (force_same_image_size), "Z", ...
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

import pytest
import torch
from emu3p5_fixture import STORY_SIZE, byte_id, reference_network, write_tiny_emu3p5
from emu3p5_fixture import tiny_emu3p5_base_dir, tiny_emu3p5_dir  # noqa: F401  (fixtures)
from test_emu3p5 import authors_parse_hw, authors_reference_string, eight_bit_image
from test_lossless import P_MIN, chi_square_pvalue

from scd_core import SamplerConfig, load_model
from scd_core.decoding import rng
from scd_core.decoding.engine import generate
from scd_core.models.families import emu3p5
from scd_core.models.families.emu3p5_header import SizeMask
from scd_core.models.families.emu3p5_story import StoryOptions, StoryRun, decode_images, generate_story, \
    story_prompts

QUESTION = "a hedgehog afraid of the dark"
# the authors' ids (logits_processor.py): '*' 9, '0' 15, '1'..'9' 16..24 (byte ranks, the same in the tiny copy)
STAR, ZERO = 9, 15
TWO_IMAGES = 460  # Q, image (1 + 6 + 10 * 21), Z, image (the same), Z, then the third image does not fit


@pytest.fixture(scope="module")
def story_model(tiny_emu3p5_base_dir: Path) -> emu3p5.Emu3p5Model:
    return load_model(tiny_emu3p5_base_dir, device="cpu", dtype=torch.float64)


@pytest.fixture(scope="module")
def network(tiny_emu3p5_base_dir: Path) -> torch.nn.Module:
    return reference_network(tiny_emu3p5_base_dir)


def warp(scores: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """apply_differential_topk: temperature, top-k (below the k-th value removed), top-p (the tokens after the
    first whose cumulative probability passes top_p removed)."""
    scores = scores / temperature
    if top_k < scores.numel():
        scores = scores.masked_fill(scores < torch.topk(scores, top_k).values[-1], float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(scores, descending=True)
        remove = torch.cumsum(torch.softmax(ordered, -1), -1) > top_p
        remove[1:] = remove[:-1].clone()
        remove[0] = False
        scores = scores.masked_fill(torch.zeros_like(remove).scatter(0, order, remove), float("-inf"))
    return scores


def authors_guided(c: torch.Tensor, u: torch.Tensor, cfg: float, first_visual: int) -> torch.Tensor:
    """apply_cfg "no_text" on log-probabilities, then only the visual ids."""
    u = torch.log_softmax(u, -1)
    scores = cfg * (torch.log_softmax(c, -1) - u) + u
    scores[:first_visual] = float("-inf")
    return scores


def authors_grid_step(offset: int, size: tuple[int, int], ends: tuple[int, int],
                      guided: Callable[[], torch.Tensor], pick: Callable[[torch.Tensor], int]) -> int:
    """in_image_logits_processor at `offset` after <|image token|>: (EOI, EOL) `ends` forced after the last row and
    each other row, else `pick` of the `guided` scores."""
    height, width = size
    if offset == height * (width + 1):
        return ends[0]
    if offset % (width + 1) == 0:
        return ends[1]
    return pick(guided())


def authors_loop(net: torch.nn.Module, model: emu3p5.Emu3p5Model, options: StoryOptions, cfg: float,
                 image: tuple[float, int, float], draw: Callable[[torch.Tensor, int, str], int],
                 prompts: Optional[tuple[list[int], list[int]]] = None) -> list[int]:
    """The authors' generate loop with their processor, one token per step, from `prompts` (cond, uncond; default:
    the story's without images); `draw(scores, position, kind)` picks each token from the processed scores (kind
    "text", "size" or "image")."""
    ids = model._tokenizer.ids
    boi, img, eoi, eol, eos = (ids[t] for t in ("<|image start|>", "<|image token|>", "<|image end|>",
                                                 "<|extra_200|>", "<|extra_204|>"))
    first_visual = int(model.code_ids[0])
    cond, uncond = prompts or story_prompts(model, QUESTION, options.task)
    seq, unc, new = list(cond), list(uncond), []
    in_image = in_visual = False
    height = width = None
    if img in unc:  # the processor's __init__: parse_hw on the uncond ids, the last reference's grid
        height, width = authors_parse_hw(model, tuple(unc))
    logits = lambda ids_: net(torch.tensor([ids_])).logits[0, -1]
    last_index = lambda token: len(seq) - 1 - seq[::-1].index(token)
    with torch.no_grad():
        while len(new) < options.max_new_tokens:
            last = seq[-1]
            in_image = in_image or last == boi
            if last == eoi:  # exit_image: text mode, and the image end fed to the unconditional context
                in_image = in_visual = False
                unc.append(last)
            c = logits(seq)
            if not in_image:
                scores = c.masked_fill(torch.arange(c.numel()) >= first_visual, float("-inf"))
                token = draw(warp(scores, options.text_temperature, options.text_top_k, options.text_top_p),
                             len(new), "text")
            else:
                unc.append(last)  # get_unconditional_logits: every image-mode step feeds the last token
                if in_visual or last == img:
                    if last == img:
                        in_visual = True
                        if height is None:  # parse_hw, once: the size stays set for every later image
                            written = seq[last_index(boi) + 1:last_index(img)]
                            height, width = (int("".join(str(t - ZERO) for t in side)) for side in
                                             (written[:written.index(STAR)], written[written.index(STAR) + 1:]))
                    token = authors_grid_step(len(seq) - last_index(img), (height, width), (eoi, eol),
                                              lambda: authors_guided(c, logits(unc), cfg, first_visual),
                                              lambda scores: draw(warp(scores, *image), len(new), "image"))
                else:
                    step = len(seq) - last_index(boi)
                    if height is not None:
                        forced = [*model._tokenizer.encode(f"{height}*{width}"), img]
                        token = forced[min(step, len(forced)) - 1]
                    elif step == 3:
                        token = STAR
                    elif step > 5:
                        token = img
                    else:
                        allowed = range(ZERO + 1, ZERO + 10) if step in (1, 4) else range(ZERO, ZERO + 10)
                        keep = torch.zeros(c.numel(), dtype=torch.bool)
                        keep[list(allowed)] = True
                        token = draw(warp(c.masked_fill(~keep, float("-inf")), *image), len(new), "size")
            seq.append(token)
            new.append(token)
            if token == eos:
                break
    return new


greedy = lambda scores, position, kind: int(scores.argmax())


@pytest.fixture(scope="module")
def authors_greedy(network: torch.nn.Module, story_model: emu3p5.Emu3p5Model) -> list[int]:
    return authors_loop(network, story_model, StoryOptions(max_new_tokens=TWO_IMAGES, text_top_k=1), 3.0,
                        (1.0, 1, 1.0), greedy)


@pytest.mark.parametrize("coupler, window", [("faithful", 1), ("faithful", 8), ("faithful", "auto"),
                                             ("maximal", 8)])
def test_greedy_story_equals_the_authors_loop(story_model: emu3p5.Emu3p5Model, authors_greedy: list[int],
                                              coupler: str, window) -> None:
    """Two images, the first's size written by the model, the second's forced to it; images at CFG 3 (the
    interleaved default), top-k 1; text at top-k 1; the budget ends before a third image, which is not sampled."""
    result = generate_story(story_model, QUESTION, SamplerConfig(coupler=coupler, window=window, top_k=1),
                            StoryOptions(max_new_tokens=TWO_IMAGES, text_top_k=1))
    assert result.sizes == [STORY_SIZE, STORY_SIZE] and result.stop == "max_new_tokens"
    cut = len(result.tokens)  # the authors go on into the third image, which their decode drops
    assert cut == 2 * (1 + 1 + 6 + 10 * 21) + 1 + 1 + 6 and result.tokens == authors_greedy[:cut]
    assert result.parts == ["Q", 0, "Z", 1, "Z"]
    images = decode_images(story_model, result)
    assert [tuple(image.shape) for image in images] == [(160, 320, 3)] * 2
    assert story_model.size == emu3p5.DEFAULT_SIZE  # the model's own size is left as it was
    if window != 1:
        assert result.image_calls < 2 * (10 * 21 + 1) - 2 * 10  # fewer calls than AR (row ends cost none)


def test_each_switch_feeds_only_the_new_tokens(story_model: emu3p5.Emu3p5Model) -> None:
    """The cond and uncond cache rows are kept across segments: at window 1 (one id per row and call) the run feeds
    each id of the sequence once per row that holds it, plus the padding of the call that opens the first image
    (where the uncond row is fed its whole prompt beside the cond row's few new ids).  Building the caches again
    at each switch feeds the whole sequence again (about 6 times the prompt more here)."""
    fed = []
    hook = story_model.module.get_input_embeddings().register_forward_pre_hook(
        lambda module, args: fed.append(args[0].numel()))
    try:
        result = generate_story(story_model, QUESTION, SamplerConfig(window=1, top_k=1),
                                StoryOptions(max_new_tokens=TWO_IMAGES, text_top_k=1))
    finally:
        hook.remove()
    cond, uncond = story_prompts(story_model, QUESTION, "story")
    images = 2 * (1 + 6 + 10 * 21)  # each image from <|image start|> to <|image end|>, in the uncond context too
    once = len(cond) + len(result.tokens) + len(uncond) + images
    assert len(result.images) == 2 and once <= sum(fed) <= once + len(uncond) + 8, (sum(fed), once)


def test_the_story_bench_counts_the_calls_a_story_makes(story_model: emu3p5.Emu3p5Model) -> None:
    """`bench emu3p5-story`'s text calls are the run's: one per text token, image start and written size digit,
    none for a switch; its images' calls are the engine's, AR's one per position."""
    from scd_core.bench.emu3p5 import Emu3p5ShapedModel
    from scd_core.bench.emu3p5_story import IMAGES, story_rows, text_calls

    result = generate_story(story_model, QUESTION, SamplerConfig(window=8, top_k=1),
                            StoryOptions(max_new_tokens=TWO_IMAGES, text_top_k=1))
    assert result.parts == ["Q", 0, "Z", 1, "Z"]  # one token a segment; then a third image start, cut by the budget
    assert result.text_calls == text_calls(1, images=2) + 1
    rows = story_rows(Emu3p5ShapedModel(2, 3, codes=64), [4], text_tokens=5)
    assert [row["method"] for row in rows] == ["AR", "SCD-maximal", "faithful"]
    assert rows[0]["image_calls"] == IMAGES * 2 * 4 and {row["text_calls"] for row in rows} == {text_calls(5)}
    assert all(row["story_calls"] == row["image_calls"] + row["text_calls"] for row in rows)


def test_eos_ends_the_story(tmp_path: Path) -> None:
    """A copy whose image end leads to EOS: one image, the text without the end mark, the authors' tokens."""
    folder = write_tiny_emu3p5(tmp_path / "Emu3.5", story="eos")
    model = load_model(folder, device="cpu", dtype=torch.float64)
    options = StoryOptions(max_new_tokens=400, text_top_k=1, task="howto")
    result = generate_story(model, QUESTION, SamplerConfig(window=8, top_k=1), options)
    expected = authors_loop(reference_network(folder), model, options, 3.0, (1.0, 1, 1.0), greedy)
    assert result.stop == "eos" and result.tokens == expected and result.parts == ["Q", 0]
    assert result.tokens[-1] == model._tokenizer.ids["<|extra_204|>"] and len(result.images) == 1


def test_an_image_end_written_as_text_reaches_the_unconditional_context(tmp_path: Path) -> None:
    """A copy that writes <|image end|> as text before its first image: the authors' exit_image feeds it to the
    unconditional context, so both images are guided against a context that holds it."""
    folder = write_tiny_emu3p5(tmp_path / "Emu3.5", story="stray_end")
    model = load_model(folder, device="cpu", dtype=torch.float64)
    options = StoryOptions(max_new_tokens=TWO_IMAGES, text_top_k=1)
    result = generate_story(model, QUESTION, SamplerConfig(window=8, top_k=1), options)
    expected = authors_loop(reference_network(folder), model, options, 3.0, (1.0, 1, 1.0), greedy)
    end = model._tokenizer.ids["<|image end|>"]
    assert result.tokens[:2] == [byte_id("Q"), end] and result.tokens == expected[:len(result.tokens)]
    assert len(result.images) == 2


def test_faithful_window_8_gives_the_window_1_story(story_model: emu3p5.Emu3p5Model) -> None:
    """Sampled text and images (the authors' values): the whole sequence is the same at window 8 as at window 1."""
    for seed in (0, 1):
        runs = [generate_story(story_model, QUESTION, SamplerConfig(window=window, seed=seed),
                               StoryOptions(max_new_tokens=TWO_IMAGES)) for window in (1, 8)]
        assert runs[0].tokens == runs[1].tokens and len(runs[0].images) == 2
        assert runs[1].image_calls < runs[0].image_calls


def test_text_tokens_are_plain_ar_draws(story_model: emu3p5.Emu3p5Model, network: torch.nn.Module) -> None:
    """Text at temperature 4 (so that the text wanders) around images sampled by SCD at window 8: every text token
    and written size digit is the inverse-CDF draw, from the authors' processed text law, of its position's keyed
    uniform: plain AR sampling, whatever the images' window."""
    options = StoryOptions(max_new_tokens=300, text_temperature=4.0)
    result = generate_story(story_model, QUESTION, SamplerConfig(coupler="maximal", window=8, seed=5), options)
    keys, drawn = rng.seed_keys([5], torch.device("cpu")), []

    def draw(scores: torch.Tensor, position: int, kind: str) -> int:
        if kind == "image":  # the images as the run sampled them (past its end: any token)
            return result.tokens[position] if position < len(result.tokens) else int(scores.argmax())
        u = rng.KeyedRandom(torch.device("cpu")).uniform(rng.SEQUENCE, keys, torch.tensor([[position]]), 0)
        cdf = torch.cumsum(torch.softmax(scores, -1), -1)
        drawn.append(kind)
        return int(torch.searchsorted(cdf, float(u) * cdf[-1]))

    expected = authors_loop(network, story_model, options, 3.0, (1.0, 10240, 1.0), draw)
    assert result.tokens == expected[:len(result.tokens)]
    assert drawn.count("text") > 20 and len({t for t in result.tokens if t < 256}) > 5  # the text wandered


def test_an_image_inside_the_text_has_the_authors_law(story_model: emu3p5.Emu3p5Model,
                                                      network: torch.nn.Module) -> None:
    """Chi-square of the two 1 x 1 images of "Q [image] Z [image]" (greedy text, images at CFG 3, top-k 3, SCD
    at window 3) against the law the authors' rules give, enumerated: the second image is guided against the
    unconditional prompt, the first image and its own header, not the text."""
    options = StoryOptions(max_new_tokens=16, text_top_k=1, size=(1, 1))
    runs = [generate_story(story_model, QUESTION, SamplerConfig(coupler="maximal", window=3, top_k=3, seed=seed),
                           options) for seed in range(450)]
    assert all(run.parts == ["Q", 0, "Z", 1] for run in runs)
    codes = torch.tensor([[run.tokens[6], run.tokens[14]] for run in runs])
    first_run = runs[0].tokens
    cond, uncond = story_prompts(story_model, QUESTION, "story")
    first = int(story_model.code_ids[0])

    def law_at(prefix: list[int], unc: list[int]) -> torch.Tensor:
        with torch.no_grad():
            c = torch.log_softmax(network(torch.tensor([cond + prefix])).logits[0, -1], -1)
            u = torch.log_softmax(network(torch.tensor([uncond + unc])).logits[0, -1], -1)
        scores = 3.0 * (c - u) + u
        scores[:first] = float("-inf")
        return torch.softmax(warp(scores, 1.0, 3, 1.0), -1)

    law, header = {}, first_run[1:6]
    p1 = law_at(first_run[:6], header)
    for a in torch.nonzero(p1).flatten().tolist():
        image = [a, first_run[7]]  # the code, then the image end
        p2 = law_at([*first_run[:6], *image, *first_run[8:14]], [*header, *image, *header])
        for b in torch.nonzero(p2).flatten().tolist():
            law[(a, b)] = float(p1[a] * p2[b])
    assert len(law) == 9 and math.isclose(sum(law.values()), 1.0)
    assert chi_square_pvalue(codes, law) > P_MIN


def test_size_mask_holds_the_authors_ids(story_model: emu3p5.Emu3p5Model) -> None:
    mask = SizeMask.for_tokenizer(story_model._tokenizer.encode, story_model._tokenizer.ids["<|image token|>"])
    assert mask.nonzero == tuple(range(16, 25)) and mask.digits == tuple(range(15, 25)) and mask.star == STAR
    assert [mask.allowed(step) for step in (3, 6)] == [(STAR,), (mask.image_token,)]
    assert mask.parse_size([16, 15, STAR, 17, 15]) == (10, 20)
    with pytest.raises(ValueError, match="'H\\*W'"):
        mask.parse_size([16, 15, 17])


def test_text_decodes_to_what_was_encoded(story_model: emu3p5.Emu3p5Model) -> None:
    text = "USER: the ant <|image start|> 12*34 ÿ"
    assert story_model._tokenizer.bpe.decode(story_model._tokenizer.encode(text)) == text


def one_line_error(call: Callable[[], object], *words: str) -> None:
    with pytest.raises(ValueError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message and all(word in message for word in words), message


def test_bad_requests_get_one_line_and_leave_the_model_working(tiny_emu3p5_dir: Path,
                                                                story_model: emu3p5.Emu3p5Model) -> None:
    image_model = load_model(tiny_emu3p5_dir, device="cpu", dtype=torch.float64)
    config = SamplerConfig(window=4, top_k=1)
    one_line_error(lambda: generate_story(image_model, QUESTION, config), "base Emu3.5", "Emu3.5-Image")
    one_line_error(lambda: generate_story(story_model, QUESTION, config, StoryOptions(max_new_tokens=100)),
                   "max_new_tokens 100 cannot hold one image", "117")
    one_line_error(lambda: generate_story(story_model, QUESTION, config, StoryOptions(max_new_tokens=9,
                                                                                      size=(2, 3))), "13")
    one_line_error(lambda: generate_story(story_model, QUESTION, config, StoryOptions(task="t2i")), "story")
    one_line_error(lambda: generate_story(story_model, " ", config), "prompt")
    # nothing lost: both models still generate
    story_model.set_image_size(48, 32)
    try:
        assert generate(story_model, story_model.encode("a cube"), config).tokens.shape == (1, 8)
    finally:
        story_model.set_image_size(1024, 1024)
    assert generate_story(story_model, QUESTION, config, StoryOptions(max_new_tokens=20, size=(1, 2),
                                                                      text_top_k=1)).images


def test_command_line_writes_the_images_and_the_markdown(tiny_emu3p5_base_dir: Path, tiny_emu3p5_dir: Path,
                                                         tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from PIL import Image

    from scd_core.frontends.cli import main

    out = tmp_path / "story"
    args = ["story", "--prompt", QUESTION, "--out", str(out), "--max-new-tokens", "20", "--width", "32",
            "--height", "16", "--text-top-k", "1", "--dtype", "float64", "--device", "cpu", "--window", "4"]
    assert main([*args, "--model", str(tiny_emu3p5_base_dir)]) == 0
    assert (out / "story.md").read_text() == "Q\n\n![image 1](image_01.png)\n\nZ\n\n![image 2](image_02.png)\n\nZ\n"
    assert Image.open(out / "image_02.png").size == (32, 16)
    assert "2 images, 20 new tokens (stopped at max_new_tokens)" in capsys.readouterr().out
    # bad input: one line, exit 2, the folder's story kept
    assert main([*args, "--model", str(tiny_emu3p5_base_dir)]) == 2
    assert main([*args[:4], str(tmp_path / "other"), *args[5:], "--model", str(tiny_emu3p5_dir)]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and "already holds story.md" in errors[0] and "Emu3.5-Image" in errors[1]
    assert (out / "story.md").read_text().startswith("Q\n")


def test_the_models_positions_cap_the_budget(story_model: emu3p5.Emu3p5Model) -> None:
    """The authors' 32768 new tokens on a copy of 1024 positions: the story stops where the positions end, every
    image whole; a prompt that leaves no room for one image is one line."""
    result = generate_story(story_model, QUESTION, SamplerConfig(window=16, top_k=1), StoryOptions(text_top_k=1))
    prompt = len(story_prompts(story_model, QUESTION, "story")[0])
    room = 1024 - prompt
    assert result.stop == "positions" and len(result.images) == 4 and len(result.tokens) <= room
    assert room - 4 * (1 + 1 + 6 + 10 * 21) < 1 + 1 + 6 + 10 * 21  # a fifth image (and its text) did not fit
    one_line_error(lambda: generate_story(story_model, QUESTION + " x" * 420, SamplerConfig()),
                   "positions the prompt leaves the model cannot hold one image")
    one_line_error(lambda: generate_story(story_model, QUESTION + " x" * 1100, SamplerConfig()),
                   "(reference images included), the model's 1024 positions or more: leave room for the story")


# Reference images (inference.py with a "reference_image" list; example_config_visual_guidance.py's templates)
REF_AREA = 48 * 32  # image_area for the tiny copy: a 40 x 60 picture is stretched to 32 x 48 px, 2 x 3 codes
WITH_IMAGES = ("<|extra_203|>You are a helpful assistant for {task} task.{extra} USER: {{question}}<|IMAGE|> "
               "ASSISTANT: <|extra_100|>")
UNCOND_WITH_IMAGES = "<|extra_203|>You are a helpful assistant. USER: <|IMAGE|> ASSISTANT: <|extra_100|>"


def story_references(count: int) -> list[torch.Tensor]:
    """A 40 x 60 picture (2 x 3 codes at REF_AREA), then a 70 x 20 one (5 x 1 codes)."""
    return [eight_bit_image(40, 60, seed=7), eight_bit_image(70, 20, seed=8)][:count]


def authors_reference_prompts(model: emu3p5.Emu3p5Model, references: list[torch.Tensor],
                              task: str = "story") -> tuple[list[int], list[int]]:
    """inference.py: the template's <|IMAGE|> replaced by the references' build_image strings joined, in the cond
    and the uncond prompt, each tokenised whole; a BOS put first where the template lacks it."""
    extra = " Please generate a response with interleaved text and images." if task == "howto" else ""
    images = "".join(authors_reference_string(model, image, REF_AREA) for image in references)
    encode = model._tokenizer.encode
    cond = encode(WITH_IMAGES.format(task=task, extra=extra).format(question=QUESTION).replace("<|IMAGE|>", images))
    bos = model._tokenizer.ids["<|extra_203|>"]
    return ([bos] if cond[0] != bos else []) + cond, encode(UNCOND_WITH_IMAGES.replace("<|IMAGE|>", images))


@pytest.mark.parametrize("count, task", [(1, "story"), (2, "howto")])
def test_reference_prompts_are_the_authors_template_with_the_images(story_model: emu3p5.Emu3p5Model, count: int,
                                                                     task: str) -> None:
    """Both prompts hold the references' ids where the authors' templates say <|IMAGE|> (after the question; alone
    after "USER: " in the uncond one, whose guidance thus holds the references); every image takes the last
    reference's grid (their parse_hw on the uncond ids)."""
    options = StoryOptions(task=task, image_area=REF_AREA)
    run = StoryRun(story_model, QUESTION, SamplerConfig(), options, story_references(count))
    cond, uncond = authors_reference_prompts(story_model, story_references(count), task)
    assert run.prompt == cond and run.uncond == uncond
    assert run.size == [(2, 3), (5, 1)][count - 1] == authors_parse_hw(story_model, tuple(uncond))
    assert story_prompts(story_model, QUESTION, task) != (cond, uncond)  # the images are in them


@pytest.mark.parametrize("count", [1, 2])
@pytest.mark.parametrize("window", [1, 8])
def test_greedy_story_with_references_equals_the_authors_loop(story_model: emu3p5.Emu3p5Model,
                                                              network: torch.nn.Module, count: int,
                                                              window: int) -> None:
    """One reference (the authors keep force_same_image_size) or two (they turn it off): every image takes the last
    reference's grid, its header forced, guided against the uncond prompt holding the references."""
    options = StoryOptions(max_new_tokens=60, text_top_k=1, image_area=REF_AREA)
    result = generate_story(story_model, QUESTION, SamplerConfig(window=window, top_k=1), options,
                            references=story_references(count))
    prompts = authors_reference_prompts(story_model, story_references(count))
    expected = authors_loop(network, story_model, options, 3.0, (1.0, 1, 1.0), greedy, prompts)
    grid = [(2, 3), (5, 1)][count - 1]
    assert len(result.images) >= 3 and result.sizes == [grid] * len(result.images)
    assert result.tokens == expected[:len(result.tokens)]
    images = decode_images(story_model, result)
    assert {tuple(image.shape) for image in images} == {(grid[0] * 16, grid[1] * 16, 3)}


def test_a_size_given_with_references(story_model: emu3p5.Emu3p5Model) -> None:
    """With one reference a size given wins (their parse_hw returns at once when a target size is set and the flag
    on); with two their processor takes the last reference's grid over it, so a size given is refused, as is
    letting the model write each size; nothing is lost."""
    config = SamplerConfig(window=4, top_k=1)
    options = StoryOptions(max_new_tokens=30, text_top_k=1, image_area=REF_AREA, size=(1, 2))
    result = generate_story(story_model, QUESTION, config, options, references=story_references(1))
    assert result.sizes and set(result.sizes) == {(1, 2)}
    one_line_error(lambda: generate_story(story_model, QUESTION, config, options, references=story_references(2)),
                   "2 reference images", "5 x 1 codes", "give no size")
    one_line_error(lambda: generate_story(story_model, QUESTION, config,
                                          replace(options, size=None, force_same_image_size=False),
                                          references=story_references(1)), "cannot write each image's size")


def test_a_one_pixel_reference_is_refused_in_one_line(story_model: emu3p5.Emu3p5Model) -> None:
    config, options = SamplerConfig(window=4, top_k=1), StoryOptions(max_new_tokens=30, image_area=REF_AREA)
    one_line_error(lambda: generate_story(story_model, QUESTION, config, options,
                                          references=[story_references(1)[0], torch.rand(1, 1, 1, 3)]),
                   "1 x 1 px", "at least 16 x 16 px")
    one_line_error(lambda: generate_story(story_model, QUESTION, config, options,
                                          references=[torch.rand(2, 32, 32, 3)]), "reference image 1 is a batch")
    assert generate_story(story_model, QUESTION, config, replace(options, text_top_k=1),
                          references=story_references(1)).sizes[0] == (2, 3)


def test_command_line_takes_reference_images(tiny_emu3p5_base_dir: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    """`--image` twice: the story's images take the last reference's grid (5 x 1 codes: 16 x 80 px), the tokens
    the library's with the same pictures; a file that is no image is one line, exit 2, nothing written."""
    from PIL import Image

    from scd_core.frontends.cli import main

    paths = [tmp_path / "first.png", tmp_path / "second.png"]
    for path, image in zip(paths, story_references(2)):
        Image.fromarray((image[0] * 255).round().to(torch.uint8).numpy(), "RGB").save(path)
    out = tmp_path / "story"
    args = ["story", "--model", str(tiny_emu3p5_base_dir), "--prompt", QUESTION, "--max-new-tokens", "40",
            "--text-top-k", "1", "--dtype", "float64", "--device", "cpu", "--window", "4",
            "--image-area", str(REF_AREA)]
    assert main([*args, "--out", str(out), "--image", str(paths[0]), "--image", str(paths[1])]) == 0
    assert Image.open(out / "image_01.png").size == (16, 80) and (out / "image_02.png").is_file()
    assert "2 images, 38 new tokens" in capsys.readouterr().out  # a third image did not fit
    (tmp_path / "notes.txt").write_text("not a picture")
    assert main([*args, "--out", str(tmp_path / "other"), "--image", str(tmp_path / "notes.txt")]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and "cannot be read as an image" in errors[0], errors
    assert not (tmp_path / "other").exists()
