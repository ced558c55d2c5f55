"""SCD Sampler: SCD_MODEL + SCD_COND -> SCD_TOKENS + SCD_STATS."""

from __future__ import annotations

import logging

import comfy.model_management as mm
from comfy_api.latest import io
from scd_core import COUPLERS, DRAFT_INITS, SamplerConfig, generate
from scd_core import couplers
from scd_core.config import AUTO_WINDOW, DEFAULT_COUPLER, MAX_CANDIDATES, MAX_SEED, MAX_WINDOW
from scd_core.model import FAR_CFG_FACTOR, FAR_TEMPERATURE_FACTOR, unusual_settings
from scd_core.models.family import families, joined

from .checks import RECOMMENDED_SCALE, CheckedCombo, check_same_model, guidance_scale
from .progress import ProgressReporter
from .lowvram import streamed_bytes
from .sockets import EncodedPrompt, LoadedModel, SamplingStats, SCDCond, SCDModel, SCDStats, SCDTokens

RECOMMENDED_TEMPERATURE = -1.0  # and its recommended temperature (its `default_temperature`, else 1)
RECOMMENDED_TOP_K = 0
RECOMMENDED_TOP_P = 0.0
AUTOMATIC_WINDOW = 0  # widget value meaning window "auto": the width with the most tokens per second, per call
DEFAULT_WINDOW = AUTOMATIC_WINDOW  # measured within 3% of the best pinned window (README, "Automatic window")
MODEL_DRAFT_INIT = "auto"  # widget value meaning "the model's default" (previous_frame for video, else above)
DRAFT_INIT_CHOICES = (MODEL_DRAFT_INIT, *DRAFT_INITS)
MAX_TOP_K = 1_000_000
MAX_BATCH = 16


def sampler_config(coupler: str, window: int, cfg_scale: float, seed: int, temperature: float, top_k: int,
                   top_p: float, draft_init: str, candidates: int = 1) -> SamplerConfig:
    """Widget values -> SamplerConfig; the widgets' "recommended" sentinels become None, window 0 "auto"; a bad
    value is named as its widget reads (SamplerConfig checks it: NaN, out of range)."""
    if candidates > 1 and coupler in couplers.names_where("candidates", False):
        raise ValueError(f"candidates must be 1 with the {coupler} coupler, which {couplers.coupler(coupler).help}; "
                         f"set candidates to 1 or choose another coupler (got {candidates})")
    try:
        return SamplerConfig(coupler=coupler, window=AUTO_WINDOW if window == AUTOMATIC_WINDOW else window,
                             cfg_scale=guidance_scale("cfg_scale", cfg_scale),
                             temperature=None if temperature == RECOMMENDED_TEMPERATURE else temperature,
                             top_k=None if top_k == RECOMMENDED_TOP_K else top_k,
                             top_p=None if top_p == RECOMMENDED_TOP_P else top_p, seed=seed,
                             draft_init=None if draft_init == MODEL_DRAFT_INIT else draft_init,
                             candidates=candidates)
    except ValueError as err:
        raise ValueError(as_widgets(str(err))) from None


# The widget value that stands for SamplerConfig's None ("the model's recommended value")
RECOMMENDED_WIDGETS = {"cfg_scale": f"{RECOMMENDED_SCALE:g}", "temperature": f"{RECOMMENDED_TEMPERATURE:g}",
                       "top_k": f"{RECOMMENDED_TOP_K}", "top_p": f"{RECOMMENDED_TOP_P:g}",
                       "draft_init": MODEL_DRAFT_INIT}


def as_widgets(message: str) -> str:
    """SamplerConfig's "top_p must be None or a number in (0, 1], got nan" as "top_p must be 0 (the model's
    recommended value) or a number in (0, 1], got nan": the widget's value, not the library's None."""
    field, must, rest = message.partition(" must be None or ")
    if not must or field not in RECOMMENDED_WIDGETS:
        return message
    return f"{field} must be {RECOMMENDED_WIDGETS[field]} (the model's recommended value) or {rest}"


def cfg_tooltip() -> str:
    """The recommended scales and notes the families declare."""
    recommended = ", ".join(family.cfg for family in families() if family.cfg)
    unguided = [family.label for family in families() if not family.cfg]
    if unguided:
        recommended += f"; {joined(unguided)} {'has' if len(unguided) == 1 else 'have'} none"
    notes = " ".join(family.cfg_note for family in families() if family.cfg_note)
    return (f"Classifier-free guidance scale; -1 uses the model's recommended value ({recommended}). Far above it "
            f"(more than {FAR_CFG_FACTOR:g}x) images turn to noise: the status line warns. {notes}").rstrip()


