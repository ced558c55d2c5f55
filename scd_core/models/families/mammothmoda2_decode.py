"""MammothModa2's second stage: the published DiT, condition refiner and VAE read from the folder, the authors'
deterministic flow-matching Euler loop with text guidance, and the VAE's pixels.

Each rule, with the authors' file (github.com/bytedance/mammothmoda: Preview on branch qwen25vl under mammothmoda2/,
Dev on main under mamoda2/mammothmoda2/):
- the modules (model/modeling_mammothmoda2.py __init__): gen_vae is diffusers' AutoencoderKL.from_config of
  config.json's gen_vae_config, gen_transformer the DiT of gen_dit_config (mammothmoda2_dit.py here);
  Preview adds gen_image_condition_refiner (a Q-Former at the LLM's width) when gen_image_condition_refiner_config is
  set, Dev always puts its Q-Former in gen_transformer.time_caption_embed.image_embedder (reinit_image_embedder).
  The DiT's image-editing weights (ref_image_*, image_index_embedding) stay in the files: text-to-image never runs
  them.
- the schedule (mammothmoda2_dit/schedulers.py set_timesteps and step): t = linspace(0, 1, steps + 1)[:-1] in
  float32, shifted by m = sqrt(latent pixels) / 40 to t / (m - m t + t), then 1 appended; each step
  x + (t_next - t) * v in float32, cast back to the velocity's dtype.  Nothing random after the starting noise.
- guidance (utils/t2i_utils.py processing): within cfg_range (i / steps, both ends included) and with
  text_guidance_scale > 1, v = v(negative) + scale * (v(condition) - v(negative)); the negative run sees only the
  negative prompt's states (no image condition).  decode_diffusion_image's defaults: 50 steps, scale 5.0,
  cfg_range (0, 1).
- the pixels (t2i_utils.py processing, utils/vae_processor.py): latents / scaling_factor + shift_factor through
  the VAE's decoder, then (x / 2 + 0.5) clamped to 0..1.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch import nn

from ..decoder_settings import DecoderSettings
from ..weights.checkpoints import ModelLoadError
from ..weights.hf_folders import load_or_refuse
from ..weights.streaming import fill_from_safetensors, parameters_on_meta
from .mammothmoda2_dit import MammothDiT, QFormer, qformer_settings

DECODER_HINT = ("MammothModa2's decoder reads config.json's gen_dit_config and gen_vae_config and the "
                "gen_transformer.*, gen_vae.* (and on Preview gen_image_condition_refiner.*) weights of the "
                "published folder")
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class DiTCondition:
    """What the DiT reads besides the latents: condition states at the LLM's width (Preview: the text condition
    then the refined image condition) and, on Dev, the raw image condition its own Q-Former condenses."""

    text: torch.Tensor
    image: Optional[torch.Tensor] = None

    def to(self, device: torch.device) -> DiTCondition:
        """On `device` (the LLM that made it and the DiT may sit apart)."""
        return DiTCondition(self.text.to(device), None if self.image is None else self.image.to(device))


@dataclass(frozen=True)
class DiTSettings(DecoderSettings):
    """The DiT stage's settings, decode_diffusion_image's defaults (`guidance`: its text_guidance_scale)."""

    steps: int = 50
    guidance: float = 5.0
    cfg_range: tuple[float, float] = (0.0, 1.0)


def require_autoencoder() -> type:
    """diffusers' AutoencoderKL, or one line naming the extra that brings it: decoding needs it, sampling not."""
    try:
        from diffusers import AutoencoderKL
    except ImportError:
        raise ModelLoadError("decoding MammothModa2 tokens needs diffusers' AutoencoderKL: pip install diffusers "
                             "(the pack's 'glm' extra: pip install 'comfyui-scd[glm]')") from None
    return AutoencoderKL


def decoder_config(config: dict, name: str) -> dict:
    """config.json's `name` section as a dict, or one ModelLoadError."""
    section = config.get(name)
    if not isinstance(section, dict):
        raise ModelLoadError(f"config.json has no {name} (a dict): {DECODER_HINT}")
    return section


