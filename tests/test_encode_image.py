"""Images in the prompt: `encode_image` turns ComfyUI images into the tokens a family decodes.

Checked against independent implementations on the tiny checkpoints: transformers' JanusVQVAE (the VQ-16 design
LlamaGen's and Janus's tokenizers share) for LlamaGen's encoder, and transformers' own Janus and Emu3 VQ-VAEs
loaded from the same folders.  The encoders load on the first image only.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from emu3_fixture import IMAGE_CODES as EMU3_CODES
from emu3_fixture import tiny_emu3_dir  # noqa: F401  (fixture)
from llamagen_fixture import IMAGE_SIZE, TINY_VQ, write_original_c2i, write_safetensors_c2i

from scd_core import SamplerConfig, generate, load_model
from scd_core.images.image_input import encode_images, fit_note, no_image_encoder, prepare_images
from scd_core.models.pixels import one_thread
from scd_core.models.families import janus as janus_family

ROWS, COLS = 3, 4  # the Emu3 test size: 32 x 24 px


def fine_ramp(height: int, width: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    """Smooth random images (batch, height, width, 3) in 0..1, finer than 8 bits."""
    coarse = torch.rand(batch, 3, 4, 4, generator=torch.Generator().manual_seed(seed))
    return F.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=True).permute(0, 2, 3, 1)


def ramp(height: int, width: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    """`fine_ramp` at 8 bits: what ComfyUI's Load Image gives for a picture (its levels / 255)."""
    return (fine_ramp(height, width, batch, seed) * 255).round() / 255


def pil_of(image: torch.Tensor) -> "Image.Image":
    """One (H, W, 3) IMAGE in 0..1 as the 8-bit PIL picture it was loaded from."""
    from PIL import Image

    return Image.fromarray((image * 255).round().to(torch.uint8).numpy(), "RGB")


def as_image(picture: "Image.Image") -> torch.Tensor:
    """A PIL picture as a ComfyUI IMAGE of one, (1, H, W, 3) levels / 255."""
    return torch.from_numpy(np.asarray(picture).copy())[None].float() / 255


def module_size(module: torch.nn.Module) -> int:
    return sum(t.numel() for t in (*module.parameters(), *module.buffers()))


# ----------------------------------------------------------------------------- image_input

@pytest.mark.parametrize("make", [ramp, fine_ramp])
def test_an_image_at_the_size_is_used_as_given_in_the_value_range(make: Any) -> None:
    images = make(24, 32, batch=2)
    prepared = prepare_images(images, (24, 32))
    assert prepared.note == ""
    torch.testing.assert_close(prepared.pixels, images.permute(0, 3, 1, 2) * 2 - 1, rtol=0, atol=1e-6)
    assert torch.equal(prepare_images(images, (24, 32), value_range=(0.0, 1.0)).pixels, images.permute(0, 3, 1, 2))


def test_crop_covers_the_size_and_keeps_the_middle() -> None:
    images = torch.zeros(1, 40, 80, 3)
    images[:, :, 10:70] = 1.0  # a white middle between black sides, wider than the cut (bicubic blurs its edges)
    prepared = prepare_images(images, (16, 16), "crop", value_range=(0.0, 1.0))
    assert prepared.pixels.shape == (1, 3, 16, 16)
    assert prepared.pixels.min() > 0.99  # the square cut from the middle is all white
    assert prepared.note == ("the 80 x 40 px image was resized to the model's 16 x 16 px "
                             "(scaled to cover it and centre-cropped)")


def test_pad_fits_inside_and_fills_with_the_background() -> None:
    images = torch.ones(1, 40, 80, 3)
    prepared = prepare_images(images, (32, 32), "pad", value_range=(0.0, 1.0), fill=64 / 255)
    pixels = prepared.pixels[0]
    assert pixels.shape == (3, 32, 32)
    # 80 x 40 -> 32 x 16, centred: rows 8..23 hold the image, the rest is the fill colour
    assert torch.equal(pixels[:, :8], torch.full((3, 8, 32), 64 / 255))
    assert torch.equal(pixels[:, 24:], torch.full((3, 8, 32), 64 / 255))
    assert pixels[:, 8:24].min() > 0.99
    assert "scaled to fit inside it and padded" in prepared.note


