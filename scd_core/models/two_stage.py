"""A two-stage model's decode with one stage on the device at a time, for hosts without a model manager of their
own (the library, the CLI's --offload-stages; ComfyUI's does this itself: SCD VQ Decode loads the decoding stage
as a model).

GLM-Image's and MammothModa2's decoders are diffusion models of several GiB beside a sampling stage of many more;
kept side by side they need both on the device.  `keep_stages_apart` keeps the decoding stage on the CPU, and for the
decode moves the sampling stage out and the decoding stage in, then back: the peak is the larger stage, at the
cost of two round trips of weights a decode.  MammothModa2 re-encodes the tokens with its LLM first, so the swap
happens at its `stage_switch`, once every LLM forward is done.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .family import diffusion_decoders

HOST = torch.device("cpu")


def keep_stages_apart(model: Any) -> None:
    """From now on `model.decode` runs with the sampling stage off the device while the decoding stage runs, and
    the decoding stage on the CPU the rest of the time; a model of one stage is refused in one line."""
    if not hasattr(model, "decoding_modules"):
        raise ValueError("this model decodes with its own VQ decoder, a single stage: there is no second stage to "
                         f"keep apart (two-stage models: {diffusion_decoders()[0]})")
    decode, device = model.decode, model.device
    decoding = model.decoding_modules(HOST)  # built on the CPU the first time: it never meets the sampling stage
    decoding.to(HOST)

    @functools.wraps(decode)
    def decode_apart(tokens: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        swapped = []

        def swap() -> None:
            model.module.to(HOST)
            decoding.to(device)
            swapped.append(True)

        if hasattr(model, "stage_switch"):  # the decode runs the sampling stage first, then calls this
            model.stage_switch = swap
        else:
            swap()
        try:
            return decode(tokens, *args, **kwargs)
        finally:
            if hasattr(model, "stage_switch"):
                model.stage_switch = None
            if swapped:
                decoding.to(HOST)
                model.module.to(device)

    model.decode = decode_apart
