"""SCD Model Loader: a model folder (or the demo model) -> SCD_MODEL."""

from __future__ import annotations

from typing import Optional

import comfy.model_management as mm
import comfy.model_patcher
import torch
from comfy_api.latest import io
from scd_core import load_model
from scd_core.models.loading import pick_device
from scd_core.models.checkpoints import ModelLoadError

from .checks import CheckedCombo, choice_error
from .model_folders import DEMO, model_choices, unknown_model_message
from .sockets import LoadedModel, SCDModel

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "bfloat16", "float16")


class _ModuleHolder(torch.nn.Module):
    """Gives ModelPatcher a module whose `device` attribute it may set (transformers models make it read-only)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner


def compute_device(choice: str) -> torch.device:
    """The device to sample on; "auto" is ComfyUI's choice, so --cpu and friends are respected."""
    if choice == "auto":
        return mm.get_torch_device()
    return pick_device(choice)


def weight_dtype(choice: str, device: torch.device) -> torch.dtype:
    if choice != "auto":
        return getattr(torch, choice)
    # float16 overflows in these models' activations; bf16 only where ComfyUI says it is fast
    return torch.bfloat16 if mm.should_use_bf16(device) else torch.float32


class SCDModelLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SCDModelLoader",
            display_name="SCD Model Loader",
            category="SCD",
            description="Loads an autoregressive image or video model (Janus-Pro, LlamaGen, Cosmos, ..., or the "
                        "small demo model) for speculative coupled decoding.",
            inputs=[
                io.Combo.Input("model", options=list(model_choices()), default=DEMO,
                               tooltip="A folder under models/scd/ or a family folder (models/Janus-Pro/, "
                                       "models/LlamaGen/, models/Cosmos/, ...); "
                                       "'demo' is the small class-conditional model shipped with the pack."),
                CheckedCombo("device", options=list(DEVICES), default="auto",
                             tooltip="auto: ComfyUI's device (respects --cpu)."),
                CheckedCombo("dtype", options=list(DTYPES), default="auto",
                             tooltip="auto: bfloat16 where the GPU supports it, else float32."),
                io.Boolean.Input("compile", default=False,
                                 tooltip="Static-shape window calls through torch.compile (CUDA graphs on "
                                         "CUDA); the first call of each window width compiles (minutes on "
                                         "CPU). demo/LlamaGen only; candidates must be 1."),
            ],
            outputs=[SCDModel.Output(display_name="model")],
        )

    @classmethod
    def validate_inputs(cls, model: Optional[str] = None) -> bool | str:
        # only `model` here: ComfyUI flags every input named in this signature with the message
        choices = model_choices()
        if model is not None and model not in choices:
            return unknown_model_message(model, choices)
        return True

    @classmethod
    def execute(cls, model: str, device: str, dtype: str, compile: bool = False) -> io.NodeOutput:
        choices = model_choices()
        if model not in choices:  # e.g. the folder was removed after validation
            raise ModelLoadError(unknown_model_message(model, choices))
        problem = choice_error("device", device, DEVICES) or choice_error("dtype", dtype, DTYPES)
        if problem:
            raise ValueError(problem)
        folder = choices[model]
        load_device = compute_device(device)
        offload_device = load_device if load_device.type == "cpu" else mm.unet_offload_device()
        # Loaded on the offload device; ModelPatcher moves it to load_device when a node needs it.
        loaded = load_model(DEMO if folder is None else folder, device=offload_device,
                            dtype=weight_dtype(dtype, load_device), compile=compile)
        patcher = comfy.model_patcher.ModelPatcher(_ModuleHolder(loaded.module), load_device=load_device,
                                                   offload_device=offload_device)
        return io.NodeOutput(LoadedModel(name=model, model=loaded, patcher=patcher))
