"""The adapter protocol between the decoding engine and a token model.

A model family implements `TokenModel` (what the model is) and `Session`
(one generation's KV cache).  The engine only ever calls the methods below;
everything family-specific (prompt templates, CFG rows, embeddings for image
ids, cache classes) stays inside the adapter.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Protocol, runtime_checkable

import torch

# One (batch, T, vocab) logits tensor per branch of a sample's rows: (cond, uncond) under classifier-free
# guidance, uncond None without it; a session of more branches weighs them itself (`Session.guidance`).
Logits = tuple[Optional[torch.Tensor], ...]


@runtime_checkable
class Session(Protocol):
    """One generation: the conditioning prefix plus the image tokens fed so far.

    Optional attribute `rows_per_cache` (int): how many consecutive batch rows
    share one cache and must therefore advance together.  Omitted, all rows
    share it and `rewind` always receives an int.  A smaller value (a stateless
    toy model, per-row caches) lets rows advance independently; `rewind` then
    receives a (batch,) LongTensor.

    Optional method `keep_rows(index)` ((k,) LongTensor of batch rows, in order):
    go on with those rows only.  With `rows_per_cache = 1` the engine calls it once
    half the rows are done, so that finished rows stop costing work; later calls
    then feed k rows.

    Optional method `admit(fresh, tokens=None)` (`fresh`: sessions of the same model
    from `start`, not prefilled, each for its own conditioning): prefill their rows
    and go on with them after this session's rows.  With `tokens` ((batch, T) ids, as
    `forward` takes them) the same call also feeds this session's rows, so a refill
    costs no call of its own (a session may run two calls where its prompts are
    longer than T).  Returns (the logits of `tokens`, or None without them, the new
    rows' position-0 logits (rows of `fresh`, 1, V)).  A session not prefilled yet
    runs its own prefix in that call too, its rows first.  Needs `rows_per_cache = 1`
    and `keep_rows`.  With it `generate_many` refills the slots of finished rows
    with new jobs (continuous batching); without it `generate_many` runs `generate`
    per group of jobs.

    Optional attribute `prefix_tokens` ((1 or batch, K) LongTensor): the image
    tokens just before position 0, e.g. a video's context frames; draft
    initialisation may copy from them.

    Optional method `guidance(cfg_scale) -> weights`: a session whose logits hold
    other branches than (cond, uncond) (Janus-4o's full condition, text only,
    unconditional) gives each branch's weight at the run's guidance scale; the
    engine samples from the weighted sum of the branches' logits (weights summing to
    1, so CFG's u + s (c - u) is the weights (s, 1 - s)).  Without it the engine
    applies classifier-free guidance to (cond, uncond).
    """

    def prefill(self) -> Logits:
        """Run the conditioning prefix; logits for image position 0, (batch, 1, V).  A session may take
        `prefill(tokens)` ((batch, K) ids): it then feeds them after the prefix in the same call and returns
        position K's logits (the engine feeds an image's kept top rows so, which then cost no call)."""
        ...

    def forward(self, tokens: torch.Tensor) -> Logits:
        """Feed (batch, T) image ids after the cached ones; logits for the T next positions."""
        ...

    def rewind(self, n: int | torch.Tensor) -> None:
        """Drop the last n fed tokens from the cache."""
        ...


@runtime_checkable
class TokenModel(Protocol):
    """What the engine needs to know about a model.

    Optional attributes the engine reads when present:
      grid: (rows, cols) of the image token grid, cols counting a row-end column if rows have one, for
        `above` draft initialisation; (frames, rows, cols) for video, which enables `previous_frame`.
      forced_tokens: dict position -> token id (row-end tokens), never sampled.
      code_ids: 1-D LongTensor of the vocab_size token ids the model samples (its image codes), when
        they are a subset of its vocabulary.  Logits then cover those ids only, in that order, while the
        tokens fed to `forward`, the forced ids and the result stay model ids.
      default_cfg_scale, default_top_k, default_temperature, default_draft_init: the model's recommended values.
      cfg_schedule(scale) -> None or a (num_tokens,) float tensor: the guidance scale at each position when the
        configured scale is `scale` (Lumina-mGPT 2.0's decays along the image); None keeps `scale` everywhere.
        A position's scale may depend on the position only, so that p stays a fixed function of the prefix.
      device: torch.device the logits come back on.  A family reads it from `compute_device(model, weight)`:
        the optional attribute `compute_device` (set by whoever places the weights, e.g. ComfyUI's loader,
        which may leave part of them on the CPU and stream them in per call), else one weight's device.
      precision (e.g. "int8"; absent: the dtype's), compiled (true once the forward is compiled or graph-captured),
        offload (e.g. "cpu"): how the model runs; the automatic window keeps call costs apart for each.
    Loaded families (see `scd_core.load_model`) also offer
      encode(prompt, negative_prompt=None) -> conditioning for `start`, and
      decode(tokens (batch, N)) -> images (batch, H, W, 3) float in 0..1.
    Families that generate more than one image size (Emu3, Emu3.5, Lumina-mGPT, GLM-Image) offer
      set_image_size(width, height) in pixels; encode then records the size and `start` switches the model to
      the size of its `cond`.  One may offer forget_image_size() for "no size asked" (the helper
      `set_image_size(model, 0, 0)` calls it), where its authors then choose the size themselves.
    Video families (Cosmos) instead take context frames, encode_video(frames (F, H, W, 3), prompt=None),
      return frames (batch * F, H, W, 3) from decode, and with `decodes_context = True` accept
      decode(tokens, cond) to decode the context frames in front of the continuation.
    """

    vocab_size: int
    num_tokens: int

    def start(self, cond: Any, batch_size: int) -> Session:
        ...


def compute_device(model: Any, weight: torch.Tensor) -> torch.device:
    """The device `model` computes on: its `compute_device` when one was set, else where `weight` lies."""
    return getattr(model, "compute_device", None) or weight.device


def check_start(cond: Any, prompt_type: type, source: str, batch_size: Any) -> None:
    """What a family's `start` checks first: `cond` is the `prompt_type` that `source` makes (e.g.
    "JanusModel.encode()"), and `batch_size` is a positive integer."""
    if not isinstance(cond, prompt_type):
        raise ValueError(f"cond must come from {source}, got {type(cond).__name__}")
    check_batch_size(batch_size)


def check_batch_size(batch_size: Any) -> None:
    """A session's batch: a positive integer."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")


def check_tokens(tokens: torch.Tensor, num_tokens: int, id_count: int, what: str = "token ids") -> None:
    """What a family's `decode` checks first: `tokens` is (batch, num_tokens) and each id lies in 0..id_count-1."""
    if tokens.dim() != 2 or tokens.shape[1] != num_tokens:
        raise ValueError(f"tokens must be (batch, {num_tokens}), got shape {tuple(tokens.shape)}")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= id_count):
        raise ValueError(f"{what} must lie in 0..{id_count - 1}")


