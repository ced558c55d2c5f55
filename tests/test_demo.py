"""The embedded demo model: it loads by name, generates, decodes, and matches its training script."""

from __future__ import annotations

import json

import torch

from scd_core import SamplerConfig, generate, load_model
from scd_core.bench.demo_quality import classify, fit_digit_classifier
from scd_core.models.loading import DEMO_DIR
from scd_core.bench.train_demo import CFG_SCALE, GPT_CONFIG, IMAGE_SIZE, TOP_K, VQ_CONFIG, load_digits_ink, render


def test_demo_is_small_and_described():
    config = json.loads((DEMO_DIR / "llamagen.json").read_text())
    assert config["model_type"] == "llamagen" and config["family"] == "demo"
    total = sum(p.stat().st_size for p in DEMO_DIR.iterdir() if p.is_file())
    assert total < 8 * 2**20


def test_demo_loads_generates_and_decodes():
    model = load_model("demo", "cpu")
    assert model.family == "demo"
    assert model.config == GPT_CONFIG  # the shipped weights are what train_demo builds
    assert (model.default_cfg_scale, model.default_top_k) == (CFG_SCALE, TOP_K)  # and so are the sampling defaults
    assert model.module["vq"].config.ch_mult == VQ_CONFIG.ch_mult
    assert model.grid == (16, 16) and model.num_tokens == 256 and model.vocab_size == VQ_CONFIG.codebook_size
    result = generate(model, model.encode("4"), SamplerConfig(coupler="maximal", window=16, seed=3))
    assert result.tokens.shape == (1, 256) and sum(result.committed) == 256
    assert result.nfe < 256  # speculative decoding saves calls on a trained model
    image = model.decode(result.tokens)
    assert image.shape == (1, IMAGE_SIZE, IMAGE_SIZE, 3) and 0 <= image.min() and image.max() <= 1


def test_quality_classifier_reads_rendered_digits():
    """The classifier path of demo_quality recognises the training renderings themselves."""
    ink, labels = load_digits_ink()
    spread = slice(None, None, 17)  # about 30 of every digit (the file is sorted by label)
    images = (render(ink[spread], torch.Generator().manual_seed(0), augment=False) + 1) / 2
    predicted = classify(fit_digit_classifier(), images.permute(0, 2, 3, 1))
    assert set(labels[spread].tolist()) == set(range(10))
    assert (predicted == labels[spread]).float().mean() > 0.95


def test_demo_vq_reconstructs_digits():
    model = load_model("demo", "cpu")
    ink, _ = load_digits_ink()
    images = render(ink[:16], torch.Generator().manual_seed(0), augment=False)
    with torch.no_grad():  # encode_image takes a ComfyUI IMAGE: (B, H, W, 3) in 0..1
        recon = model.decode(model.encode_image(((images + 1) / 2).permute(0, 2, 3, 1)))
    assert (recon.permute(0, 3, 1, 2) * 2 - 1 - images).abs().mean() < 0.15