def temperature_tooltip() -> str:
    declared = "; ".join(family.temperature for family in families() if family.temperature)
    return ("Divides the model's logits before sampling; -1 uses the model's recommended value "
            f"({declared + ', ' if declared else ''}else 1: the model as trained). Lower gives plainer images, "
            f"higher more varied ones and soon noise (above {FAR_TEMPERATURE_FACTOR:g}x the model's value the "
            "status line warns).")


def top_k_tooltip() -> str:
    declared = "; ".join(family.top_k for family in families() if family.top_k)
    return f"0 uses the model's recommended value ({declared + '; ' if declared else ''}else none: every token)."


def top_p_tooltip() -> str:
    declared = "; ".join(family.top_p for family in families() if family.top_p)
    return f"0 uses the model's recommended value ({declared + ', ' if declared else ''}else 1: no top-p)."


def check_draft_init(model: LoadedModel, config: SamplerConfig) -> None:
    """previous_frame copies a token one video frame back, so it needs a model with frames."""
    if config.draft_init == "previous_frame" and len(getattr(model.model, "grid", None) or ()) != 3:
        raise ValueError(f"draft_init previous_frame copies the same place one video frame earlier, but model "
                         f"'{model.name}' makes single images; choose auto, above, left or random")


def reservation_note(reserved: int, batch_size: int) -> str:
    """What the sampler asked ComfyUI's memory management to free for its run."""
    size = f"{reserved / 2**30:.2f} GiB" if reserved >= 2**30 else f"{reserved / 2**20:.2f} MiB"
    return f"reserved {size} for the KV cache and distributions of {batch_size} image{'s' if batch_size > 1 else ''}"


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
                             tooltip=f"How the next drafts are made. {couplers.help_text()}. maximal, gumbel and "
                                     "independent may save the last few percent of calls, but their images follow "
                                     "the window widths: worth it where a seed need not reproduce. In bfloat16 a "
                                     "logit that rounds differently at another width can flip a draw, so even "
                                     "faithful images then differ somewhere."),
                io.Int.Input("window", default=DEFAULT_WINDOW, min=0, max=MAX_WINDOW,
                             tooltip="Tokens decoded per model call; 1 is plain autoregressive sampling. 0 (auto) "
                                     "picks it per call: the width with the most tokens per second, from what a "
                                     "call costs on this device and how many tokens the calls so far committed. "
                                     "With faithful the window changes the calls, never the image; with the "
                                     "other couplers pin a number for seeds that reproduce."),
                io.Float.Input("cfg_scale", default=RECOMMENDED_SCALE, min=-1.0, max=100.0, step=0.1,
                               tooltip=cfg_tooltip()),
                io.Int.Input("seed", default=0, min=0, max=MAX_SEED, control_after_generate=True,
                             tooltip="Random seed. With the faithful coupler a seed gives the plain autoregressive "
                                     "image of that seed at any window; with the others only at a pinned "
                                     "window. In a batch, row i uses seed + i."),
                io.Float.Input("temperature", default=RECOMMENDED_TEMPERATURE, min=-1.0, max=100.0, step=0.01,
                               tooltip=temperature_tooltip()),
                io.Int.Input("top_k", default=RECOMMENDED_TOP_K, min=0, max=MAX_TOP_K,
                             tooltip=top_k_tooltip()),
                io.Float.Input("top_p", default=RECOMMENDED_TOP_P, min=0.0, max=1.0, step=0.01,
                               tooltip=top_p_tooltip()),
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
                                     "call costs about the same (a GPU). Not with the "
                                     f"{' or '.join(couplers.names_where('candidates', False))} coupler."),
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
        # ComfyUI frees what this run's batch will allocate before it loads the weights beside it
        reserved = model.run_memory(batch_size, config.window, config.candidates)
        model.to_compute_device(reserved)
        reservation = reservation_note(reserved, batch_size)
        logging.info("SCD Sampler (model '%s'): %s", model.name, reservation)
        if not mm.is_device_cpu(model.patcher.load_device):  # the status line says it (on the CPU ComfyUI
            warnings = [*warnings, reservation]                # reserves nothing: the log only)
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
