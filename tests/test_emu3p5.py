"""The Emu3.5 family on a tiny random copy in the published layout, against a plain AR loop that follows the
authors' rules (src/utils/logits_processor.py) on transformers' Qwen3 network with the same weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from emu3p5_fixture import IMAGE_CODES, reference_network, vq_state
from emu3p5_fixture import tiny_emu3p5_dir  # noqa: F401  (fixture, one checkpoint per session)
from pace import assert_own_pace_gives_ar_tokens
from test_lossless import P_MIN, chi_square_pvalue

from scd_core import COUPLERS, ModelLoadError, SamplerConfig, TokenModel, generate, load_model
from scd_core.models.families import emu3, emu3p5
from scd_core.models.tokenizers import ibq
from scd_core.models.loading import detect_family
from scd_core.decoding.sampling import Sampling, to_probs

PROMPT = "a red cube on the table, 3 times"
WIDTH, HEIGHT, ROWS, COLS = 48, 32, 2, 3  # 2 rows of 3 codes: 2 * (3 + 1) = 8 positions
N = ROWS * (COLS + 1)
REF_W, REF_H = 48, 32  # a reference image's size in the X2I tests: 2 x 3 codes, 13 prompt tokens


def at_test_size(model: emu3p5.Emu3p5Model, width: int = WIDTH, height: int = HEIGHT) -> emu3p5.Emu3p5Model:
    model.set_image_size(width, height)
    return model


@pytest.fixture(scope="module")
def model64(tiny_emu3p5_dir: Path) -> emu3p5.Emu3p5Model:
    return at_test_size(load_model(tiny_emu3p5_dir, device="cpu", dtype=torch.float64))


@pytest.fixture(scope="module")
def reference(tiny_emu3p5_dir: Path) -> torch.nn.Module:
    """transformers' Qwen3ForCausalLM with every lm_head row, filled from the shards apart from load_model."""
    return reference_network(tiny_emu3p5_dir)


def authors_scores(net: torch.nn.Module, cond: list[int], uncond: list[int], cfg: float, first_visual: int,
                   top_k: int) -> torch.Tensor:
    """The authors' scores at a visual position: log-softmax over the whole vocabulary in each branch,
    cfg * (c - u) + u, non-visual ids masked, then top-k (apply_cfg 'no_text', apply_differential_topk)."""
    with torch.no_grad():
        c = torch.log_softmax(net(torch.tensor([cond])).logits[0, -1], dim=-1)
        u = torch.log_softmax(net(torch.tensor([uncond])).logits[0, -1], dim=-1)
    scores = cfg * (c - u) + u
    scores[:first_visual] = float("-inf")
    kth = torch.topk(scores, top_k).values[-1]
    return scores.masked_fill(scores < kth, float("-inf"))


def authors_greedy(net: torch.nn.Module, model: emu3p5.Emu3p5Model, cfg: float, prompt: emu3p5.Emu3p5Prompt
                   ) -> list[int]:
    """A plain AR loop: cond and uncond grow by the same tokens; EOL / EOI where the authors force them."""
    cond, uncond, out = list(prompt.cond), list(prompt.uncond), []
    first_visual = int(model.code_ids[0])
    for offset in range(1, N + 1):  # offsets after <|image token|>, as in_image_logits_processor counts them
        if offset == ROWS * (COLS + 1):
            token = model.forced_tokens[N - 1]
        elif offset % (COLS + 1) == 0:
            token = model.forced_tokens[offset - 1]
        else:
            token = int(authors_scores(net, cond, uncond, cfg, first_visual, 1).argmax())
        cond.append(token)
        uncond.append(token)
        out.append(token)
    return out


