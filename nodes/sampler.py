"""SCD Sampler: SCD_MODEL + SCD_COND -> SCD_TOKENS + SCD_STATS."""

from __future__ import annotations

import logging

import comfy.model_management as mm
from comfy_api.latest import io
from scd_core import COUPLERS, DRAFT_INITS, SamplerConfig, generate
from scd_core.config import AUTO_WINDOW, MAX_CANDIDATES, MAX_SEED, MAX_WINDOW
from scd_core.model import FAR_CFG_FACTOR, FAR_TEMPERATURE_FACTOR, unusual_settings

from .checks import CheckedCombo, check_same_model
from .progress import ProgressReporter
from .lowvram import streamed_bytes
from .sockets import EncodedPrompt, LoadedModel, SamplingStats, SCDCond, SCDModel, SCDStats, SCDTokens

RECOMMENDED_CFG = -1.0  # widget value meaning "the model's recommended CFG scale"
RECOMMENDED_TOP_K = 0
RECOMMENDED_TOP_P = 0.0
AUTOMATIC_WINDOW = 0  # widget value meaning window "auto": the width with the most tokens per second, per call
DEFAULT_COUPLER = SamplerConfig.coupler  # faithful: the seed decides the image, whatever the widths
DEFAULT_WINDOW = AUTOMATIC_WINDOW  # measured within 3% of the best pinned window (README, "Automatic window")
MODEL_DRAFT_INIT = "auto"  # widget value meaning "the model's default" (previous_frame for video, else above)
DRAFT_INIT_CHOICES = (MODEL_DRAFT_INIT, *DRAFT_INITS)
MAX_TOP_K = 1_000_000
MAX_BATCH = 16


def sampler_config(coupler: str, window: int, cfg_scale: float, seed: int, temperature: float, top_k: int,
                   top_p: float, draft_init: str, candidates: int = 1) -> SamplerConfig:
    """Widget values -> SamplerConfig; the widgets' "recommended" sentinels become None, window 0 "auto"."""
    if cfg_scale != RECOMMENDED_CFG and cfg_scale < 0:
        raise ValueError(f"cfg_scale must be -1 (the model's recommended value) or a number in 0..100, "
                         f"got {cfg_scale}")
    if top_k < 0:
        raise ValueError(f"top_k must be 0 (the model's recommended value) or a positive integer, got {top_k}")
    if candidates > 1 and coupler == "faithful":
        raise ValueError(f"candidates must be 1 with the faithful coupler, which reproduces plain autoregressive "
                         f"sampling token for token; set candidates to 1 or choose another coupler (got {candidates})")
    return SamplerConfig(coupler=coupler, window=AUTO_WINDOW if window == AUTOMATIC_WINDOW else window,
                         cfg_scale=None if cfg_scale == RECOMMENDED_CFG else cfg_scale,
                         temperature=temperature, top_k=None if top_k == RECOMMENDED_TOP_K else top_k,
                         top_p=None if top_p == RECOMMENDED_TOP_P else top_p, seed=seed,
                         draft_init=None if draft_init == MODEL_DRAFT_INIT else draft_init, candidates=candidates)


def check_draft_init(model: LoadedModel, config: SamplerConfig) -> None:
    """previous_frame copies a token one video frame back, so it needs a model with frames."""
    if config.draft_init == "previous_frame" and len(getattr(model.model, "grid", None) or ()) != 3:
        raise ValueError(f"draft_init previous_frame copies the same place one video frame earlier, but model "
                         f"'{model.name}' makes single images; choose auto, above, left or random")


class SCDSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SCDSampler",
            display_name="SCD Sampler",
            category="SCD",
            description="Samples image tokens with speculative Jacobi decoding: the same output distribution "
                        "as autoregressive sampling in fewer model calls.",
            inputs=[
                SCDModel.Input("model"),
                SCDCond.Input("conditioning"),
                CheckedCombo("coupler", options=list(COUPLERS), default=DEFAULT_COUPLER,
                             tooltip="faithful: a seed gives the plain autoregressive image of that seed, "
                                     "whatever the window (auto included), the batch (row i = seed + i) or a "
                                     "rerun elsewhere, in float32 (in bfloat16 a logit that rounds differently "
                                     "at another width flips a draw: most demo images then differ somewhere). "
                                     "maximal / gumbel (SCD) and independent (SJD) may save the "
                                     "last few percent of calls, but their images follow the window widths: "
                                     "worth it where a seed need not reproduce."),
                io.Int.Input("window", default=DEFAULT_WINDOW, min=0, max=MAX_WINDOW,
                             tooltip="Tokens decoded per model call; 1 is plain autoregressive sampling. 0 (auto) "
                                     "picks it per call: the width with the most tokens per second, from what a "
                                     "call costs on this device and how many tokens the calls so far committed. "
                                     "With faithful the window changes the calls, never the image; with the "
                                     "other couplers pin a number for seeds that reproduce."),
                io.Float.Input("cfg_scale", default=RECOMMENDED_CFG, min=-1.0, max=100.0, step=0.1,
                               tooltip="Classifier-free guidance scale; -1 uses the model's recommended value "
                                       "(demo 2, Janus-Pro 5, LlamaGen 4 / text 7.5, Lumina-mGPT 3 / 2.0: 4, "
                                       f"Emu3 3; Cosmos has none). Far above it (more than {FAR_CFG_FACTOR:g}x) "
                                       "images turn to noise: the status line warns. Lumina-mGPT 2.0 follows its "
                                       "authors: 1 turns CFG off; any other scale acts as at least 4 and decays "
                                       "to 4 within the first image row."),
                io.Int.Input("seed", default=0, min=0, max=MAX_SEED, control_after_generate=True,
                             tooltip="Random seed. With the faithful coupler a seed gives the plain autoregressive "
                                     "image of that seed at any window; with the others only at a pinned "
                                     "window. In a batch, row i uses seed + i."),
                io.Float.Input("temperature", default=1.0, min=0.01, max=100.0, step=0.01,
                               tooltip="Divides the model's logits before sampling: 1 samples the model as "
                                       "trained, lower gives plainer images, higher more varied ones and soon "
                                       f"noise (above {FAR_TEMPERATURE_FACTOR:g}x the model's value the status "
                                       "line warns)."),
                io.Int.Input("top_k", default=RECOMMENDED_TOP_K, min=0, max=MAX_TOP_K,
                             tooltip="0 uses the model's recommended value."),
                io.Float.Input("top_p", default=RECOMMENDED_TOP_P, min=0.0, max=1.0, step=0.01,
                               tooltip="0 uses the model's recommended value (0.8 / 0.9 for Cosmos, else 1: "
                                       "no top-p)."),
                CheckedCombo("draft_init", options=list(DRAFT_INIT_CHOICES), default=MODEL_DRAFT_INIT,
                             tooltip="First guess for tokens entering the window: auto (previous_frame for "
                                     "video, else above), random, the token to the left, the token above "
                                     "in the image grid, or the same place one video frame earlier."),
                io.Int.Input("batch_size", default=1, min=1, max=MAX_BATCH,
                             tooltip="Images sampled together in one run, sharing its model calls; row i uses "
                                     "seed + i."),
                # optional: workflows saved before it existed still run as they did
                io.Int.Input("candidates", default=1, min=1, max=MAX_CANDIDATES, optional=True,
                             tooltip="Candidates for the first draft of each call (1 = off). k feeds k chains per "
                                     "call, k times the tokens, for 5-8% fewer calls: worth it only where a wider "
                                     "call costs about the same (a GPU). Not with the faithful coupler."),
            ],
            outputs=[SCDTokens.Output(display_name="tokens"), SCDStats.Output(display_name="stats")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, model: LoadedModel, conditioning: EncodedPrompt, coupler: str, window: int, cfg_scale: float,
                seed: int, temperature: float, top_k: int, top_p: float, draft_init: str,
                batch_size: int, candidates: int = 1) -> io.NodeOutput:
        check_same_model(model, conditioning.model_name, "conditioning")
        config = sampler_config(coupler, window, cfg_scale, seed, temperature, top_k, top_p, draft_init, candidates)
        if not 1 <= batch_size <= MAX_BATCH:
            raise ValueError(f"batch_size must be in 1..{MAX_BATCH}, got {batch_size}")
        check_draft_init(model, config)
        warnings = unusual_settings(model.model, config.cfg_scale, config.temperature)
        for warning in warnings:
            logging.warning("SCD Sampler (model '%s'): %s", model.name, warning)
        model.to_compute_device()
        streamed = streamed_bytes(model.patcher)
        if streamed:
            warnings = [*warnings, f"streaming {streamed / 2**30:.2f} GiB of weights from the CPU"]
            logging.info("SCD Sampler (model '%s'): %s per call", model.name, warnings[-1])
        reporter = ProgressReporter(str(cls.hidden.unique_id), model.model, warnings)
        interrupted = False
        try:
            result = generate(model.model, conditioning.cond, config, batch_size=batch_size, callback=reporter)
        except mm.InterruptProcessingException:
            interrupted = True
        if interrupted:
            # Raised again outside the handler: ComfyUI keeps the exception, and the original's traceback
            # would pin the run's KV cache in memory until the next prompt.
            mm.soft_empty_cache()
            raise mm.InterruptProcessingException()
        return io.NodeOutput(result.tokens, SamplingStats(result, config, batch_size, model.name))
