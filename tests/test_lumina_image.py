"""Images into Lumina-mGPT's prompt: `encode_image` (both tokenizers' encoders) and 2.0-Omni's image tasks."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from lumina_fixture import (BOI, CHAMELEON_VQ, END_OF_TURN, EOI, MOVQ_OFFSET, MOVQ_VQ, RESOLUTION_1, RESOLUTION_2,
                            ROW_END, SIDE, SPECIAL_IDS_1, SPECIAL_IDS_2, tiny_lumina2_dir,  # noqa: F401
                            tiny_lumina_dir)  # noqa: F401

from scd_core import SamplerConfig, generate, load_model
from scd_core.decoding.given import GivenCells
from scd_core.models.families import lumina
from scd_core.models.weights.checkpoints import read_weights
from scd_core.models.weights.tokenizer_files import TextTokenizer

PROMPT = "a rubber basketball on a sunlit court"


@pytest.fixture(scope="module")
def model1(tiny_lumina_dir: Path) -> lumina.LuminaModel:
    return load_model(tiny_lumina_dir, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def model2(tiny_lumina2_dir: Path) -> lumina.LuminaModel:
    return load_model(tiny_lumina2_dir, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def omni_dir(tiny_lumina2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 2.0 layout under the Omni repository's name, which is what tells the two apart."""
    folder = tmp_path_factory.mktemp("omni") / "Lumina-mGPT-2.0-Omni"
    shutil.copytree(tiny_lumina2_dir, folder)
    return folder


@pytest.fixture(scope="module")
def omni(omni_dir: Path) -> lumina.LuminaModel:
    return load_model(omni_dir, device="cpu", dtype="float32")