def test_loaded_model_describes_itself(tiny_emu3p5_dir: Path) -> None:
    model = load_model(tiny_emu3p5_dir, device="cpu")
    assert isinstance(model, TokenModel) and model.family == "emu3p5"
    assert detect_family(tiny_emu3p5_dir) is emu3p5  # asked before emu3, which also takes model_type "Emu3"
    assert (model.default_cfg_scale, model.default_top_k, model.default_temperature) == (5.0, 5120, 1.0)
    # the authors' 1:1 at 1024 px: 64 rows of 64 codes, 63 row ends and the image end
    assert (model.size, model.num_tokens, model.image_shape) == ((64, 64), 64 * 65, (1024, 1024))
    at_test_size(model)
    ids = model._tokenizer.ids
    assert model.forced_tokens == {3: ids[emu3p5.EOL], 7: ids[emu3p5.IMAGE_END]}
    assert model.grid == (ROWS, COLS + 1) and model.vocab_size == IMAGE_CODES
    assert int(model.code_ids[0]) == ids[emu3p5.IMAGE_END] + 1  # visual tokens follow the image end


def test_rotary_frequencies_follow_the_checkpoints_rope_theta(tiny_emu3p5_dir: Path,
                                                              model64: emu3p5.Emu3p5Model) -> None:
    """inv_freq = 1 / theta ** (2i / d) from config.json's theta (1e6 here, not transformers' default 10000),
    computed by hand: a config spelling one transformers version ignores would leave the default."""
    config = json.loads((tiny_emu3p5_dir / "config.json").read_text())
    theta, head_dim = config["rope_theta"], config["head_dim"]
    assert theta != 10000.0  # the default would pass unseen
    expected = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    inv_freq = model64.module.model.rotary_emb.inv_freq.double()
    torch.testing.assert_close(inv_freq, expected, rtol=1e-6, atol=0.0)


def test_base_checkpoint_takes_the_base_defaults(tiny_emu3p5_dir: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(tiny_emu3p5_dir, tmp_path / "Emu3.5"))
    assert (load_model(folder, device="cpu").default_cfg_scale, load_model(folder, device="cpu").default_top_k) \
        == (2.0, 10240)


def test_tokenizer_is_tiktoken(tiny_emu3p5_dir: Path, model64: emu3p5.Emu3p5Model) -> None:
    """Our BPE gives tiktoken's ids (the authors' tokenizer: NFC, then tiktoken with their pattern, specials
    allowed)."""
    import unicodedata

    import tiktoken

    from scd_core.models.text.tiktoken_bpe import PATTERN, read_ranks

    tokenizer = model64._tokenizer
    encoding = tiktoken.Encoding("emu3-tiny", pat_str=PATTERN.pattern,
                                 mergeable_ranks=read_ranks(tiny_emu3p5_dir / "emu3.tiktoken"),
                                 special_tokens=tokenizer.ids)
    texts = (emu3p5.TEMPLATE.format(question=PROMPT), emu3p5.UNCOND_PROMPT, "64*64", "55*73", "the  thesis\n\n x",
             "Ünïcode cafe\u0301 <|extra_5|>x<|not special|><|image start|>", "<|<|extra_0|>|>", "")
    for text in texts:
        expected = encoding.encode(unicodedata.normalize("NFC", text), allowed_special="all")
        assert tokenizer.encode(text) == expected, text


def test_prompts_follow_the_authors_template(model64: emu3p5.Emu3p5Model) -> None:
    ids = model64._tokenizer.ids
    prompt = model64.encode(PROMPT)
    header = [ids["<|image start|>"], *model64._tokenizer.encode("2*3"), ids["<|image token|>"]]
    assert list(prompt.cond) == model64._tokenizer.encode(emu3p5.TEMPLATE.format(question=PROMPT)) + header
    assert list(prompt.uncond) == model64._tokenizer.encode(emu3p5.UNCOND_PROMPT) + header
    assert prompt.cond[0] == prompt.uncond[0] == ids["<|extra_203|>"] and prompt.size == (ROWS, COLS)
    assert model64._tokenizer.encode("2*3") == [ord("2") - 33, ord("*") - 33, ord("3") - 33]  # one id per digit


