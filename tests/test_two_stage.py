"""keep_stages_apart (scd_core/models/two_stage.py): a two-stage model decodes with one stage on the device at a
time, the same pixels; MammothModa2's LLM leaves only after its re-encode.  This machine has one device, so the
moves are recorded in order rather than seen in the device's memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from mammothmoda2_fixture import tiny_preview_dir  # noqa: F401  (fixture)
from PIL import Image
from test_glm_image import needs_glm_image

from scd_core import SamplerConfig, generate, keep_stages_apart, load_model, set_decoding
from scd_core.frontends.cli import main


def recorded_moves(module: torch.nn.Module, name: str, events: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`module.to(...)` calls appended to `events` as "<name> to <device>", then done."""
    to = module.to

    def recording(*args: Any, **kwargs: Any) -> Any:
        events.append(f"{name} to {torch.device(args[0]).type}")
        return to(*args, **kwargs)

    monkeypatch.setattr(module, "to", recording)


def test_mammothmoda2_swaps_its_stages_after_the_re_encode(tiny_preview_dir: Path,  # noqa: F811
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_model(tiny_preview_dir, device="cpu", dtype=torch.float32)
    model.set_image_size(64, 64)
    set_decoding(model, steps=2)
    prompt = model.encode("a red cube")
    tokens = generate(model, prompt, SamplerConfig(window=4, seed=3), batch_size=2).tokens
    expected = model.decode(tokens)
    model._decoder = None  # built anew by keep_stages_apart, on the CPU
    keep_stages_apart(model)
    events: list[str] = []
    decoder = model.decoder()
    model.module.model.embed_tokens.register_forward_pre_hook(lambda *_: events.append("llm"))
    decoder.gen_transformer.register_forward_pre_hook(lambda *_: events.append("dit"))
    recorded_moves(model.module, "llm", events, monkeypatch)
    recorded_moves(decoder, "decoder", events, monkeypatch)
    assert torch.equal(model.decode(tokens, prompt), expected)
    # the negative and two re-encodes, the swap, 2 images x 2 steps x 2 (guided) DiT calls, the swap back
    assert events == ["llm"] * 3 + ["llm to cpu", "decoder to cpu"] + ["dit"] * 8 + ["decoder to cpu", "llm to cpu"]
    assert model.stage_switch is None


def test_a_one_stage_model_has_nothing_to_keep_apart() -> None:
    with pytest.raises(ValueError, match=r"^this model decodes with its own VQ decoder, a single stage: there is no "
                                         r"second stage to keep apart \(two-stage models: .*GLM-Image\)$"):
        keep_stages_apart(load_model("demo", device="cpu"))


def test_the_cli_offloads_stages_to_the_same_png(tiny_preview_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    def png(*flags: str) -> bytes:
        out = tmp_path / f"out{len(flags)}.png"
        assert main(["generate", "--model", str(tiny_preview_dir), "--prompt", "a red cube", "--width", "64",
                     "--height", "64", "--device", "cpu", "--decoder-steps", "2", "-o", str(out), *flags]) == 0
        assert Image.open(out).size == (64, 64)
        return out.read_bytes()

    assert png("--offload-stages") == png()
    assert main(["generate", "--model", "demo", "--prompt", "7", "--offload-stages", "-o",
                 str(tmp_path / "demo.png")]) != 0
    assert not (tmp_path / "demo.png").exists()


@needs_glm_image
def test_glm_image_moves_its_ar_stage_out_before_the_dit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GLM-Image's decode reads the decoding stage only: the AR stage leaves before the DiT's first call and comes
    back after its last, the same pixels."""
    from glm_image_fixture import HEIGHT, WIDTH, write_tiny_glm_image

    model = load_model(write_tiny_glm_image(tmp_path / "glm"), device="cpu", dtype=torch.float32)
    model.set_image_size(WIDTH, HEIGHT)
    set_decoding(model, steps=2)
    tokens = torch.randint(0, model.vocab_size, (1, model.num_tokens), generator=torch.Generator().manual_seed(0))
    expected = model.decode(tokens)
    keep_stages_apart(model)
    events: list[str] = []
    model.decoder().transformer.register_forward_pre_hook(lambda *_: events.append("dit"))
    recorded_moves(model.module, "ar", events, monkeypatch)
    assert torch.equal(model.decode(tokens), expected)
    assert events[0] == "ar to cpu" and events[-1] == "ar to cpu" and set(events[1:-1]) == {"dit"}
