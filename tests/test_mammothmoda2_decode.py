"""MammothModa2's decoder (scd_core/models/families/mammothmoda2_dit.py, mammothmoda2_decode.py) on the tiny
Preview and Dev folders: the DiT against a reference written here from the authors' description (written-out
attention, complex rotary positions, diffusers' sinusoidal time embedding), the schedule against diffusers'
FlowMatchEulerDiscreteScheduler with the same shift, and bad folders."""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from mammothmoda2_fixture import DIT_CONFIG, VISUAL_START, tiny_dev_dir, tiny_preview_dir  # noqa: F401
from test_mammothmoda2 import AuthorsNetwork

from scd_core import SamplerConfig, generate, load_model, set_decoding
from scd_core.models.families.mammothmoda2_condition import (NEGATIVE_PROMPT, for_dit, negative_condition,
                                                              positive_condition)
from scd_core.models.families.mammothmoda2_decode import (DiTCondition, DiTSettings, denoise, flow_times,
                                                           latents_to_pixels, load_decoder)
from scd_core.models.families.mammothmoda2_dit import check_rotary_range
from scd_core.models.weights.checkpoints import ModelLoadError
from scd_core.models.weights.tokenizer_files import read_json

WIDTH = 32  # the tiny LLM's hidden size


def weights(folder: Path, prefix: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state = {}
    for path in sorted(folder.glob("*.safetensors")):
        state.update({k[len(prefix):]: v.float() for k, v in load_file(str(path)).items() if k.startswith(prefix)})
    return state


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def swiglu(w: dict, p: str, x: torch.Tensor) -> torch.Tensor:
    gate, up = x @ w[p + "linear_1.weight"].T, x @ w[p + "linear_3.weight"].T
    return (torch.nn.functional.silu(gate) * up) @ w[p + "linear_2.weight"].T


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """(L, heads, d) each; every query sees every key."""
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def rotary(positions: torch.Tensor, axes: list[int]) -> torch.Tensor:
    """(L, head_dim / 2) unit complex numbers: axis a's pairs turn by position / 10000^(2k / axes[a])."""
    parts = [positions[:, a, None].double() / 10000 ** (torch.arange(0, d, 2).double() / d) for a, d in
             enumerate(axes)]
    return torch.polar(torch.ones(1, dtype=torch.float64), torch.cat(parts, -1)).to(torch.complex64)


def turn(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(pairs * angles[:, None]).flatten(-2)


def block(w: dict, p: str, x: torch.Tensor, angles: torch.Tensor, temb) -> torch.Tensor:
    heads, kv, eps = DIT_CONFIG["num_attention_heads"], DIT_CONFIG["num_kv_heads"], DIT_CONFIG["norm_eps"]
    if temb is None:
        normed, gate, scale_ffn, gate_ffn = rms(x, w[p + "norm1.weight"], eps), None, None, None
    else:
        mod = torch.nn.functional.silu(temb) @ w[p + "norm1.linear.weight"].T + w[p + "norm1.linear.bias"]
        scale, gate, scale_ffn, gate_ffn = mod.chunk(4)
        normed = rms(x, w[p + "norm1.norm.weight"], eps) * (1 + scale)
    d = x.shape[-1] // heads
    q, k, v = (normed @ w[f"{p}attn.to_{n}.weight"].T for n in "qkv")
    q = turn(rms(q.view(-1, heads, d), w[p + "attn.norm_q.weight"], 1e-5), angles)
    k = turn(rms(k.view(-1, kv, d), w[p + "attn.norm_k.weight"], 1e-5), angles)
    share = torch.arange(heads) // (heads // kv)  # query head h reads key/value head h // group
    out = softmax_attention(q, k[:, share], v.view(-1, kv, d)[:, share]).reshape(len(x), -1)
    attn = rms(out @ w[p + "attn.to_out.0.weight"].T, w[p + "norm2.weight"], eps)
    if temb is None:
        x = x + attn
        ffn = swiglu(w, p + "feed_forward.", rms(x, w[p + "ffn_norm1.weight"], eps))
        return x + rms(ffn, w[p + "ffn_norm2.weight"], eps)
    x = x + gate.tanh() * attn
    ffn = swiglu(w, p + "feed_forward.", rms(x, w[p + "ffn_norm1.weight"], eps) * (1 + scale_ffn))
    return x + gate_ffn.tanh() * rms(ffn, w[p + "ffn_norm2.weight"], eps)


def qformer(w: dict, p: str, x: torch.Tensor, heads: int) -> torch.Tensor:
    """SimpleQFormerImage*: learned queries; self-attention, cross-attention to the projected input, SwiGLU."""
    kv = rms(x, w[p + "input_proj.0.weight"], 1e-5) @ w[p + "input_proj.1.weight"].T + w[p + "input_proj.1.bias"]
    q = w[p + "query"][0]
    for i in range(sum(1 for key in w if key.startswith(p) and key.endswith("ln_q1.weight"))):
        lp = f"{p}layers.{i}."

        def mha(name: str, query: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
            wq, wk, wv = w[f"{lp}{name}.in_proj_weight"].chunk(3)
            bq, bk, bv = w[f"{lp}{name}.in_proj_bias"].chunk(3)
            split = lambda t: t.view(len(t), heads, -1)  # noqa: E731
            out = softmax_attention(split(query @ wq.T + bq), split(source @ wk.T + bk), split(source @ wv.T + bv))
            return out.reshape(len(query), -1) @ w[f"{lp}{name}.out_proj.weight"].T + w[f"{lp}{name}.out_proj.bias"]

        normed = rms(q, w[lp + "ln_q1.weight"], 1e-5)
        q = q + mha("self_attn", normed, normed)
        q = q + mha("cross_attn", rms(q, w[lp + "ln_q2.weight"], 1e-5), kv)
        q = q + swiglu(w, lp + "ffn.", rms(q, w[lp + "ln_ffn.weight"], 1e-5))
    return q


def reference_velocity(w: dict, latents: torch.Tensor, t: float, text: torch.Tensor, image=None) -> torch.Tensor:
    """The authors' Transformer2DModel.forward for one text-to-image sample (no padding, no reference image)."""
    from diffusers.models.embeddings import get_timestep_embedding

    c, h, wd = latents.shape
    frequencies = get_timestep_embedding(torch.tensor([t]), 256, flip_sin_to_cos=True, downscale_freq_shift=0,
                                         scale=DIT_CONFIG["timestep_scale"])[0]
    tp = "time_caption_embed.timestep_embedder."
    temb = torch.nn.functional.silu(frequencies @ w[tp + "linear_1.weight"].T + w[tp + "linear_1.bias"])
    temb = temb @ w[tp + "linear_2.weight"].T + w[tp + "linear_2.bias"]
    cp = "time_caption_embed.caption_embedder."
    cond = rms(text, w[cp + "0.weight"], 1e-5) @ w[cp + "1.weight"].T + w[cp + "1.bias"]
    if image is not None:  # Dev: its Q-Former's tokens follow the caption
        cond = torch.cat([cond, qformer(w, "time_caption_embed.image_embedder.", image, 1)])
    patches = latents.reshape(c, h // 2, 2, wd // 2, 2).permute(1, 3, 2, 4, 0).reshape((h // 2) * (wd // 2), -1)
    x = patches @ w["x_embedder.weight"].T + w["x_embedder.bias"]
    n = len(cond)
    rows, cols = torch.meshgrid(torch.arange(h // 2), torch.arange(wd // 2), indexing="ij")
    places = torch.cat([torch.arange(n)[:, None].repeat(1, 3),
                        torch.stack([torch.full_like(rows, n), rows, cols], -1).reshape(-1, 3)])
    angles = rotary(places, DIT_CONFIG["axes_dim_rope"])
    for i in range(DIT_CONFIG["num_refiner_layers"]):
        cond = block(w, f"context_refiner.{i}.", cond, angles[:n], None)
        x = block(w, f"noise_refiner.{i}.", x, angles[n:], temb)
    joint = torch.cat([cond, x])
    for i in range(DIT_CONFIG["num_layers"]):
        joint = block(w, f"layers.{i}.", joint, angles, temb)
    scale = torch.nn.functional.silu(temb) @ w["norm_out.linear_1.weight"].T + w["norm_out.linear_1.bias"]
    normed = torch.nn.functional.layer_norm(joint, joint.shape[-1:], eps=1e-6) * (1 + scale)
    out = (normed @ w["norm_out.linear_2.weight"].T + w["norm_out.linear_2.bias"])[n:]
    return out.reshape(h // 2, wd // 2, 2, 2, c).permute(4, 0, 2, 1, 3).reshape(c, h, wd)


def loaded(folder: Path, dev: bool):
    return load_decoder(folder, read_json(folder / "config.json"), WIDTH, dev, torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("dev", [False, True], ids=["preview", "dev"])
def test_dit_velocity_equals_the_written_out_reference(dev: bool, tiny_preview_dir: Path,  # noqa: F811
                                                        tiny_dev_dir: Path) -> None:  # noqa: F811
    folder = tiny_dev_dir if dev else tiny_preview_dir
    dit = loaded(folder, dev).gen_transformer
    w = weights(folder, "gen_transformer.")
    generator = torch.Generator().manual_seed(3)
    latents = torch.randn(1, 4, 6, 8, generator=generator)
    text = torch.randn(1, 5, WIDTH, generator=generator)
    image = torch.randn(1, 7, WIDTH, generator=generator) if dev else None
    for t in (0.0, 0.37):
        with torch.no_grad():
            ours = dit(latents, torch.tensor([t]), text, image)[0]
        expected = reference_velocity(w, latents[0], t, text[0], None if image is None else image[0])
        assert ours.shape == latents.shape[1:]
        assert torch.allclose(ours, expected, atol=2e-5, rtol=1e-4), (ours - expected).abs().max()


def test_preview_refiner_equals_the_written_out_qformer(tiny_preview_dir: Path) -> None:  # noqa: F811
    refiner = loaded(tiny_preview_dir, False).gen_image_condition_refiner
    w = weights(tiny_preview_dir, "gen_image_condition_refiner.")
    states = torch.randn(1, 10, WIDTH, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ours = refiner(states)[0]
    heads = read_json(tiny_preview_dir / "config.json")["gen_image_condition_refiner_config"]["num_heads"]
    assert ours.shape == (8, WIDTH)
    assert torch.allclose(ours, qformer(w, "", states[0], heads), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("steps,latent_pixels", [(50, 64 * 64), (7, 128 * 128), (3, 40 * 40)])
def test_schedule_is_diffusers_flow_match_euler_with_the_authors_shift(steps: int, latent_pixels: int) -> None:
    """The authors' times t are diffusers' sigmas 1 - t with shift m = sqrt(latent pixels) / 40, and their
    Euler step x + (t' - t) v is diffusers' step with the velocity's sign flipped (sigma runs the other way)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    shift = math.sqrt(latent_pixels) / 40
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(sigmas=[1 - i / steps for i in range(steps)])
    times = flow_times(steps, latent_pixels)
    assert torch.allclose(times, 1 - scheduler.sigmas, atol=1e-6)
    sample = theirs = torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(5))
    for step in range(steps):
        velocity = torch.sin(sample * (step + 1))
        sample = sample + (times[step + 1] - times[step]) * velocity
        theirs = scheduler.step(-velocity, scheduler.timesteps[step], theirs).prev_sample
    assert torch.allclose(sample, theirs, atol=1e-5)


def test_denoise_guides_against_the_negative_and_reports_each_step(tiny_preview_dir: Path) -> None:  # noqa: F811
    """Within cfg_range the step's velocity is v(neg) + scale (v(cond) - v(neg)); outside it v(cond) alone."""
    dit = loaded(tiny_preview_dir, False).gen_transformer
    generator = torch.Generator().manual_seed(6)
    noise = torch.randn(1, 4, 4, 4, generator=generator)
    cond, neg = (DiTCondition(torch.randn(1, n, WIDTH, generator=generator)) for n in (6, 3))
    settings = DiTSettings(steps=4, guidance=3.0, cfg_range=(0.0, 0.5))
    seen = []
    with torch.no_grad():
        ours = denoise(dit, noise, cond, neg, settings, lambda done, total: seen.append((done, total)))
        times, x = flow_times(4, 16), noise
        for step in range(4):
            t = times[step].expand(1)
            v = dit(x, t, cond.text)
            if step / 4 <= 0.5:
                v_neg = dit(x, t, neg.text)
                v = v_neg + 3.0 * (v - v_neg)
            x = x + (times[step + 1] - times[step]) * v
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert torch.allclose(ours, x, atol=1e-6)


def test_pixels_unscale_the_latents_through_the_vae(tiny_preview_dir: Path) -> None:  # noqa: F811
    vae = loaded(tiny_preview_dir, False).gen_vae
    latents = torch.randn(1, 4, 4, 6, generator=torch.Generator().manual_seed(7))
    config = read_json(tiny_preview_dir / "config.json")["gen_vae_config"]
    with torch.no_grad():
        pixels = latents_to_pixels(vae, latents)
        decoded = vae.decode(latents / config["scaling_factor"] + config["shift_factor"]).sample
    assert pixels.shape == (1, 8, 12, 3)
    assert torch.equal(pixels, (decoded / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1))


def broken_copy(source: Path, tmp_path: Path, **config_changes) -> Path:
    folder = tmp_path / source.name
    shutil.copytree(source, folder)
    config = read_json(folder / "config.json")
    config.update(config_changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_missing_dit_weight_is_one_line(tiny_preview_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    from safetensors.torch import load_file, save_file

    folder = broken_copy(tiny_preview_dir, tmp_path)
    for path in folder.glob("*.safetensors"):
        state = load_file(str(path))
        save_file({k: v for k, v in state.items() if k != "gen_transformer.layers.1.attn.to_q.weight"}, str(path))
    with pytest.raises(ModelLoadError, match="gen_transformer.layers.1.attn.to_q.weight") as err:
        loaded(folder, False)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("section", ["gen_vae_config", "gen_dit_config"])
def test_a_missing_decoder_config_is_one_line(section: str, tiny_dev_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    folder = broken_copy(tiny_dev_dir, tmp_path, **{section: None})
    with pytest.raises(ModelLoadError, match=f"config.json has no {section}") as err:
        loaded(folder, True)
    assert "\n" not in str(err.value)


def test_without_diffusers_the_error_names_the_extra(tiny_preview_dir: Path, monkeypatch) -> None:  # noqa: F811
    monkeypatch.setitem(sys.modules, "diffusers", None)
    with pytest.raises(ModelLoadError, match=r"comfyui-scd\[glm\]") as err:
        loaded(tiny_preview_dir, False)
    assert "\n" not in str(err.value)


def authors_states(net: AuthorsNetwork, ids: torch.Tensor, config: dict, dev: bool) -> torch.Tensor:
    """encode_full_prompts' states: transformers' forward of the whole sequence, Preview its last hidden state, Dev
    the mean of the hidden states gen_condition_layers names."""
    routed = ids >= net.gen_start
    embeds = net.net.embed_tokens(ids.masked_fill(routed, 0))
    embeds[routed] = net.gen_embed[ids[routed] - net.gen_start]
    net.route["mask"] = routed
    with torch.no_grad():
        out = net.net(inputs_embeds=embeds, attention_mask=torch.ones_like(ids), output_hidden_states=True)
    if not dev:
        return out.last_hidden_state
    return torch.stack([out.hidden_states[i] for i in config["gen_condition_layers"]]).mean(dim=0)


@pytest.mark.parametrize("dev", [False, True], ids=["preview", "dev"])
def test_condition_is_the_authors_fresh_forward(dev: bool, tiny_preview_dir: Path,  # noqa: F811
                                                 tiny_dev_dir: Path) -> None:  # noqa: F811
    """Prompt + rows + <|image end|>: the image condition is the last 10 positions (all generation ids here),
    Preview's through its refiner; Dev's text condition is the question's text ids; the negative is every position
    of the negative prompt's chat text."""
    folder = tiny_dev_dir if dev else tiny_preview_dir
    config = read_json(folder / "config.json")
    model = load_model(folder, device="cpu", dtype=torch.float64)
    model.set_grid(2, 4)
    prompt = model.encode("a red cube")
    generator = torch.Generator().manual_seed(8)
    rows = torch.randint(VISUAL_START, VISUAL_START + 24, (1, model.num_tokens), generator=generator)
    for position, token in model.forced_tokens.items():
        rows[0, position] = token
    end = model._tokenizer.ids["<|image end|>"]
    ids = torch.tensor([[*prompt.cond, *rows[0].tolist(), end]])
    authors = AuthorsNetwork(folder)
    states = authors_states(authors, ids, config, dev)
    refiner = model.decoder().gen_image_condition_refiner
    with torch.no_grad():
        ours = for_dit(positive_condition(model.module, ids, model.rule), model.rule, refiner)
        image = states[:, -10:]
        if dev:
            question_text = states[:, :-10][:, ids[0, :-10] < 152064]
            assert torch.allclose(ours.text, question_text, atol=1e-9) and torch.allclose(ours.image, image, atol=1e-9)
        else:
            assert ours.image is None and torch.allclose(ours.text, refiner(image), atol=1e-9)
        negative_ids = model._tokenizer.encode("<|im_start|>system\nYou are a helpful image generator.<|im_end|>\n"
                                               f"<|im_start|>user\n{NEGATIVE_PROMPT}<|im_end|>\n")
        negative = negative_condition(model.module, torch.tensor([negative_ids]), model.rule)
    assert torch.allclose(negative.text, authors_states(authors, torch.tensor([negative_ids]), config, dev),
                          atol=1e-9)


def test_text_to_image_gives_pixels_with_the_dit_progress(tiny_dev_dir: Path) -> None:  # noqa: F811
    """A whole run on the tiny Dev folder: tokens, then an image of the set size; the same seed the same image."""
    model = load_model(tiny_dev_dir, device="cpu", dtype=torch.float32)
    model.set_image_size(64, 32)
    set_decoding(model, steps=3)
    steps = []
    model.decode_progress = lambda done, total: steps.append((done, total))
    prompt = model.encode("a red cube")
    tokens = generate(model, prompt, SamplerConfig(window=4, seed=2)).tokens
    images = model.decode(tokens)
    assert images.shape == (1, 32, 64, 3) and torch.equal(images, model.decode(tokens))
    assert steps == [(1, 3), (2, 3), (3, 3)] * 2
    assert 0 <= float(images.min()) and float(images.max()) <= 1 and float(images.std()) > 0
    model.set_image_size(64, 48)  # the same 1 x 2 grid; a later size leaves a prompt encoded before it as it was
    assert model.decode(tokens, model.encode("a red cube")).shape == (1, 48, 64, 3)
    assert torch.equal(model.decode(tokens, prompt), images)


@pytest.mark.parametrize("variant", ("preview", "dev"))
def test_every_llm_forward_comes_before_the_stage_switch(variant: str, request: pytest.FixtureRequest) -> None:
    """decode runs every LLM forward (the negative and each row's re-encode) before `stage_switch`, so a host may
    offload the LLM there: with its weights gone (on the meta device) after the switch, the pixels are the same."""
    model = load_model(request.getfixturevalue(f"tiny_{variant}_dir"), device="cpu", dtype=torch.float32)
    model.set_image_size(64, 64)
    set_decoding(model, steps=2)
    prompt = model.encode("a red cube")
    tokens = generate(model, prompt, SamplerConfig(window=4, seed=3), batch_size=2).tokens
    expected = model.decode(tokens)
    order: list[str] = []
    handles = [model.module.model.embed_tokens.register_forward_pre_hook(lambda *_: order.append("llm")),
               model.decoder().gen_transformer.register_forward_pre_hook(lambda *_: order.append("dit"))]

    def offload_the_llm() -> None:
        order.append("switch")
        model.module.to("meta")

    model.stage_switch = offload_the_llm
    try:
        assert torch.equal(model.decode(tokens, prompt), expected)
    finally:
        for handle in handles:
            handle.remove()
    assert order == ["llm"] * 3 + ["switch"] + ["dit"] * 2 * 2 * 2  # 2 images, 2 steps, guided: 2 DiT calls each


def test_the_dit_refuses_positions_past_the_authors_rotary_table() -> None:
    """gen_dit_config's axes_lens bound the condition (axis 0, the image after it) and the patch grid: one line
    past them, where the authors' table lookup fails."""
    check_rotary_range(7, 8, 8, (8, 8, 8))  # condition 0..6, the image at 7: the last row of the table
    for length, rows, cols in ((8, 8, 8), (7, 9, 8), (7, 8, 9), (9, 1, 1)):
        with pytest.raises(ValueError, match=rf"^MammothModa2's DiT places at most 7 condition tokens and 8 x 8 "
                                             rf"latent patches \(16 px each with the published VAE; gen_dit_config "
                                             rf"axes_lens \[8, 8, 8\]\); this decode has {length} and {rows} x "
                                             rf"{cols}: shorten the prompt or ask for a smaller image$"):
            check_rotary_range(length, rows, cols, (8, 8, 8))


def test_a_prompt_too_long_for_the_dits_rotary_table_is_one_line(tiny_dev_dir: Path) -> None:  # noqa: F811
    """Dev's condition holds the prompt's text states: past the published table's 300 positions (the tiny
    tokenizer spends a token per byte) the decode is refused in one line before any DiT step."""
    model = load_model(tiny_dev_dir, device="cpu", dtype=torch.float32)
    set_decoding(model, steps=1)
    model.set_image_size(32, 32)
    steps: list[int] = []
    model.decode_progress = lambda done, total: steps.append(done)
    for prompt, fits in (("a red cube", True), ("a red cube " * 30, False)):
        cond = model.encode(prompt)
        tokens = generate(model, cond, SamplerConfig(window=4, seed=0)).tokens
        if fits:
            assert model.decode(tokens, cond).shape == (1, 32, 32, 3)
            continue
        with pytest.raises(ValueError, match=r"^MammothModa2's DiT places at most 299 condition tokens .* this "
                                             r"decode has 3\d\d and \d+ x \d+: shorten the prompt or ask for a "
                                             r"smaller image$"):
            model.decode(tokens, cond)
    assert steps == [1]  # the long prompt's decode stopped before its first step


def test_decoder_settings_are_the_pipelines_but_what_is_given(tiny_preview_dir: Path) -> None:  # noqa: F811
    """set_decoding starts from the published pipeline's settings each time, checks each value, and is refused by a
    VQ decoder."""
    model = load_model(tiny_preview_dir, device="cpu", dtype=torch.float32)
    assert model.decoding == DiTSettings(steps=50, guidance=5.0, seed=0, cfg_range=(0.0, 1.0))
    set_decoding(model, steps=3, seed=9)
    set_decoding(model, guidance=2.0)
    assert model.decoding == DiTSettings(steps=50, guidance=2.0, seed=0)
    for name, bad, expected in (("steps", 0, "a whole number in 1..1000"), ("steps", 2.0, "a whole number in 1..1000"),
                                ("guidance", math.nan, "a number in 0..100"), ("guidance", -1, "a number in 0..100"),
                                ("seed", -1, "a whole number in 0..2**64 - 1")):
        with pytest.raises(ValueError, match=rf"^the decoder's {name} must be {re.escape(expected)}, got "):
            set_decoding(model, **{name: bad})
    demo = load_model("demo", device="cpu")
    set_decoding(demo)  # nothing asked: nothing to refuse
    with pytest.raises(ValueError, match=r"^this model's decoder is a VQ decoder, which takes no steps, seed \("):
        set_decoding(demo, steps=2, seed=1)


def test_previews_are_a_token_map_without_the_dit(tiny_preview_dir: Path) -> None:  # noqa: F811
    """What the sampler previews: one colour per committed code, pending cells gray; the decoder is not read."""
    model = load_model(tiny_preview_dir, device="cpu", dtype=torch.float32)
    model.set_grid(2, 3)
    frame = model.preview_frame(torch.tensor([[VISUAL_START + 1, VISUAL_START + 2]]))
    side = 512 // 3
    cells = frame[::side, ::side]
    assert frame.shape == (2 * side, 3 * side, 3) and model._decoder is None
    assert (cells[0, 2] == 0.5).all() and (cells[1] == 0.5).all()
    assert not (cells[0, 0] == 0.5).all() and not torch.equal(cells[0, 0], cells[0, 1])