def test_logits_are_the_networks_over_the_visual_ids(model64: emu3p5.Emu3p5Model, reference: torch.nn.Module) -> None:
    """Cond and uncond rows (left-padded to one length) give transformers' Qwen3 logits at the visual ids."""
    prompt = model64.encode(PROMPT)
    tokens = model64.code_ids[torch.randint(0, IMAGE_CODES, (1, 5), generator=torch.Generator().manual_seed(2))]
    session = model64.start(prompt, batch_size=1)
    ours = [torch.cat(pair, dim=1) for pair in zip(session.prefill(), session.forward(tokens))]
    for branch, prefix in enumerate((prompt.cond, prompt.uncond)):
        with torch.no_grad():
            full = reference(torch.cat([torch.tensor([prefix]), tokens], dim=1)).logits
        assert float((ours[branch] - full[:, len(prefix) - 1:, model64.code_ids]).abs().max()) <= 1e-10


def reference_images(count: int = 1) -> list[torch.Tensor]:
    """ComfyUI IMAGEs at the test's reference size (REF_W x REF_H px, 2 x 3 codes), so that no resize happens."""
    gen = torch.Generator().manual_seed(4)
    return [torch.rand(1, REF_H, REF_W, 3, generator=gen) for _ in range(count)]


@pytest.fixture
def x2i_model(model64: emu3p5.Emu3p5Model):
    model64.reference_area = REF_W * REF_H
    yield model64
    model64.reference_area = emu3p5.REFERENCE_AREA


def x2i_prompt(model: emu3p5.Emu3p5Model, count: int = 1) -> emu3p5.Emu3p5Prompt:
    prompt = model.encode(PROMPT)
    for image in reference_images(count):
        prompt = model.add_image(prompt, image, emu3p5.X2I)
    return prompt


@pytest.mark.parametrize("cfg", [1.0, 5.0])
@pytest.mark.parametrize("window", [1, 8])
@pytest.mark.parametrize("task", ["t2i", "x2i"])
def test_greedy_equals_the_authors_loop(x2i_model: emu3p5.Emu3p5Model, reference: torch.nn.Module, window: int,
                                        cfg: float, task: str) -> None:
    prompt = x2i_prompt(x2i_model) if task == "x2i" else x2i_model.encode(PROMPT)
    expected = torch.tensor([authors_greedy(reference, x2i_model, cfg, prompt)])
    for coupler in ("faithful", "maximal"):
        ours = generate(x2i_model, prompt, SamplerConfig(coupler=coupler, window=window, top_k=1, cfg_scale=cfg,
                                                         seed=5))
        assert torch.equal(ours.tokens, expected), (coupler, window, cfg)


def authors_image_string(model: emu3p5.Emu3p5Model, image: torch.Tensor) -> str:
    """input_utils.format_image_string's layout for an image already at its reference size: visual token
    surface forms, EOL between rows, the header of its own size."""
    rows, cols = REF_H // 16, REF_W // 16
    codes = model.vq.encoder().encode(image.permute(0, 3, 1, 2) * 2 - 1).view(rows, cols)
    lines = ["".join(emu3p5.VISUAL_TOKEN.format(int(code)) for code in row) for row in codes]
    return f"<|image start|>{rows}*{cols}<|image token|>" + emu3p5.EOL.join(lines) + "<|image end|>"


def test_x2i_prompts_are_the_authors_template_with_the_images(x2i_model: emu3p5.Emu3p5Model) -> None:
    """configs/example_config_x2i.py's prompts, <|IMAGE|> replaced by each image's string (inference.py),
    tokenised whole; the output size's header after them, as for t2i."""
    prompt = x2i_prompt(x2i_model, 2)
    images = "".join(authors_image_string(x2i_model, image) for image in reference_images(2))
    template = ("<|extra_203|>You are a helpful assistant for x2i task. USER: <|IMAGE|>{question} ASSISTANT: "
                "<|extra_100|>")
    uncond = "<|extra_203|>You are a helpful assistant. USER: <|IMAGE|> ASSISTANT: <|extra_100|>"
    header = list(x2i_model.encode(PROMPT).cond[-5:])  # <|image start|> 2 * 3 <|image token|>
    encode = x2i_model._tokenizer.encode
    assert list(prompt.cond) == encode(template.format(question=PROMPT).replace("<|IMAGE|>", images)) + header
    assert list(prompt.uncond) == encode(uncond.replace("<|IMAGE|>", images)) + header
    assert prompt.size == (ROWS, COLS) and len(prompt.references) == 2


