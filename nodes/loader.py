"""SCD Model Loader: a model folder (or the demo model) -> SCD_MODEL."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional, Union

import comfy.model_management as mm
import torch
from comfy.cli_args import args
from comfy_api.latest import io
from scd_core import load_model
from scd_core.models.family import compilable, families
from scd_core.models.loading import estimate_memory, pick_device
from scd_core.models.weights.checkpoints import ModelLoadError
from scd_core.models.weights.memory import auto_precision
from scd_core.models.weights.quantize import NF4_DEVICES, NF4_PACKAGE, PRECISIONS, check_precision, module_bytes
from server import PromptServer

from .checks import CheckedCombo, choice_error
from .core_compat import classic_patcher_class, core_note, is_dynamic_patcher, reclaimable_bytes
from .lowvram import follow_loads, make_streamable
from .model_download import DOWNLOAD_CHOICES, OFF, download_tooltip, fetched_folder
from .model_folders import DEMO, MODEL_ROOTS, model_choices, unknown_model_message
from .sockets import LoadedModel, SCDModel

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZE = ("auto",) + PRECISIONS
PROMPT_ALLOWANCE = 256  # prompt tokens the memory estimate sets aside next to the image
SLOT_BYTES = 4 * 8  # per window slot and vocabulary entry: a float32 distribution, ~8 working copies


class _ModuleHolder(torch.nn.Module):
    """Gives ModelPatcher a module whose `device` attribute it may set (transformers models make it read-only)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner


def module_holder(inner: torch.nn.Module, name: str) -> torch.nn.Module:
    """`inner` in a holder whose class is named after the model: ComfyUI's log names a model by its class
    ("Requested to load SCD demo")."""
    return type(f"SCD {name}", (_ModuleHolder,), {"__module__": __name__})(inner)


def compute_device(choice: str) -> torch.device:
    """The device to sample on; "auto" is ComfyUI's choice, so --cpu and friends are respected."""
    if choice == "auto":
        return mm.get_torch_device()
    if args.cpu and choice != "cpu":
        raise ValueError(f"device '{choice}' was chosen but ComfyUI runs with --cpu; choose auto "
                         "(ComfyUI's device) or cpu")
    try:
        return pick_device(choice)
    except ValueError as err:
        raise ValueError(f"{err}; choose auto (ComfyUI's device, here {mm.get_torch_device().type})") from err


def offered_precisions(device: torch.device) -> tuple[str, ...]:
    """Best first; NF4 only where bitsandbytes is installed and runs on `device`."""
    nf4 = importlib.util.find_spec(NF4_PACKAGE) is not None and device.type in NF4_DEVICES
    return PRECISIONS if nf4 else PRECISIONS[:-1]


def chosen_precision(choice: str, path: Union[str, Path], device: torch.device, dtype: torch.dtype) -> str:
    """`choice`, or for "auto" the best precision whose weights and KV cache fit the device's free memory (full
    precision on the CPU, whose memory the weights share with everything else anyway).  A decoding stage need not
    fit beside them: SCD VQ Decode loads it as a model of its own, which ComfyUI offloads the sampling stage for."""
    if choice != "auto":
        return choice
    if device.type == "cpu":
        return "none"
    return auto_precision(replace(estimate_memory(path), offload=True), dtype, available_memory(device), rows=2,
                          offered=offered_precisions(device))


def available_memory(device: torch.device) -> int:
    """Free memory on `device` plus what ComfyUI frees for ours: the models it loaded the classic way there
    (it unloads them) and, under dynamic VRAM, the weight pages comfy-aimdo evicts on demand (all a
    dynamically loaded model holds; counting its loaded size too would count them twice)."""
    held = sum(loaded.model_loaded_memory() for loaded in getattr(mm, "current_loaded_models", ())
               if loaded.device == device and loaded.model is not None and not is_dynamic_patcher(loaded.model))
    evictable = reclaimable_bytes() if device.type == "cuda" else 0
    return mm.get_free_memory(device) + held + evictable


def memory_note(model: Any, precision: str, weights: int, cache: int) -> str:
    return (f"{model.family}, weights {precision if precision != 'none' else 'full precision'}: "
            f"{weights / 2**30:.2f} GiB + KV cache and distributions ~{cache / 2**30:.2f} GiB per image (the "
            "sampler reserves its batch's)")


def decoding_note(model: Any, dtype: torch.dtype) -> str:
    """The size of a family's separate decoding stage (e.g. a diffusion decoder and its VAE), which Decode
    loads; "" for one-stage families."""
    if not hasattr(model, "decoding_weights"):
        return ""
    return (f"decoding stage {model.decoding_weights() * dtype.itemsize / 2**30:.2f} GiB more, loaded by SCD VQ "
            "Decode (ComfyUI offloads one stage for the other where both do not fit)")