def eight_bit_images(batch: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    """ComfyUI images whose values are exact 8-bit levels, so the authors' uint8 round trip changes nothing."""
    levels = torch.randint(0, 256, (batch, height, width, 3), generator=torch.Generator().manual_seed(seed))
    return levels.float() / 255


def transformers_codes(vq_file: Path, spec: dict, resolution: int, pixels: torch.Tensor) -> torch.Tensor:
    """transformers' ChameleonVQVAE (an independent implementation of the same taming encoder and nearest-code
    quantiser) holding the checkpoint's encoder: its codes for `pixels` (B, 3, H, W) in [-1, 1]."""
    from transformers import ChameleonVQVAEConfig
    from transformers.models.chameleon.modeling_chameleon import ChameleonVQVAE

    widths = spec["widths"]
    base = widths[0]
    # attention at a level is configured by the feature-map side there (resolution halved per level)
    attn = [resolution // 2 ** level for level in spec["attn_levels"]]
    config = ChameleonVQVAEConfig(embed_dim=spec["embed"], num_embeddings=spec["codes"], double_latent=False,
                                  latent_channels=spec["z"], resolution=resolution, in_channels=3,
                                  base_channels=base, channel_multiplier=[w // base for w in widths],
                                  num_res_blocks=spec["blocks"], attn_resolutions=attn, dropout=0.0)
    reference = ChameleonVQVAE(config).double().eval()
    state = read_weights(vq_file)
    wanted = reference.state_dict()
    reference.load_state_dict({key: state[key].double() for key in wanted}, strict=True)
    with torch.no_grad():
        out = reference.encode(pixels.double())
    codes = out.image_tokens if hasattr(out, "image_tokens") else out[2]
    return codes.view(pixels.shape[0], -1)


@pytest.mark.parametrize("which", ["1", "2"])
def test_encode_image_gives_transformers_codes_at_the_engines_positions(which: str, model1: lumina.LuminaModel,
                                                                        model2: lumina.LuminaModel,
                                                                        tiny_lumina_dir: Path,
                                                                        tiny_lumina2_dir: Path) -> None:
    model, folder, spec, size, ids, vq_file = (
        (model1, tiny_lumina_dir, CHAMELEON_VQ, RESOLUTION_1, SPECIAL_IDS_1, "vqgan.ckpt") if which == "1" else
        (model2, tiny_lumina2_dir, MOVQ_VQ, RESOLUTION_2, SPECIAL_IDS_2, "movqgan_270M.ckpt"))
    model.set_image_size(size, size)
    images = eight_bit_images(2, size, size)
    pixels = images.permute(0, 3, 1, 2).double() * 2 - 1  # already the size: the crop is the identity
    codes = transformers_codes(folder / vq_file, spec, size, pixels)
    tokens = model.encode_image(images)
    assert tokens.shape == (2, model.num_tokens) and tokens.dtype == torch.long
    grid = tokens[:, :-1].view(2, SIDE, SIDE + 1)
    assert (grid[:, :, -1] == ids[ROW_END]).all() and (tokens[:, -1] == ids[EOI]).all()
    assert torch.equal(grid[:, :, :-1].flatten(1), model.code_ids[codes])
    if which == "2":
        assert torch.equal(grid[:, :, :-1].flatten(1), codes + MOVQ_OFFSET)
    # the engine's forced positions hold the forced tokens, and decode takes the result
    assert all((tokens[:, position] == token).all() for position, token in model.forced_tokens.items())
    assert model.decode(tokens).shape == (2, size, size, 3)


def test_encoder_loads_on_first_use_only_and_encodes_in_float32(tiny_lumina_dir: Path) -> None:
    """As the authors' tokenizers encode (created in float32, only moved to the device): a bfloat16 model gives the
    codes of a float32 one."""
    model = load_model(tiny_lumina_dir, device="cpu", dtype="bfloat16")
    assert model._encoder is None  # generation never reads the encoder
    images = eight_bit_images(2, RESOLUTION_1, RESOLUTION_1, seed=7)
    codes = model.encode_image(images)
    assert model._encoder is not None and model._encoder.quant_conv.weight.dtype == torch.float32
    assert torch.equal(codes, load_model(tiny_lumina_dir, device="cpu", dtype="float32").encode_image(images))


def test_center_crop_follows_the_authors_steps() -> None:
    """A 40 x 100 image to 16 x 16: halved once with a box filter (40 >= 32 and 100 >= 32) to 20 x 50, bicubic by
    max(16/20, 16/50) = 0.8 to 16 x 40, then rows 12..27 (the centre, (40 - 16) // 2 = 12)."""
    from PIL import Image

    images = eight_bit_images(1, 100, 40, seed=3)
    with pytest.warns(UserWarning, match="40 x 100 px"):
        got = lumina.authors_center_crop(images, 16, 16)
    pil = Image.fromarray((images[0] * 255).round().to(torch.uint8).numpy(), "RGB")
    resized = torch.from_numpy(np.asarray(pil.resize((20, 50), resample=Image.BOX).resize((16, 40), resample=Image.BICUBIC), dtype=np.float64))
    expected = (resized.view(40, 16, 3)[12:28] / 255 * 2 - 1).permute(2, 0, 1).float()
    assert got.shape == (1, 3, 16, 16) and torch.equal(got[0], expected)


def test_center_crop_halves_large_images_with_a_box_filter_first() -> None:
    from PIL import Image

    images = eight_bit_images(1, 64, 64, seed=4)
    with pytest.warns(UserWarning):
        got = lumina.authors_center_crop(images, 16, 16)
    pil = Image.fromarray((images[0] * 255).round().to(torch.uint8).numpy(), "RGB")
    pil = pil.resize((32, 32), resample=Image.BOX).resize((16, 16), resample=Image.BOX)  # twice: 64 -> 32 -> 16
    pil = pil.resize((16, 16), resample=Image.BICUBIC)  # scale 1: the authors still resample
    expected = torch.from_numpy(np.asarray(pil, dtype=np.float64)) / 255 * 2 - 1
    assert torch.equal(got[0], expected.permute(2, 0, 1).float())


def test_bad_images_are_refused_naming_the_shape(model2: lumina.LuminaModel) -> None:
    with pytest.raises(ValueError, match=r"\(batch, height, width, 3\), got \(2, 3, 32, 32\)"):
        model2.encode_image(torch.zeros(2, 3, 32, 32))


def test_omni_is_told_by_its_folder_and_offers_the_authors_tasks(omni: lumina.LuminaModel,
                                                                  model2: lumina.LuminaModel,
                                                                  model1: lumina.LuminaModel) -> None:
    assert omni.image_tasks == ("depth", "canny", "subject")
    assert model2.image_tasks == () and model1.image_tasks == ()
    with pytest.raises(ValueError, match=r"task 'depth' .*Lumina-mGPT 2\.0 checkpoint.*Omni"):
        model2.add_image(model2.encode(PROMPT), eight_bit_images(1, 32, 32), "depth")
    with pytest.raises(ValueError, match=r"task 'edit' .*Lumina-mGPT 2\.0-Omni checkpoint.*depth, canny, subject"):
        omni.add_image(omni.encode(PROMPT), eight_bit_images(1, 32, 32), "edit")


def omni_cond(omni: lumina.LuminaModel, task: str):
    omni.set_image_size(32, 64)  # a 32 x 64 panel: 4 code columns, 8 rows; the given upper half is 32 x 32
    try:
        return omni.omni_cells(omni.encode(PROMPT), eight_bit_images(1, 32, 32, seed=5), task)
    finally:
        omni.set_image_size(RESOLUTION_2, RESOLUTION_2)


@pytest.mark.parametrize("task, panel", [("depth", "depth map"), ("canny", "canny edge map"),
                                         ("subject", "Bubbly and effervescent with a sparkling allure.")])
def test_omni_prompt_ids_are_the_authors(task: str, panel: str, omni: lumina.LuminaModel, omni_dir: Path) -> None:
    """Expected ids written from reading the authors' i2i path (generate.py --task i2i, inference_solver.generate,
    data/item_processor.process_i2i_image, data/convertsation.py): the question is their dual-panel template at the
    panel's W x H; the conversation is BOS, question, <reserved08706>, then the answer '<|image|>' (replaced by the
    image's ids) and a final <reserved08706> that they pop; the image's ids are <racm3:break>, the size tokens
    <reserved{8800 + n}> for the panel's height then width in 32 px cells (their h_grid_dim doubles the half
    image's), and the half image's code rows (155000 + code), each closed by the row-end, with no end-of-image:
    the model continues with the lower half.  Their unconditional context starts at <racm3:break>."""
    prompt, tokens, keep = omni_cond(omni, task)
    text = (f"Generate a dual-panel image of 32x64 where the <upper half> displays a <{panel}>, while the "
            f"<lower half> retains the original image for direct visual comparison:\n{PROMPT}")
    ids = SPECIAL_IDS_2
    header = [ids[BOI], ids["<reserved08802>"], ids["<reserved08801>"]]  # height 64 px = 2 cells, width 1
    expected_cond = [ids["<s>"], *TextTokenizer(omni_dir).encode(text), ids[END_OF_TURN], *header]
    assert list(prompt.cond) == expected_cond and list(prompt.uncond) == header
    omni.set_image_size(32, 32)
    upper = omni.encode_image(eight_bit_images(1, 32, 32, seed=5))[:, :-1]  # 4 rows x (4 codes + row-end)
    omni.set_image_size(RESOLUTION_2, RESOLUTION_2)
    assert tokens.shape == (1, 8 * 5 + 1) and torch.equal(tokens[:, :20], upper)
    assert keep[:, :20].all() and not keep[:, 20:].any()


def test_omni_guidance_is_at_the_floor_where_it_samples(omni: lumina.LuminaModel) -> None:
    """Their processor updates its scale first at the first sampled token, n = 2 + 20 >= 4 * cells = 8, so any
    scale but 1 acts as 4 there and after; the per-position schedule agrees at every sampled position."""
    omni.set_image_size(32, 64)
    try:
        for scale in (2.0, 4.0, 7.5, 30.0):
            assert torch.equal(omni.cfg_schedule(scale)[20:], torch.full((21,), 4.0))
        assert omni.cfg_schedule(1.0) is None
    finally:
        omni.set_image_size(RESOLUTION_2, RESOLUTION_2)


def test_omni_refuses_a_panel_that_does_not_halve(omni: lumina.LuminaModel) -> None:
    omni.set_image_size(32, 32)
    with pytest.raises(ValueError, match="32 x 32.*512 x 1024"):
        omni.add_image(omni.encode(PROMPT), eight_bit_images(1, 32, 32), "depth")


def test_omni_panel_decodes_as_the_authors_decode_it(omni: lumina.LuminaModel) -> None:
    """Their decode_ids: the given ref tokens then the generated ones, <racm3:break> .. <eoss>: after the two size
    tokens, every id but the row-end, minus 155000, decoded by MoVQGAN at (4 h) x (4 w) codes, pixels (x + 1) / 2."""
    _, tokens, keep = omni_cond(omni, "depth")
    lower = torch.randint(0, 256, (tokens.shape[1],), generator=torch.Generator().manual_seed(6)) + MOVQ_OFFSET
    forced = torch.zeros_like(keep[0])
    omni.set_image_size(32, 64)
    try:
        forced[list(omni.forced_tokens)] = True
        tokens[0] = torch.where(keep[0] | forced, tokens[0], lower)  # a sampled lower half
        got = omni.decode(tokens)
    finally:
        omni.set_image_size(RESOLUTION_2, RESOLUTION_2)
    body = [t for t in tokens[0, :-1].tolist() if t != SPECIAL_IDS_2[ROW_END]]
    codes = torch.tensor(body) - MOVQ_OFFSET
    with torch.no_grad():
        pixels = omni.module["vq"].decode(codes.view(1, -1), 8, 4)
    expected = ((pixels + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1)
    assert got.shape == (1, 64, 32, 3) and torch.allclose(got, expected, atol=1e-6)


def test_an_empty_omni_folder_is_told_what_to_download() -> None:
    from scd_core.models.loading import download_hint

    assert "Alpha-VLLM/Lumina-mGPT-2.0-Omni" in download_hint("Lumina-mGPT-2.0-Omni")
    assert "Omni" not in download_hint("Lumina-mGPT-2.0")



def test_omni_generation_keeps_the_given_half_and_faithful_windows_agree(omni_dir: Path) -> None:
    """Through the engine: the given upper half comes back unchanged, and faithful windows give window 1's tokens."""
    model = load_model(omni_dir, device="cpu", dtype=torch.float64)
    model.set_image_size(32, 64)
    cond = model.add_image(model.encode(PROMPT), eight_bit_images(1, 32, 32, seed=5), "depth")
    assert isinstance(cond, GivenCells)
    ar = generate(model, cond, SamplerConfig(coupler="faithful", window=1, seed=3), batch_size=2)
    assert torch.equal(ar.tokens[:, :20], cond.tokens[:, :20].expand(2, -1))
    for window in (4, 9):
        result = generate(model, cond, SamplerConfig(coupler="faithful", window=window, seed=3), batch_size=2)
        assert torch.equal(result.tokens, ar.tokens) and result.nfe < ar.nfe
    assert model.decode(ar.tokens).shape == (2, 64, 32, 3)