def test_reference_size_is_the_authors_smart_resize() -> None:
    """About 1024 x 1024 px at the image's aspect, each side rounded to 16 px (input_utils.smart_resize)."""
    assert emu3p5.reference_size(1920, 1080) == (768, 1360)
    assert emu3p5.reference_size(500, 333) == (832, 1248)
    assert emu3p5.reference_size(1024, 1024) == (1024, 1024)


@pytest.mark.parametrize("pixels, codes", [(8, 1), (23, 1), (24, 2), (1000, 63), (1016, 64), (1024, 64),
                                           (1032, 65), (1360, 85)])
def test_grid_sides_round_halves_up_and_keep_a_code(pixels: int, codes: int) -> None:
    """Each side is the nearest count of 16 px codes, halves up (8 px: one code, not Python round's 0; 1000 px:
    62.5 -> 63, not round's 62), as smart_resize rounds a reference image."""
    assert emu3p5.grid_for(pixels, 1024) == (64, codes)
    assert emu3p5.grid_for(1024, pixels) == (codes, 64)
    assert emu3p5.reference_size(pixels, pixels, pixels * pixels) == (codes * 16, codes * 16)


def authors_reference_string(model: emu3p5.Emu3p5Model, image: torch.Tensor, area: int) -> str:
    """input_utils.build_image on the picture a ComfyUI IMAGE was loaded from: smart_resize (about `area` px at
    its aspect, new_height = int(sqrt(area / aspect)), new_width = int(new_height * aspect), each rounded to the
    nearest 16 px, halves up; Pillow's bicubic straight to it), np.array / 127.5 - 1 in float64, the IBQ encoder,
    then format_image_string."""
    import numpy as np
    from PIL import Image

    picture = Image.fromarray((image[0] * 255).round().to(torch.uint8).numpy(), "RGB")
    width, height = picture.size
    aspect = width / height
    new_height = int((area / aspect) ** 0.5)
    new_width = int(new_height * aspect)
    new_height, new_width = ((side + 8) // 16 * 16 for side in (new_height, new_width))
    resized = picture.resize((new_width, new_height), Image.BICUBIC)
    pixels = torch.tensor(np.array(resized) / 127.5 - 1.0).float().permute(2, 0, 1)[None]
    rows, cols = new_height // 16, new_width // 16
    codes = model.vq.encoder().encode(pixels).view(rows, cols)
    lines = ["".join(emu3p5.VISUAL_TOKEN.format(int(code)) for code in row) for row in codes]
    return f"<|image start|>{rows}*{cols}<|image token|>" + emu3p5.EOL.join(lines) + "<|image end|>"


def eight_bit_image(height: int, width: int, seed: int) -> torch.Tensor:
    """A ComfyUI IMAGE as Load Image gives a picture: (1, H, W, 3) levels / 255."""
    levels = torch.randint(0, 256, (1, height, width, 3), generator=torch.Generator().manual_seed(seed))
    return levels.float() / 255


@pytest.mark.parametrize("height, width", [(40, 60), (30, 50), (70, 20), (32, 48)])
def test_reference_codes_are_the_authors_smart_resize_and_encoder(x2i_model: emu3p5.Emu3p5Model, height: int,
                                                                   width: int) -> None:
    """At about REF_W x REF_H px: a smaller picture of the same aspect (40 x 60), one whose aspect the 16 px
    rounding changes (30 x 50 -> 32 x 48, stretched, not cropped), a tall one (70 x 20 -> 80 x 16) and one at
    the size: the reference's ids are the authors' string for it, tokenised (the old path, torch's bicubic after
    a centre crop, gave other codes)."""
    image = eight_bit_image(height, width, seed=height)
    prompt = x2i_model.add_image(x2i_model.encode(PROMPT), image, emu3p5.X2I)
    expected = authors_reference_string(x2i_model, image, REF_W * REF_H)
    assert list(prompt.references[0]) == x2i_model._tokenizer.encode(expected)


def size_text(model: emu3p5.Emu3p5Model, ids: tuple[int, ...]) -> str:
    """The text of size-header ids, each a digit or '*' (the tokenizer writes them one id each)."""
    surface = {model._tokenizer.encode(char)[0]: char for char in "0123456789*"}
    return "".join(surface[token] for token in ids)


def authors_parse_hw(model: emu3p5.Emu3p5Model, uncond: tuple[int, ...]) -> tuple[int, int]:
    """logits_processor.parse_hw on the uncond ids (the processor's __init__ runs it when they hold an image
    token): the digits between the last <|image start|> and the last <|image token|>."""
    ids = model._tokenizer.ids
    last = max(i for i, token in enumerate(uncond) if token == ids[emu3p5.IMAGE_TOKEN])
    start = max(i for i, token in enumerate(uncond[:last]) if token == ids[emu3p5.IMAGE_START])
    rows, cols = size_text(model, uncond[start + 1:last]).split("*")
    return int(rows), int(cols)


def test_x2i_without_a_size_draws_the_last_references_grid(x2i_model: emu3p5.Emu3p5Model) -> None:
    """Width and height 0 (no size asked): the output grid is the last reference image's, as the authors'
    processor forces it from their uncond prompt (parse_hw); a size asked wins, as their target size does."""
    from scd_core.model import set_image_size

    try:
        set_image_size(x2i_model, 0, 0)
        prompt = x2i_model.encode(PROMPT)
        assert not prompt.size_asked and prompt.size == emu3p5.DEFAULT_SIZE
        prompt = x2i_model.add_image(prompt, eight_bit_image(40, 60, seed=1), emu3p5.X2I)
        assert prompt.size == (2, 3)
        prompt = x2i_model.add_image(prompt, eight_bit_image(70, 20, seed=2), emu3p5.X2I)  # the last: 5 x 1 codes
        uncond_without_header = prompt.uncond[:-5]
        assert prompt.size == (5, 1) == authors_parse_hw(x2i_model, uncond_without_header)
        assert size_text(x2i_model, prompt.cond[-4:-1]) == "5*1"  # the header forces 5*1
        tokens = generate(x2i_model, prompt, SamplerConfig(window=4, seed=1)).tokens
        assert tokens.shape == (1, 5 * 2) and x2i_model.decode(tokens).shape == (1, 80, 16, 3)
    finally:
        at_test_size(x2i_model)
    asked = x2i_model.add_image(x2i_model.encode(PROMPT), eight_bit_image(70, 20, seed=2), emu3p5.X2I)
    assert asked.size_asked and asked.size == (ROWS, COLS)


def test_a_one_pixel_reference_is_refused_and_nothing_is_lost(x2i_model: emu3p5.Emu3p5Model) -> None:
    from scd_core.images.image_prompt import add_image

    cond = x2i_model.add_image(x2i_model.encode(PROMPT), eight_bit_image(32, 48, seed=3), emu3p5.X2I)
    before, size = cond, x2i_model.size
    for image, message in ((torch.rand(1, 1, 1, 3), "1 x 1 px: give one of at least 16 x 16 px"),
                           (torch.rand(1, 16, 4000, 3), "rounds to no 16 px code")):
        with pytest.raises(ValueError, match=message) as err:
            add_image(x2i_model, cond, image, "x2i")
        assert "\n" not in str(err.value) and cond == before and x2i_model.size == size
    assert len(x2i_model.add_image(cond, eight_bit_image(32, 48, seed=4), emu3p5.X2I).references) == 2


def test_x2i_through_the_image_prompt_and_its_bad_input(x2i_model: emu3p5.Emu3p5Model,
                                                        tiny_emu3p5_dir: Path, tmp_path: Path) -> None:
    """The SCD Image Prompt's path (task "x2i"): a resized image is noted; a batch, a fourth image, another task,
    a mask and image_cfg are refused in one line each, the conditioning given left as it was."""
    from scd_core.images.image_prompt import add_image, image_tasks

    assert image_tasks(x2i_model) == ("x2i",)
    cond = x2i_model.encode(PROMPT)
    added = add_image(x2i_model, cond, torch.rand(1, 40, 60, 3), "x2i")
    assert "resized to the model's 48 x 32 px" in added.note and len(added.cond.references) == 1
    full = x2i_prompt(x2i_model, 3)
    bad = [(cond, torch.rand(2, REF_H, REF_W, 3), "x2i", {}, "one reference image per SCD Image Prompt"),
           (full, reference_images()[0], "x2i", {}, "already holds 3 reference images"),
           (cond, reference_images()[0], "edit", {}, "it takes x2i"),
           (cond, reference_images()[0], "x2i", dict(mask=torch.ones(1, REF_H, REF_W)), "disconnect the mask"),
           (cond, reference_images()[0], "x2i", dict(image_cfg=2.0), "leave image_cfg")]
    for given, image, task, extra, message in bad:
        before = given
        with pytest.raises(ValueError, match=message) as err:
            add_image(x2i_model, given, image, task, **extra)
        assert "\n" not in str(err.value) and given == before
    base = load_model(Path(shutil.copytree(tiny_emu3p5_dir, tmp_path / "Emu3.5")), device="cpu")
    assert base.image_tasks == ("x2i",)  # the authors' README: Emu3.5 does T2I / X2I too (Emu3.5-Image best)


def test_log_prob_guidance_is_the_engines_distribution(model64: emu3p5.Emu3p5Model,
                                                       reference: torch.nn.Module) -> None:
    """At every visual position of a sequence, the authors' scores softmaxed equal to_probs of the session's
    logits (CFG 5, top-k 7, temperature 1): the log-normalisers cancel."""
    prompt = model64.encode(PROMPT)
    tokens = generate(model64, prompt, SamplerConfig(window=4, seed=1)).tokens
    session = model64.start(prompt, batch_size=1)
    cond, uncond = (torch.cat(pair, dim=1) for pair in zip(session.prefill(), session.forward(tokens[:, :-1])))
    ours = to_probs(cond, uncond, Sampling(cfg_scale=5.0, temperature=1.0, top_k=7, top_p=1.0))[0]
    for position in (p for p in range(N) if p not in model64.forced_tokens):
        fed = tokens[0, :position].tolist()
        scores = authors_scores(reference, [*prompt.cond, *fed], [*prompt.uncond, *fed], 5.0,
                                int(model64.code_ids[0]), 7)
        expected = torch.softmax(scores, -1)[model64.code_ids].float()  # to_probs computes in float32
        assert (expected > 0).sum() == 7
        torch.testing.assert_close(ours[position], expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("coupler", ["maximal", "faithful"])
def test_output_law_is_the_authors(model64: emu3p5.Emu3p5Model, reference: torch.nn.Module, coupler: str) -> None:
    """Chi-square of whole 1 x 2 images (two codes, then the forced image end) against the law the authors' rules
    give, enumerated: CFG 5, top-k 3 after the log-prob guidance."""
    at_test_size(model64, 32, 16)
    try:
        prompt = model64.encode(PROMPT)
        first = int(model64.code_ids[0])
        law, end = {}, model64.forced_tokens[2]
        p0 = torch.softmax(authors_scores(reference, list(prompt.cond), list(prompt.uncond), 5.0, first, 3), -1)
        for a in torch.nonzero(p0).flatten().tolist():
            p1 = torch.softmax(authors_scores(reference, [*prompt.cond, a], [*prompt.uncond, a], 5.0, first, 3), -1)
            for b in torch.nonzero(p1).flatten().tolist():
                law[(a, b, end)] = float(p0[a] * p1[b])
        result = generate(model64, prompt, SamplerConfig(coupler=coupler, window=3, cfg_scale=5.0, top_k=3, seed=11),
                          batch_size=6000)
        assert len(law) == 9 and chi_square_pvalue(result.tokens, law) > P_MIN
    finally:
        at_test_size(model64)


def test_faithful_window_8_gives_the_window_1_tokens(model64: emu3p5.Emu3p5Model) -> None:
    prompt = model64.encode(PROMPT)
    for seed in (0, 1):
        ar = generate(model64, prompt, SamplerConfig(coupler="faithful", window=1, seed=seed), batch_size=2)
        jacobi = generate(model64, prompt, SamplerConfig(coupler="faithful", window=8, seed=seed), batch_size=2)
        assert torch.equal(ar.tokens, jacobi.tokens) and jacobi.nfe < ar.nfe


def test_rows_at_their_own_pace_give_the_window_1_tokens(model64: emu3p5.Emu3p5Model) -> None:
    assert_own_pace_gives_ar_tokens(model64, model64.encode(PROMPT), seed=2)


@pytest.mark.parametrize("coupler", COUPLERS)
def test_every_coupler_generates_and_decodes(tiny_emu3p5_dir: Path, coupler: str) -> None:
    model = at_test_size(load_model(tiny_emu3p5_dir, device="cpu", dtype="float32"))
    result = generate(model, model.encode(PROMPT), SamplerConfig(coupler=coupler, window=4, seed=3), batch_size=2)
    assert result.tokens.shape == (2, N)
    for position, token in model.forced_tokens.items():
        assert (result.tokens[:, position] == token).all()
    free = [p for p in range(N) if p not in model.forced_tokens]
    assert torch.isin(result.tokens[:, free], model.code_ids).all()
    images = model.decode(result.tokens)
    assert images.shape == (2, HEIGHT, WIDTH, 3) and 0 <= float(images.min()) and float(images.max()) <= 1


def test_decode_looks_codes_up_and_encode_takes_the_largest_dot_product(model64: emu3p5.Emu3p5Model) -> None:
    """The IBQ rules written out: decode = post_quant_conv, decoder of the codebook rows; encode = the argmax over
    the codebook of z.e (with entries of different lengths this differs from the nearest entry)."""
    vq = model64.vq
    codes = torch.randint(0, IMAGE_CODES, (1, ROWS * COLS), generator=torch.Generator().manual_seed(0))
    tokens = torch.full((1, N), model64.forced_tokens[3])
    tokens[0, [p for p in range(N) if p not in model64.forced_tokens]] = model64.code_ids[codes[0]]
    book = vq.decoder.quantize.embedding.weight
    latent = book[codes[0]].T.reshape(1, -1, ROWS, COLS)
    with torch.no_grad():
        expected = vq.decoder.decoder(vq.decoder.post_quant_conv(latent), None)
    torch.testing.assert_close(model64.decode(tokens), ((expected + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1).float())
    encoder = vq.encoder()
    pixels = torch.rand(1, 3, HEIGHT, WIDTH) * 2 - 1
    with torch.no_grad():
        z = encoder.quant_conv(encoder.encoder(pixels)).permute(0, 2, 3, 1).flatten(1, 2)
    dot = (z @ book.T.float()).argmax(-1)
    nearest = torch.cdist(z, book.float().unsqueeze(0)).argmin(-1)
    assert torch.equal(encoder.encode(pixels), dot) and not torch.equal(dot, nearest)


# ---- bad input: one line each, nothing loaded ----

def copy_of(tiny_emu3p5_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_emu3p5_dir, tmp_path / "Emu3.5-Image"))


class TrainingHyperParameters:
    """What a training checkpoint may pickle next to its weights; weights_only refuses it."""


def test_unsafe_vq_checkpoint_is_refused_with_the_converter_command(tiny_emu3p5_dir: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    folder = copy_of(tiny_emu3p5_dir, tmp_path)
    checkpoint = folder / "vision_tokenizer" / "model.ckpt"
    torch.save({"state_dict": vq_state(0), "hyper_parameters": TrainingHyperParameters()}, str(checkpoint))
    with pytest.raises(ModelLoadError) as refused:
        load_model(folder, device="cpu")
    message = str(refused.value)
    command = f"python -m scd_core.models.tokenizers.ibq {checkpoint} --allow test_emu3p5.TrainingHyperParameters"
    assert "\n" not in message and "was refused" in message and message.endswith(command)
    assert not (checkpoint.parent / "model.safetensors").exists()
    ibq.main([str(checkpoint), "--allow", "test_emu3p5.TrainingHyperParameters"])  # what the user runs
    assert "wrote" in capsys.readouterr().out
    assert load_model(folder, device="cpu").vq.source.endswith("model.safetensors")


def test_original_emu3_gen_layout_is_still_emu3s(tmp_path: Path) -> None:
    config = {"model_type": "Emu3", "auto_map": {"AutoModelForCausalLM": "modeling_emu3.Emu3ForCausalLM"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.layers.0.self_attn.q_proj.weight": "model-00001-of-00002.safetensors"}}))
    assert not emu3p5.detect(tmp_path) and detect_family(tmp_path) is emu3


@pytest.mark.parametrize("remove, message", [
    ("emu3.tiktoken", "lacks emu3.tiktoken: copy them from src/tokenizer_emu3_ibq/"),
    ("vision_tokenizer", "has no VisionTokenizer: download BAAI/Emu3.5-VisionTokenizer"),
    ("vision_tokenizer/model.ckpt", "has neither model.ckpt nor model.safetensors")])
def test_missing_parts_are_named(tiny_emu3p5_dir: Path, tmp_path: Path, remove: str, message: str) -> None:
    folder = copy_of(tiny_emu3p5_dir, tmp_path)
    path = folder / remove
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    with pytest.raises(ModelLoadError, match=message):
        load_model(folder, device="cpu")


def test_mixed_tokenizer_and_config_are_refused(tiny_emu3p5_dir: Path, tmp_path: Path) -> None:
    folder = copy_of(tiny_emu3p5_dir, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "boi_token_id": 151852}))
    with pytest.raises(ModelLoadError, match="boi_token_id 151852 is not the tokenizer files' id"):
        load_model(folder, device="cpu")


def test_bad_sizes_and_prompts_get_one_line(model64: emu3p5.Emu3p5Model) -> None:
    with pytest.raises(ValueError, match="at least 8"):
        model64.set_image_size(0, 32)
    try:
        model64.set_image_size(1024, 1024)  # 64 x 65 positions exceed the tiny model's 512
        with pytest.raises(ValueError, match="exceed the model's 512 positions: ask for a smaller image"):
            model64.start(model64.encode(PROMPT), 1)
    finally:
        at_test_size(model64)
    with pytest.raises(ValueError, match="no negative prompt"):
        model64.encode(PROMPT, "blurry")
    with pytest.raises(ValueError, match=r"cond must come from Emu3p5Model\.encode\(\)"):
        model64.start(PROMPT, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=rf"\(batch, {N}\)"):
        model64.decode(torch.zeros(1, N - 1, dtype=torch.long))


def test_the_bench_stand_in_has_the_adapters_layout(model64: emu3p5.Emu3p5Model) -> None:
    """`bench emu3p5`'s synthetic model forces the cells the adapter forces, on the same grid, at every size."""
    from scd_core.bench.emu3p5 import Emu3p5ShapedModel

    for width, height in ((WIDTH, HEIGHT), (1024, 1024), (1360, 768)):
        model64.set_image_size(width, height)
        stand_in = Emu3p5ShapedModel(*model64.size, codes=64)
        assert (stand_in.grid, stand_in.num_tokens) == (model64.grid, model64.num_tokens)
        assert sorted(stand_in.forced_tokens) == sorted(model64.forced_tokens)
    assert stand_in.default_top_k == 2  # 5120 of 131072 codes, scaled to 64
    at_test_size(model64)
