"""SCD Sampler: SCD_MODEL + SCD_COND -> SCD_TOKENS + SCD_STATS."""

from __future__ import annotations

import logging

import comfy.model_management as mm
from comfy_api.latest import io
from scd_core import COUPLERS, DRAFT_INITS, SamplerConfig, generate, prompt_for_run
from scd_core.decoding import couplers
from scd_core.windows import window_policies
from scd_core.decoding.config import DEFAULT_COUPLER, MAX_CANDIDATES, MAX_SEED
from scd_core.windows.window_policies import AUTO_WINDOW, MAX_WINDOW
from scd_core.model import unusual_settings
from scd_core.models.family import families
from scd_core.decoding.sampler_options import OPTIONS, Option

from .checks import CheckedCombo, check_same_model
from .progress import ProgressReporter
from .lowvram import streamed_bytes
from .sockets import EncodedPrompt, LoadedModel, SamplingStats, SCDCond, SCDModel, SCDStats, SCDTokens

# the automatic window: measured within 3% of the best pinned window (README, "Automatic window")
DEFAULT_WINDOW = window_policies.named(AUTO_WINDOW).node_value
MODEL_DRAFT_INIT = "auto"  # widget value meaning "the model's default" (previous_frame for video, else above)
DRAFT_INIT_CHOICES = (MODEL_DRAFT_INIT, *DRAFT_INITS)
MAX_BATCH = 16
# the sampler options saved workflows hold widgets for, in OPTIONS' order (the first before the seed, the others
# after it); options declared after them come last, optional: a workflow saved before them still runs
SAVED_OPTIONS = 4


def sampler_config(coupler: str, window: int, seed: int, draft_init: str, candidates: int = 1,
                   **options: float) -> SamplerConfig:
    """Widget values -> SamplerConfig; `options` are the sampler options' widgets by name, whose "recommended"
    values become None; a window policy's value its name."""
    if candidates > 1 and coupler in couplers.names_where("candidates", False):
        raise ValueError(f"candidates must be 1 with the {coupler} coupler (got {candidates}): set candidates to 1 or "
                         "choose another coupler")
    try:
        return SamplerConfig(coupler=coupler, window=window_policies.from_widget(window), seed=seed,
                             draft_init=None if draft_init == MODEL_DRAFT_INIT else draft_init, candidates=candidates,
                             **{option.name: option.from_widget(options.get(option.name, option.recommended))
                                for option in OPTIONS})
    except ValueError as err:
        raise ValueError(as_widgets(str(err))) from None


def as_widgets(message: str) -> str:
    """SamplerConfig's "temperature must be None or a number in (0, 100], got 0.0" in the widgets' words:
    "temperature must be -1 (the model's recommended value) or a number in (0, 100], got 0.0"."""
    field, must, rest = message.partition(" must be None or ")
    recommended = {option.name: f"{option.recommended:g}" for option in OPTIONS} | {"draft_init": MODEL_DRAFT_INIT}
    if not must or field not in recommended:
        return message
    return f"{field} must be {recommended[field]} (the model's recommended value) or {rest}"


def option_widget(option: Option, optional: bool = False) -> io.Input:
    """A sampler option's widget: its "recommended" value first, then its range."""
    widget, step = (io.Float.Input, {"step": option.step}) if option.kind is float else (io.Int.Input, {})
    return widget(option.name, default=option.recommended, min=option.minimum, max=option.maximum,
                  tooltip=option.tooltip(families()), optional=optional, **step)


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
                io.Int.Input("window", default=DEFAULT_WINDOW, min=window_policies.NODE_MIN, max=MAX_WINDOW,
                             tooltip="Tokens decoded per model call; 1 is plain autoregressive sampling. "
                                     f"{window_policies.help_text('node')}. With faithful the window changes the "
                                     "calls, never the image; with the other couplers pin a number for seeds that "
                                     "reproduce."),
                option_widget(OPTIONS[0]),
                io.Int.Input("seed", default=0, min=0, max=MAX_SEED, control_after_generate=True,
                             tooltip="Random seed. With the faithful coupler a seed gives the plain autoregressive "
                                     "image of that seed at any window; with the others only at a pinned "
                                     "window. In a batch, row i uses seed + i."),
                *(option_widget(option) for option in OPTIONS[1:SAVED_OPTIONS]),
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
                                     "call costs about the same (a GPU). "
                                     f"{couplers.candidates_refused(DEFAULT_COUPLER).capitalize()}."),
                *(option_widget(option, optional=True) for option in OPTIONS[SAVED_OPTIONS:]),
            ],
            outputs=[SCDTokens.Output(display_name="tokens"), SCDStats.Output(display_name="stats")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, model: LoadedModel, conditioning: EncodedPrompt, coupler: str, window: int, seed: int,
                draft_init: str, batch_size: int, candidates: int = 1, **options: float) -> io.NodeOutput:
        check_same_model(model, conditioning.model_name, "conditioning")
        config = sampler_config(coupler, window, seed, draft_init, candidates, **options)
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
        # size auto: the model writes its size for this seed first, so the progress sees that grid
        cond = prompt_for_run(model.model, conditioning.cond, config, batch_size)
        reporter = ProgressReporter(str(cls.hidden.unique_id), model.model, warnings)
        interrupted = False
        try:
            result = generate(model.model, cond, config, batch_size=batch_size, callback=reporter)
        except mm.InterruptProcessingException:
            interrupted = True
        if interrupted:
            # Raised again outside the handler: ComfyUI keeps the exception, and the original's traceback
            # would pin the run's KV cache in memory until the next prompt.
            mm.soft_empty_cache()
            raise mm.InterruptProcessingException()
        return io.NodeOutput(result.tokens, SamplingStats(result, config, batch_size, model.name))