def model_default(model: Any, name: str, fallback: Any) -> Any:
    """A model's recommended sampling value, or the generic fallback."""
    value = getattr(model, name, None)
    return fallback if value is None else value


def set_image_size(model: Any, width: int, height: int) -> None:
    """Ask `model` for width x height pixel images from the next encode on; 0 x 0 asks for none: the family's
    `forget_image_size` where it has one (Emu3.5: its authors' own choice), else the current size stays."""
    if (width, height) == (0, 0):
        forget = getattr(model, "forget_image_size", None)
        if forget is not None:
            forget()
        return
    if not all(isinstance(side, int) and side > 0 for side in (width, height)):
        raise ValueError(f"width and height must both be positive pixel counts, or both 0 for the model's own "
                         f"size; got {width} x {height}")
    choose = getattr(model, "set_image_size", None)
    if choose is None:
        raise ValueError(f"this model generates one image size only; set width and height to 0 "
                         f"(Emu3 and Lumina-mGPT take other sizes), got {width} x {height}")
    choose(width, height)


# How far above a model's recommended value a setting may go before a run is warned (not refused) that it
# will likely give noise: simple multiples, documented in the README's "Choosing settings".
FAR_CFG_FACTOR = 3.0
FAR_TEMPERATURE_FACTOR = 2.0


def unusual_settings(model: Any, cfg_scale: Optional[float], temperature: Optional[float]) -> list[str]:
    """Warnings for sampling values far above what `model` was made for (None: the model's own value)."""
    warnings = []
    recommended_cfg = getattr(model, "default_cfg_scale", None)
    if cfg_scale is not None and recommended_cfg and cfg_scale > FAR_CFG_FACTOR * recommended_cfg:
        warnings.append(f"CFG {cfg_scale:g} is far above this model's {recommended_cfg:g} (more than "
                        f"{FAR_CFG_FACTOR:g}x tends to give noise)")
    recommended_temperature = model_default(model, "default_temperature", 1.0)
    if temperature is not None and temperature > FAR_TEMPERATURE_FACTOR * recommended_temperature:
        warnings.append(f"temperature {temperature:g} is far above this model's {recommended_temperature:g} "
                        f"(more than {FAR_TEMPERATURE_FACTOR:g}x tends to give noise)")
    return warnings


def joined(words: Iterable[str], last: str = "and") -> str:
    """The words as prose: "a, b and c"."""
    items = list(words)
    return f" {last} ".join(filter(None, [", ".join(items[:-1]), *items[-1:]]))