def fit_note(weights: int, cache: int, free: int, streamable: bool) -> str:
    """What happens to a model whose estimate exceeds the device's free memory; "" when it fits."""
    if weights + cache <= free:
        return ""
    if not streamable:
        return (f"more than the {free / 2**30:.2f} GiB free: a compiled model loads fully; turn compile off "
                "to stream its weights")
    streamed = min(weights, weights + cache - max(free, 0))
    return (f"more than the {free / 2**30:.2f} GiB free: ComfyUI will stream ~{streamed / 2**30:.2f} GiB of "
            "weights from the CPU at every call (a call then costs about the same at any window, so the "
            "automatic window goes wide)")


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
            description=f"Loads an autoregressive image or video model "
                        f"({', '.join(family.label for family in families())}, or the small demo model) for "
                        "speculative coupled decoding.",
            inputs=[
                io.Combo.Input("model", options=list(model_choices()), default=DEMO,
                               tooltip="A folder under models/scd/ or a family folder "
                                       f"({', '.join(f'models/{root}/' for root in MODEL_ROOTS[1:])}); only "
                                       "folders that hold a model this pack recognises are listed (press R to "
                                       "refresh). 'demo' is the small digit model shipped with the pack."),
                CheckedCombo("device", options=list(DEVICES), default="auto",
                             tooltip="auto: ComfyUI's device (respects --cpu)."),
                CheckedCombo("dtype", options=list(DTYPES), default="auto",
                             tooltip="auto: bfloat16 where the GPU supports it, else float32."),
                CheckedCombo("quantize", options=list(QUANTIZE), default="auto", optional=True,
                             tooltip="Weights of the backbone in 8 bits (int8, about half the memory) or 4 bits "
                                     "(nf4, about a quarter; needs bitsandbytes); heads stay in dtype and "
                                     "sampling stays exact. auto: the most precise that fits the GPU's free "
                                     "memory; full precision on the CPU."),
                io.Boolean.Input("compile", default=False, optional=True,
                                 tooltip="Static-shape window calls through torch.compile (CUDA graphs on "
                                         "CUDA); the first call of each window width compiles (minutes on "
                                         f"CPU). {compilable()}; candidates must be 1."),
                CheckedCombo("download", options=list(DOWNLOAD_CHOICES), default=OFF, optional=True,
                             tooltip=download_tooltip()),
            ],
            outputs=[SCDModel.Output(display_name="model")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def validate_inputs(cls, model: Optional[str] = None) -> bool | str:
        # only `model` here: ComfyUI flags every input named in this signature with the message
        choices = model_choices()
        if model is not None and model not in choices:
            return unknown_model_message(model, choices)
        return True

    @classmethod
    def execute(cls, model: str, device: str, dtype: str, quantize: str = "auto",
                compile: bool = False, download: str = OFF) -> io.NodeOutput:
        problem = (choice_error("device", device, DEVICES) or choice_error("dtype", dtype, DTYPES)
                   or choice_error("quantize", quantize, QUANTIZE)
                   or choice_error("download", download, DOWNLOAD_CHOICES))
        if problem:
            raise ValueError(problem)
        node_id = getattr(getattr(cls, "hidden", None), "unique_id", None)
        if download != OFF:
            model, path = fetched_folder(download, None if node_id is None else str(node_id))
        else:
            choices = model_choices()
            if model not in choices:  # e.g. the folder was removed after validation
                raise ModelLoadError(unknown_model_message(model, choices))
            path = DEMO if choices[model] is None else choices[model]
        load_device = compute_device(device)
        offload_device = load_device if load_device.type == "cpu" else mm.unet_offload_device()
        compute_dtype = weight_dtype(dtype, load_device)
        precision = chosen_precision(quantize, path, load_device, compute_dtype)
        check_precision(precision, load_device, compute_dtype)  # e.g. nf4 on MPS: before anything is read
        # Loaded on the offload device; ModelPatcher moves it to load_device when a node needs it.
        loaded = load_model(path, device=offload_device, dtype=compute_dtype, quantize=precision, compile=compile)
        weights = module_bytes(loaded.module)  # real bytes: int8 and packed 4-bit weights as stored
        streamable = not compile  # see LoadedModel.to_compute_device
        if streamable:
            make_streamable(loaded.module)
        patcher = classic_patcher_class()(module_holder(loaded.module, model), load_device=load_device,
                                          offload_device=offload_device, size=weights)
        follow_loads(patcher, loaded)
        result = LoadedModel(name=model, model=loaded, patcher=patcher, streamable=streamable,
                             image_cache_bytes=estimate_memory(path).cache_bytes(PROMPT_ALLOWANCE + loaded.num_tokens,
                                                                                 2, compute_dtype),
                             slot_bytes=SLOT_BYTES * loaded.vocab_size)
        cache = result.memory_required  # one image at the automatic window's widest call
        fit = "" if load_device.type == "cpu" else fit_note(weights, cache, available_memory(load_device), streamable)
        note = " | ".join(filter(None, [memory_note(loaded, precision, weights, cache),
                                        decoding_note(loaded, compute_dtype), fit, core_note(load_device)]))
        if node_id is not None:
            PromptServer.instance.send_progress_text(note, str(node_id))
        return io.NodeOutput(result)