def test_same_aspect_resize_is_noted_without_crop_or_pad() -> None:
    assert fit_note((48, 64), (24, 32), "crop") == "the 64 x 48 px image was resized to the model's 32 x 24 px"
    assert fit_note((24, 32), (24, 32), "pad") == ""


@pytest.mark.parametrize("images, message", [
    ([[0.5]], "ComfyUI IMAGE tensor"),
    (torch.zeros(1, 8, 8, 4), r"RGB, got shape \(1, 8, 8, 4\)"),
    (torch.zeros(1, 8, 8, 3, dtype=torch.uint8), "float in 0..1"),
    (torch.full((1, 8, 8, 3), 255.0), "0..1.*got 255..255"),
])
def test_bad_images_are_refused_naming_what_was_given(images: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        prepare_images(images, (8, 8))


def test_a_family_without_an_image_encoder_says_so() -> None:
    video_model = SimpleNamespace(family="cosmos")
    with pytest.raises(ValueError, match=r"this model \(cosmos\) has no image encoder"):
        encode_images(video_model, ramp(8, 8))
    assert "no image encoder" in str(no_image_encoder(object()))


# ----------------------------------------------------------------------------- LlamaGen and the demo

def vq16_to_janus_names(name: str) -> str:
    """A VQ-16 encoder parameter name (LlamaGen's checkpoints) -> transformers' JanusVQVAE name."""
    for ours, theirs in (("encoder.mid.0.", "encoder.mid.block_1."), ("encoder.mid.1.", "encoder.mid.attn_1."),
                         ("encoder.mid.2.", "encoder.mid.block_2.")):
        if name.startswith(ours):
            return theirs + name[len(ours):]
    return name.replace("encoder.conv_blocks.", "encoder.down.").replace(".res.", ".block.")


def janus_vq_holding(encoder: torch.nn.Module) -> torch.nn.Module:
    """transformers' JanusVQVAE with the weights of a VQ-16 encoder side (the same design, other names)."""
    from transformers import JanusVQVAE, JanusVQVAEConfig

    cfg = encoder.config
    config = JanusVQVAEConfig(embed_dim=cfg.codebook_embed_dim, num_embeddings=cfg.codebook_size,
                              base_channels=cfg.ch, latent_channels=cfg.z_channels,
                              channel_multiplier=list(cfg.ch_mult), num_res_blocks=cfg.num_res_blocks)
    vq = JanusVQVAE(config).eval()
    state = {vq16_to_janus_names(name): tensor for name, tensor in encoder.state_dict().items()}
    missing, unexpected = vq.load_state_dict(state, strict=False)
    assert not unexpected and all(name.startswith(("decoder.", "post_quant_conv.")) for name in missing)
    return vq


def authors_codes(vq: torch.nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """The VQ-16 quantiser's codes (latents and codebook L2-normalised), computed by transformers' modules: its
    encoder and quant_conv, and its nearest-code search over unit vectors."""
    import copy

    quantizer = copy.deepcopy(vq.quantize)
    with torch.no_grad():
        quantizer.embedding.weight.copy_(F.normalize(quantizer.embedding.weight, dim=-1))
        latents = F.normalize(vq.quant_conv(vq.encoder(pixels)), dim=1)
        return quantizer(latents)[2].view(pixels.shape[0], -1)


@pytest.mark.parametrize("write", [write_original_c2i, write_safetensors_c2i])
def test_llamagen_encoder_loads_on_the_first_image_and_is_transformers_vq16(write, tmp_path: Path) -> None:
    model = load_model(write(tmp_path / "m"), "cpu", torch.float32)
    assert model.image_encoder.module is None and not hasattr(model.module["vq"], "encoder")
    size = module_size(model.module)
    images = ramp(IMAGE_SIZE, IMAGE_SIZE, batch=3)
    codes = model.encode_image(images)
    assert codes.shape == (3, model.num_tokens) and codes.dtype == torch.long
    encoder = model.image_encoder.module
    assert encoder is not None and encoder.config == TINY_VQ
    assert module_size(model.module) == size  # the encoder is kept apart from the network the sampler runs
    assert module_size(encoder) == model.image_encoder.weight_count()  # what the note announces
    reference = janus_vq_holding(encoder)
    assert torch.equal(codes, authors_codes(reference, images.permute(0, 3, 1, 2) * 2 - 1))
    assert model.decode(codes).shape == (3, IMAGE_SIZE, IMAGE_SIZE, 3)


def test_loading_says_what_the_encoder_will_add(caplog: pytest.LogCaptureFixture) -> None:
    model = load_model("demo", "cpu")
    note = model.image_encoder.note()
    assert "the demo's VQ encoder loads on the first image" in note and "MiB" in note
    with caplog.at_level(logging.INFO, logger="scd_core"):
        model.encode_image(ramp(64, 64))
        model.encode_image(ramp(64, 64))
    loaded = [r.getMessage() for r in caplog.records if "loaded the demo's VQ encoder" in r.getMessage()]
    assert len(loaded) == 1 and "MiB (float32)" in loaded[0]


def test_demo_samples_come_back_as_mostly_the_same_tokens() -> None:
    """decode -> encode_image on the demo's own samples: measured 72% of the codes back on 30 samples (one to
    three seeds a digit; every image 63-79%), the others near-duplicate codes (cosine 0.97), pixels 0.8% apart."""
    model = load_model("demo", "cpu")
    tokens = torch.cat([generate(model, model.encode(str(digit)), SamplerConfig(window=16, seed=digit)).tokens
                        for digit in range(10)])
    images = model.decode(tokens)
    again = model.encode_image(images)
    share = (again == tokens).float().mean(dim=1)
    assert share.mean() > 0.65 and share.min() > 0.55, share
    assert (model.decode(again) - images).abs().mean() < 0.02


def test_a_wrong_size_image_is_cropped_with_a_note(caplog: pytest.LogCaptureFixture) -> None:
    model = load_model("demo", "cpu")
    wide = ramp(64, 96, batch=2, seed=1)
    with caplog.at_level(logging.WARNING, logger="scd_core"):
        codes = model.encode_image(wide)
    assert "the 96 x 64 px image was resized to the model's 64 x 64 px (scaled to cover it and centre-cropped)" \
        in caplog.text
    assert torch.equal(codes, model.encode_image(wide[:, :, 16:80]))  # the middle square, as given


def adm_centre_crop(picture: "Image.Image", side: int) -> "Image.Image":
    """LlamaGen's center_crop_arr (github:FoundationVision/LlamaGen, dataset/augmentation.py, ADM's), step by
    step: box-halved while the shorter side is at least twice `side`, bicubic so the shorter side is `side`
    (both sides rounded), then the middle square."""
    from PIL import Image

    while min(picture.size) >= 2 * side:
        picture = picture.resize(tuple(length // 2 for length in picture.size), resample=Image.BOX)
    scale = side / min(picture.size)
    picture = picture.resize(tuple(round(length * scale) for length in picture.size), resample=Image.BICUBIC)
    levels = np.asarray(picture)
    top, left = (levels.shape[0] - side) // 2, (levels.shape[1] - side) // 2
    return Image.fromarray(levels[top:top + side, left:left + side])


@pytest.mark.parametrize("height, width", [(150, 200), (64, 100), (40, 30)])
def test_llamagen_crops_as_center_crop_arr(height: int, width: int) -> None:
    """Halved by the box filter (150 x 200), only resized (64 x 100), enlarged (40 x 30): the pixels and the
    codes are those of the authors' crop (torch's crop-then-resize, the old path, gave others)."""
    model = load_model("demo", "cpu")
    side = model.image_size
    image = ramp(height, width, seed=height)
    expected = as_image(adm_centre_crop(pil_of(image[0]), side))
    got = prepare_images(image, (side, side), "crop", value_range=(0.0, 1.0)).pixels
    assert torch.equal(got, expected.permute(0, 3, 1, 2))
    assert torch.equal(model.encode_image(image), model.encode_image(expected))


# ----------------------------------------------------------------------------- Janus-Pro

@pytest.fixture(scope="module")
def janus_pair(tiny_janus_dir: Path) -> tuple:
    from transformers import JanusForConditionalGeneration

    reference = JanusForConditionalGeneration.from_pretrained(str(tiny_janus_dir)).eval()
    return load_model(tiny_janus_dir, "cpu", torch.float32), reference


def test_janus_encoder_loads_on_the_first_image_with_the_authors_quantiser(janus_pair: tuple) -> None:
    model, reference = janus_pair
    assert model.image_encoder.module is None
    assert not hasattr(model.module.model.vqmodel, "encoder") and not hasattr(model.module.model.vqmodel, "quant_conv")
    images = ramp(model.image_pixels, model.image_pixels, batch=2)
    codes = model.encode_image(images)
    assert codes.shape == (2, model.num_tokens) and model.image_encoder.module is not None
    # the tiny codebook's rows are not of unit length: the L2-normalised rule decides (not transformers' own
    # quantiser, which compares unnormalised vectors)
    assert torch.equal(codes, authors_codes(reference.model.vqmodel, images.permute(0, 3, 1, 2) * 2 - 1))


def unit_codebook_copy(folder: Path, target: Path) -> Path:
    """The Janus folder with its VQ codebook rows scaled to unit length (as the authors' VQ initialises them):
    there the normalised and the plain nearest code agree, so transformers' own encode is an oracle."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, target)
    state = load_file(str(target / "model.safetensors"))
    key = "model.vqmodel.quantize.embedding.weight"
    state[key] = F.normalize(state[key], dim=-1)
    save_file(state, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


def test_janus_codes_and_reconstruction_are_transformers(tiny_janus_dir: Path, tmp_path: Path) -> None:
    from transformers import JanusForConditionalGeneration

    folder = unit_codebook_copy(tiny_janus_dir, tmp_path / "unit")
    model = load_model(folder, "cpu", torch.float32)
    reference = JanusForConditionalGeneration.from_pretrained(str(folder)).eval()
    images = ramp(model.image_pixels, model.image_pixels, batch=2, seed=2)
    codes = model.encode_image(images)
    with torch.no_grad():
        encoded = reference.model.vqmodel.encode(images.permute(0, 3, 1, 2) * 2 - 1)
        expected = (encoded[2] if isinstance(encoded, tuple) else encoded.image_tokens).view(2, -1)
        with one_thread():  # as `decode` runs each image (models/pixels.py): float sums follow threads and batch
            reconstruction = torch.cat([reference.model.vqmodel.decode(row) for row in expected.split(1)])
    assert torch.equal(codes, expected)
    torch.testing.assert_close(model.decode(codes), ((reconstruction + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1))


def janus_square(picture: "Image.Image", side: int) -> "Image.Image":
    """The steps of Janus's VLMImageProcessor.resize (github:deepseek-ai/Janus, janus/models/
    image_processing_vlm.py), which Janus-4o's demo runs: each side scaled by side / longest and truncated, at
    least min_size 14, Pillow's bicubic (torchvision's resize of a PIL image), then expand2square on the grey
    int(0.5 * 255) = 127, the image at ((longest - width) // 2, 0) or (0, (longest - height) // 2)."""
    from PIL import Image

    width, height = picture.size
    longest = max(width, height)
    new_h, new_w = max(int(height / longest * side), 14), max(int(width / longest * side), 14)
    picture = picture.resize((new_w, new_h), Image.BICUBIC)
    if new_w == new_h:
        return picture
    canvas = Image.new("RGB", (max(new_w, new_h),) * 2, (127, 127, 127))
    canvas.paste(picture, ((new_h - new_w) // 2, 0) if new_h > new_w else (0, (new_w - new_h) // 2))
    return canvas


@pytest.mark.parametrize("height_share, width_share", [(2, 1), (1, 3), (1, 40)])
def test_janus_pads_as_its_processor_does(janus_pair: tuple, height_share: int, width_share: int) -> None:
    """Taller, wider, and so wide that the processor's 14 px least side applies: the pixels the VQ gets are
    the processor's (torch's antialiased bicubic, the old path, is up to a few levels off Pillow's)."""
    model, _ = janus_pair
    side = model.image_pixels
    image = ramp(height_share * side // 2, width_share * side // 2, seed=height_share + width_share)
    expected = as_image(janus_square(pil_of(image[0]), side))
    got = prepare_images(image, (side, side), "pad", value_range=(0.0, 1.0), fill=janus_family.PAD_GREY).pixels
    assert torch.equal(got, expected.permute(0, 3, 1, 2))


def test_janus_pads_another_aspect_in_grey_with_a_note(janus_pair: tuple, caplog: pytest.LogCaptureFixture) -> None:
    model, _ = janus_pair
    side = model.image_pixels
    tall = ramp(2 * side, side, seed=3)
    with caplog.at_level(logging.WARNING, logger="scd_core"):
        codes = model.encode_image(tall)
    assert "(scaled to fit inside it and padded)" in caplog.text
    assert torch.equal(codes, model.encode_image(as_image(janus_square(pil_of(tall[0]), side))))


# ----------------------------------------------------------------------------- Emu3

@pytest.fixture(scope="module")
def emu3_pair(tiny_emu3_dir: Path) -> tuple:
    from transformers import Emu3ForConditionalGeneration

    model = load_model(tiny_emu3_dir, "cpu", torch.float32)
    model.set_image_size(COLS * 8, ROWS * 8)
    return model, Emu3ForConditionalGeneration.from_pretrained(str(tiny_emu3_dir)).eval()


def test_emu3_ids_and_reconstruction_are_transformers(emu3_pair: tuple) -> None:
    model, reference = emu3_pair
    assert model.image_encoder.module is None and not hasattr(model.module.model.vqmodel, "encoder")
    images = ramp(ROWS * 8, COLS * 8, batch=2, seed=4)
    ids = model.encode_image(images)
    assert ids.shape == (2, model.num_tokens) and model.image_encoder.module is not None
    for position, token in model.forced_tokens.items():  # row ends and closing tokens where the engine forces them
        assert (ids[:, position] == token).all()
    vq = reference.model.vqmodel
    with torch.no_grad():
        encoded = vq.encode(images.permute(0, 3, 1, 2) * 2 - 1, torch.tensor([[ROWS * 8, COLS * 8]] * 2))
        codes = torch.stack(list(getattr(encoded, "image_tokens", encoded)))
        reconstruction = vq.decode(codes)
    grid = ids[:, : ROWS * (COLS + 1)].view(2, ROWS, COLS + 1)[..., :COLS]
    assert torch.equal(grid, model.code_ids[codes])
    assert int(codes.max()) < EMU3_CODES
    torch.testing.assert_close(model.decode(ids), ((reconstruction + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1))


def test_emu3_crops_another_aspect_with_a_note(emu3_pair: tuple, caplog: pytest.LogCaptureFixture) -> None:
    model, _ = emu3_pair
    square = ramp(COLS * 8, COLS * 8, seed=5)
    with caplog.at_level(logging.WARNING, logger="scd_core"):
        ids = model.encode_image(square)
    assert "the 32 x 32 px image was resized to the model's 32 x 24 px (scaled to cover it and centre-cropped)" \
        in caplog.text
    assert torch.equal(ids, model.encode_image(square[:, 4:28]))


# ----------------------------------------------------------------------------- precision

@pytest.mark.parametrize("name", ["demo", "janus", "emu3"])
def test_quantised_models_encode_as_full_precision(name: str, tiny_janus_dir: Path, tiny_emu3_dir: Path) -> None:
    """The VQ stays unquantised: an int8 model's codes are the float model's."""
    folder = {"demo": "demo", "janus": tiny_janus_dir, "emu3": tiny_emu3_dir}[name]
    full, int8 = (load_model(folder, "cpu", torch.float32, quantize=q) for q in (None, "int8"))
    assert "Int8Linear" in {type(layer).__name__ for layer in int8.module.modules()}
    if name == "emu3":
        for model in (full, int8):
            model.set_image_size(COLS * 8, ROWS * 8)
    images = ramp(ROWS * 8, COLS * 8, seed=6) if name == "emu3" else ramp(64, 64, seed=6)
    assert torch.equal(int8.encode_image(images), full.encode_image(images))