class MammothDecoder(nn.Module):
    """The decoder's modules under the checkpoint's names: gen_transformer, gen_vae and (Preview, when configured)
    gen_image_condition_refiner."""

    def __init__(self, config: dict, llm_width: int, dev: bool) -> None:
        super().__init__()
        refiner = config.get("gen_image_condition_refiner_config")
        if dev and not isinstance(refiner, dict):
            raise ModelLoadError(f"config.json has no gen_image_condition_refiner_config (Dev's Q-Former): "
                                 f"{DECODER_HINT}")
        self.gen_vae = require_autoencoder().from_config(decoder_config(config, "gen_vae_config"))
        self.gen_transformer = MammothDiT(decoder_config(config, "gen_dit_config"), llm_width,
                                          qformer_settings(refiner) if dev else None)
        self.gen_image_condition_refiner = None
        if not dev and isinstance(refiner, dict):
            self.gen_image_condition_refiner = QFormer(llm_width, llm_width, **qformer_settings(refiner))

    @property
    def scale_factor(self) -> int:
        """Pixels per latent pixel: 2 per down block of the VAE after the first (8 for the published one)."""
        return 2 ** (len(self.gen_vae.config.block_out_channels) - 1)


def load_decoder(folder: Path, config: dict, llm_width: int, dev: bool, dtype: torch.dtype,
                 device: torch.device) -> MammothDecoder:
    """The folder's decoder in `dtype` on `device`; a missing config section, weight or diffusers is one
    ModelLoadError."""
    def build() -> MammothDecoder:
        with parameters_on_meta():
            decoder = MammothDecoder(config, llm_width, dev)
        fill_from_safetensors(decoder, sorted(folder.glob("*.safetensors")), "", "none", dtype, DECODER_HINT)
        return decoder

    decoder = load_or_refuse(build, folder, "MammothModa2's decoder", DECODER_HINT)
    return decoder.to(device).eval().requires_grad_(False)


def flow_times(steps: int, latent_pixels: int) -> torch.Tensor:
    """(steps + 1,) float32 times from 0 (noise) to 1: the authors' set_timesteps with its dynamic shift, then the
    final 1 (numpy as theirs, so the rounding is theirs)."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"the DiT's steps must be a whole number of at least 1, got {steps!r}")
    times = np.linspace(0, 1, steps + 1, dtype=np.float32)[:-1]
    m = np.sqrt(latent_pixels) / 40  # 1 at 320 x 320 pixels, 3.2 at 1024 x 1024
    times = times / (m - m * times + times)
    return torch.cat([torch.from_numpy(times).to(torch.float32), torch.ones(1)])


def guided(step: int, settings: DiTSettings) -> bool:
    """Whether step `step` runs the negative prompt too (processing: i / steps within cfg_range, scale > 1)."""
    low, high = settings.cfg_range
    return settings.guidance > 1.0 and low <= step / settings.steps <= high


def denoise(dit: MammothDiT, noise: torch.Tensor, condition: DiTCondition, negative: Optional[DiTCondition],
            settings: DiTSettings, progress: Optional[Progress] = None) -> torch.Tensor:
    """The authors' Euler loop from `noise` (B, C, h, w) to the latents; `progress(done, steps)` after each step."""
    times = flow_times(settings.steps, noise.shape[-2] * noise.shape[-1]).to(noise.device)
    latents, dtype = noise, noise.dtype
    for step in range(settings.steps):
        t, t_next = times[step], times[step + 1]
        timestep = t.expand(latents.shape[0]).to(dtype)
        velocity = dit(latents, timestep, condition.text, condition.image)
        if negative is not None and guided(step, settings):
            unguided = dit(latents, timestep, negative.text, negative.image)
            velocity = unguided + settings.guidance * (velocity - unguided)
        latents = (latents.to(torch.float32) + (t_next - t) * velocity).to(velocity.dtype).to(dtype)
        if progress is not None:
            progress(step + 1, settings.steps)
    return latents


def latents_to_pixels(vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """(B, C, h, w) latents through the VAE: float32 CPU images (B, H, W, 3) in 0..1."""
    config = vae.config
    if config.scaling_factor is not None:
        latents = latents / config.scaling_factor
    if config.shift_factor is not None:
        latents = latents + config.shift_factor
    image = vae.decode(latents.to(next(vae.parameters()).dtype), return_dict=False)[0]
    return (image.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).cpu()
