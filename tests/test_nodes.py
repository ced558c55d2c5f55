"""The node pack inside ComfyUI's Python API, in process: registration, schemas, and each node's execute.

ComfyUI comes from the cache that tests/install_comfyui.sh fills; models are the tiny
random Janus checkpoint of janus_fixture.py (real loader, adapter and VQ decoder).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import gc
import importlib
import importlib.util
import inspect
import json
import logging
import math
import re
import sys
import weakref
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Iterator

import pytest
import torch
from scd_core.compiled.cuda_graphs import KeptGraphs
from scd_core.compiled.graph_state import State
from scd_core.models.weights.checkpoints import ModelLoadError
from scd_core.windows import window_policies
from scd_core import SamplerConfig
from scd_core.decoding.config import COUPLERS
from scd_core.models.families.emu3p5_auto import generate_auto
from scd_core.decoding.sampler_options import OPTIONS

from comfy_server import REPO_ROOT, comfyui_main
from emu3_fixture import tiny_emu3_dir  # noqa: F401  (fixture)
from emu3p5_fixture import STORY_SIZE, tiny_emu3p5_base_dir  # noqa: F401  (fixture)
from lumina_fixture import RESOLUTION_2, tiny_lumina2_dir, tiny_lumina_dir  # noqa: F401  (fixtures)
from mammothmoda2_fixture import tiny_preview_dir  # noqa: F401  (fixture)

CONTRACT_NODES = {
    "SCDModelLoader": ("SCD Model Loader", ["SCD_MODEL"]),
    "SCDPromptEncode": ("SCD Prompt Encode", ["SCD_COND"]),
    "SCDSampler": ("SCD Sampler", ["SCD_TOKENS", "SCD_STATS"]),
    "SCDVQDecode": ("SCD VQ Decode", ["IMAGE"]),
    "SCDStats": ("SCD Stats", ["IMAGE", "STRING"]),
    "SCDVideoContext": ("SCD Video Context", ["SCD_COND"]),
    "SCDImagePrompt": ("SCD Image Prompt", ["SCD_COND"]),
    "SCDEmu3p5Story": ("SCD Emu3.5 Story", ["IMAGE", "STRING"]),
}


@pytest.fixture(scope="module")
def comfy() -> Iterator[SimpleNamespace]:
    """ComfyUI's modules, imported the way main.py sets them up for --cpu."""
    saved_path = list(sys.path)
    sys.path.insert(0, str(comfyui_main().parent))  # before the repository root: ComfyUI's `nodes`, not ours
    from comfy.cli_args import args

    args.cpu = True
    import comfy.model_management as mm
    import comfy.utils
    import folder_paths
    # first, as main.py does: ComfyUI's nodes.py puts comfy/ (which has a utils.py) in front of sys.path
    import utils.install_util  # noqa: F401
    import server

    yield SimpleNamespace(mm=mm, utils=comfy.utils, folder_paths=folder_paths, server=server)
    sys.path[:] = saved_path  # ComfyUI also added its comfy/ folder (with a utils.py) in front


@pytest.fixture(scope="module")
def pack(comfy: SimpleNamespace) -> ModuleType:
    """The repository loaded as a custom node package, as ComfyUI's load_custom_node does."""
    spec = importlib.util.spec_from_file_location("comfyui_scd_under_test", REPO_ROOT / "__init__.py",
                                                  submodule_search_locations=[str(REPO_ROOT)])
    # a module loaded before (another test module's) would lend this one its submodules without binding them
    # as attributes (`pack.nodes`): load the whole package afresh, as a new ComfyUI process does
    for name in [name for name in sys.modules if name == spec.name or name.startswith(spec.name + ".")]:
        del sys.modules[name]
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def node_classes(pack: ModuleType) -> dict[str, Any]:
    extension = asyncio.run(pack.comfy_entrypoint())
    nodes = asyncio.run(extension.get_node_list())
    return {node.GET_SCHEMA().node_id: node for node in nodes}


class FakeServer:
    """Stands in for PromptServer.instance: records what the nodes send."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.texts: list[tuple[str, str]] = []
        self.on_event = None

    def send_sync(self, event: str, data: Any, sid: Any = None) -> None:
        self.events.append((event, data))
        if self.on_event is not None:
            self.on_event(event, data)

    def send_progress_text(self, text: str, node_id: str, sid: Any = None) -> None:
        self.texts.append((node_id, text))


@pytest.fixture
def fake_server(comfy: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> FakeServer:
    fake = FakeServer()
    monkeypatch.setattr(comfy.server.PromptServer, "instance", fake, raising=False)
    previews: list[Any] = []
    monkeypatch.setattr(comfy.utils, "PROGRESS_BAR_HOOK",
                        lambda value, total, preview, node_id=None: previews.append(preview))
    fake.previews = previews
    return fake


def list_in_comfyui(comfy: SimpleNamespace, root_name: str, folder: Path, name: str) -> None:
    """Make `folder` the model folder `name` under ComfyUI's models/`root_name`: a link in a models root beside
    the tiny checkpoint, registered with ComfyUI's folder paths."""
    root = Path(folder).parent / f"models_{root_name.lower()}"
    root.mkdir(exist_ok=True)
    link = root / name
    if not link.exists():
        link.symlink_to(folder, target_is_directory=True)
    comfy.folder_paths.add_model_folder_path(root_name, str(root))


@pytest.fixture(scope="module")
def janus(node_classes: dict[str, Any], comfy: SimpleNamespace, tiny_janus_dir: Path) -> Any:
    """The tiny Janus loaded through the loader node (models/scd/tiny-janus)."""
    list_in_comfyui(comfy, "scd", tiny_janus_dir, "tiny-janus")
    return node_classes["SCDModelLoader"].execute("tiny-janus", "auto", "auto").result[0]


def run_node(node: Any, **inputs: Any) -> tuple:
    clone = node.PREPARE_CLASS_CLONE({"UNIQUE_ID": "7"})
    with torch.inference_mode():  # as ComfyUI's executor does
        return clone.execute(**inputs).result


def sampler_inputs(model: Any, cond: Any, **overrides: Any) -> dict[str, Any]:
    inputs = dict(model=model, conditioning=cond, coupler="maximal", window=4, cfg_scale=-1.0, seed=3,
                  temperature=1.0, top_k=0, top_p=1.0, draft_init="above", batch_size=1)
    return inputs | overrides


# -- registration and schemas --------------------------------------------------------------------
def test_extension_registers_the_contract_nodes(pack: ModuleType, node_classes: dict[str, Any]) -> None:
    assert pack.WEB_DIRECTORY == "./web"
    assert not hasattr(pack, "NODE_CLASS_MAPPINGS")  # would make ComfyUI register the pack the V1 way
    assert set(node_classes) == set(CONTRACT_NODES)
    for node_id, (display_name, outputs) in CONTRACT_NODES.items():
        info = node_classes[node_id].GET_NODE_INFO_V1()
        assert info["display_name"] == display_name
        assert info["output"] == outputs
        assert info["category"] == "SCD"


def inputs_of(node: Any) -> dict[str, tuple[str, dict[str, Any]]]:
    info = node.GET_NODE_INFO_V1()["input"]
    return {**info["required"], **info.get("optional", {})}


def test_loader_schema(node_classes: dict[str, Any]) -> None:
    inputs = inputs_of(node_classes["SCDModelLoader"])
    assert list(inputs) == ["model", "device", "dtype", "quantize", "compile", "download"]
    # nothing is downloaded unless asked, and old workflows (without the input) load as before
    assert inputs["download"][1]["default"] == "off" and inputs["download"][1]["options"] == [
        "off", "deepseek-community/Janus-Pro-1B", "deepseek-community/Janus-Pro-7B", "BAAI/Emu3-Gen-hf",
        "zai-org/GLM-Image"]
    assert "download" in node_classes["SCDModelLoader"].GET_NODE_INFO_V1()["input"]["optional"]
    assert inputs["quantize"][0] == inputs["quantize"][1]["options"] == ["auto", "none", "int8", "nf4"]
    assert inputs["quantize"][1]["default"] == "auto"
    assert "quantize" in node_classes["SCDModelLoader"].GET_NODE_INFO_V1()["input"]["optional"]  # old workflows
    assert inputs["compile"][0] == "BOOLEAN" and inputs["compile"][1]["default"] is False
    assert "compile" in node_classes["SCDModelLoader"].GET_NODE_INFO_V1()["input"]["optional"]
    assert inputs["model"][0] == "COMBO" and inputs["model"][1]["options"][0] == "demo"
    # typed by their options, ComfyUI checks device and dtype itself and reports each against its input
    assert inputs["device"][0] == inputs["device"][1]["options"] == ["auto", "cpu", "cuda", "mps"]
    assert inputs["dtype"][0] == inputs["dtype"][1]["options"] == ["auto", "float32", "bfloat16", "float16"]
    assert inputs["device"][1]["default"] == inputs["dtype"][1]["default"] == "auto"


@pytest.mark.parametrize("precision,layer", [
    ("int8", "Int8Linear"),
    pytest.param("nf4", "Linear4bit", marks=pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None,
                                                               reason="bitsandbytes (tests/requirements.txt)"))])
def test_loader_quantized_reports_the_real_bytes_and_the_cache_to_comfyui(
        node_classes: dict[str, Any], janus: Any, fake_server: FakeServer, precision: str, layer: str) -> None:
    from scd_core.models.weights.quantize import module_bytes

    (loaded,) = run_node(node_classes["SCDModelLoader"], model="tiny-janus", device="cpu", dtype="float32",
                         quantize=precision)
    assert loaded.patcher.model_size() == module_bytes(loaded.model.module) < module_bytes(janus.model.module)
    assert any(type(m).__name__ == layer for m in loaded.model.module.modules())
    assert loaded.memory_required > 0
    ((node_id, text),) = fake_server.texts
    assert node_id == "7" and f"weights {precision}" in text and "GiB" in text
    cond = run_node(node_classes["SCDPromptEncode"], model=loaded, prompt="a cat")[0]
    tokens, _ = run_node(node_classes["SCDSampler"], **sampler_inputs(loaded, cond))
    (images,) = run_node(node_classes["SCDVQDecode"], model=loaded, tokens=tokens)
    assert images.shape[0] == 1 and images.shape[-1] == 3


def test_loader_auto_precision_follows_the_free_memory(pack: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    loader = sys.modules[f"{pack.__name__}.nodes.loader"]
    from scd_core.models.loading import estimate_memory

    estimate = estimate_memory("demo")
    cache = estimate.cache_bytes(estimate.tokens, 2, torch.float32)
    gpu = torch.device("cuda")
    full = (estimate.weight_bytes("none", torch.float32) + cache) * 1.2
    least = loader.offered_precisions(gpu)[-1]  # nf4 where bitsandbytes is installed
    assert loader.offered_precisions(torch.device("mps")) == ("none", "int8")  # bitsandbytes lacks MPS
    for free, expected in ((int(full) + 1, "none"), (int(full) - 1, "int8"), (1000, least)):
        monkeypatch.setattr(loader.mm, "get_free_memory", lambda device=None, free=free: free)
        assert loader.chosen_precision("auto", "demo", gpu, torch.float32) == expected
    # memory other models hold on the device counts as free: ComfyUI unloads them for this one
    held = SimpleNamespace(device=gpu, model=object(), model_loaded_memory=lambda: int(full))
    monkeypatch.setattr(loader.mm, "current_loaded_models", [held])
    assert loader.chosen_precision("auto", "demo", gpu, torch.float32) == "none"
    monkeypatch.setattr(loader.mm, "current_loaded_models", [])
    assert loader.chosen_precision("auto", "demo", torch.device("cpu"), torch.float32) == "none"
    assert loader.chosen_precision("int8", "demo", torch.device("cpu"), torch.float32) == "int8"
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # not installed: auto stops at int8
    assert loader.chosen_precision("auto", "demo", gpu, torch.float32) == "int8"


def test_loader_refuses_what_cannot_run(node_classes: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    loader = node_classes["SCDModelLoader"]
    with pytest.raises(ValueError, match="quantize must be one of auto, none, int8, nf4"):
        loader.execute("demo", "cpu", "auto", "int4")
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    with pytest.raises(ValueError, match="pip install bitsandbytes"):
        loader.execute("demo", "cpu", "auto", "nf4")


def test_encode_schema(node_classes: dict[str, Any]) -> None:
    info = node_classes["SCDPromptEncode"].GET_NODE_INFO_V1()["input"]
    assert info["required"]["model"][0] == "SCD_MODEL"
    assert info["required"]["prompt"][0] == "STRING" and info["required"]["prompt"][1]["multiline"]
    assert info["optional"]["negative_prompt"][0] == "STRING"


def test_sampler_schema(node_classes: dict[str, Any]) -> None:
    node = node_classes["SCDSampler"]
    inputs = inputs_of(node)
    # the order saved workflows hold their widget values in; sampler options declared later come last
    added = [option.name for option in OPTIONS if option.name not in ("cfg_scale", "temperature", "top_k", "top_p")]
    assert list(inputs) == ["model", "conditioning", "coupler", "window", "cfg_scale", "seed", "temperature",
                            "top_k", "top_p", "draft_init", "batch_size", "candidates", *added]
    expect = {"conditioning": ("SCD_COND", {}),
              "coupler": (list(COUPLERS), {"options": list(COUPLERS), "default": "faithful"}),
              # 0: automatic (a policy's value below 1)
              "window": ("INT", {"min": window_policies.NODE_MIN, "max": 1024, "default": 0}),
              "cfg_scale": ("FLOAT", {"min": -1.0, "max": 100.0, "default": -1.0}),
              "seed": ("INT", {"min": 0, "control_after_generate": True}),
              "temperature": ("FLOAT", {"min": -1.0, "default": -1.0}),  # -1: the model's (GLM-Image 0.9)
              "top_k": ("INT", {"min": 0, "default": 0}),
              "top_p": ("FLOAT", {"min": 0.0, "max": 1.0, "default": 0.0}),
              "draft_init": (["auto", "random", "left", "above", "previous_frame"],
                             {"options": ["auto", "random", "left", "above", "previous_frame"], "default": "auto"}),
              "batch_size": ("INT", {"min": 1, "max": 16, "default": 1}),
              "candidates": ("INT", {"min": 1, "max": 8, "default": 1})}
    for name, (io_type, options) in expect.items():
        assert inputs[name][0] == io_type, name
        assert {k: inputs[name][1].get(k) for k in options} == options, name
    # optional, so API workflows saved before it existed still validate
    assert list(node.GET_NODE_INFO_V1()["input"]["optional"]) == ["candidates", *added]
    assert node.GET_NODE_INFO_V1()["output_name"] == ["tokens", "stats"]
    # ComfyUI checks every input itself; a validate_inputs would switch that off for the inputs it names
    # and flag all of them with one message
    assert "validate_inputs" not in vars(node)


def test_decode_and_stats_schema(node_classes: dict[str, Any]) -> None:
    decode = inputs_of(node_classes["SCDVQDecode"])
    assert {name: kind for name, (kind, _) in decode.items()} == {
        "model": "SCD_MODEL", "tokens": "SCD_TOKENS", "conditioning": "SCD_COND", "tile_size": "INT",
        "decoder_steps": "INT", "decoder_guidance": "FLOAT", "decoder_seed": "INT"}
    later = {"conditioning", "tile_size", "decoder_steps", "decoder_guidance", "decoder_seed"}
    assert later <= set(node_classes["SCDVQDecode"].GET_NODE_INFO_V1()["input"]["optional"])
    # defaults that ask for nothing: workflows saved before them decode as they did
    assert [decode[name][1]["default"] for name in sorted(later - {"conditioning"})] == [-1.0, 0, 0, 0]
    assert inputs_of(node_classes["SCDStats"]) == {"stats": ("SCD_STATS", {})}


# -- the loader's model list and validation ----------------------------------------------------------
def test_model_list_holds_demo_and_the_folders_a_family_recognises(node_classes: dict[str, Any],
                                                                   comfy: SimpleNamespace, tmp_path: Path) -> None:
    configs = {"scd/my-model": "janus", "scd/.hidden": "janus", "LlamaGen/c2i-B": "llamagen",
               "scd/flan-t5-xl": "t5"}  # a text encoder is part of a model, not one
    for folder, model_type in configs.items():
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    (tmp_path / "Janus-Pro" / "Janus-Pro-1B").mkdir(parents=True)  # created, not downloaded yet
    (tmp_path / "Cosmos" / "Cosmos-1.0-Tokenizer-DV8x16x16").mkdir(parents=True)
    (tmp_path / "Cosmos" / "Cosmos-1.0-Tokenizer-DV8x16x16" / "decoder.jit").write_bytes(b"")
    (tmp_path / "scd" / "stray.txt").write_text("not a model")
    for root in ("scd", "Janus-Pro", "LlamaGen", "Cosmos"):
        comfy.folder_paths.add_model_folder_path(root, str(tmp_path / root))
    options = inputs_of(node_classes["SCDModelLoader"])["model"][1]["options"]
    assert options[0] == "demo"
    assert {"my-model", "LlamaGen/c2i-B"} <= set(options)
    assert not {".hidden", "stray.txt", "flan-t5-xl", "Janus-Pro/Janus-Pro-1B", "Janus-Pro", "LlamaGen",
                "Cosmos/Cosmos-1.0-Tokenizer-DV8x16x16"} & set(options)

    # a workflow naming the empty folder hears what it holds and what to download into it
    message = node_classes["SCDModelLoader"].validate_inputs(model="Janus-Pro/Janus-Pro-1B")
    assert "is not a model folder this pack can load (found: nothing)" in message
    assert "download the Hugging Face repository deepseek-community/Janus-Pro-1B" in message
    assert "into models/Janus-Pro/Janus-Pro-1B/" in message


@pytest.mark.parametrize("name, repository, folder", [
    ("Lumina-mGPT-7B-768", "Alpha-VLLM/Lumina-mGPT-7B-768", "models/scd/Lumina-mGPT-7B-768/"),
    ("Emu3/Emu3-Gen", "BAAI/Emu3-Gen-hf", "models/Emu3/Emu3-Gen/"),  # the tiny Emu3 test adds Emu3-Gen-hf
    ("Cosmos/Cosmos-1.0-Autoregressive-4B", "nvidia/Cosmos-1.0-Tokenizer-DV8x16x16",
     "models/Cosmos/Cosmos-1.0-Autoregressive-4B/"),
    ("LlamaGen/LlamaGen-c2i-B-256", "FoundationVision/LlamaGen", "models/LlamaGen/LlamaGen-c2i-B-256/"),
])
def test_a_missing_model_names_the_repository_to_download(node_classes: dict[str, Any], name: str,
                                                          repository: str, folder: str) -> None:
    message = node_classes["SCDModelLoader"].validate_inputs(model=name)
    assert message.startswith(f"model '{name}' not found; download ")
    assert repository in message and f"into {folder} and refresh" in message


def test_loader_rejects_unknown_choices(node_classes: dict[str, Any], pack: ModuleType) -> None:
    loader = node_classes["SCDModelLoader"]
    message = loader.validate_inputs(model="no-such-model")
    assert "no-such-model" in message and "models/scd/" in message
    assert loader.validate_inputs(model="demo") is True
    # ComfyUI reports a custom check's message against every input the function takes: only `model`
    assert inspect.getfullargspec(loader.validate_inputs).args == ["cls", "model"]
    with pytest.raises(ValueError, match="device must be one of"):  # a direct call, past ComfyUI's check
        loader.execute("demo", "tpu", "auto")
    with pytest.raises(ModelLoadError, match="no-such-model"):
        loader.execute("no-such-model", "auto", "auto")


def test_explicit_device_must_exist(pack: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    loader = sys.modules[f"{pack.__name__}.nodes.loader"]
    compute_device = loader.compute_device
    assert compute_device("cpu") == torch.device("cpu")
    assert compute_device("auto") == torch.device("cpu")  # --cpu is respected
    for device in ("cuda", "mps"):  # under --cpu, whatever this machine has
        with pytest.raises(ValueError, match=f"device '{device}' was chosen but ComfyUI runs with --cpu; "
                                             "choose auto"):
            compute_device(device)
    monkeypatch.setattr(loader.args, "cpu", False)
    if torch.cuda.is_available():
        assert compute_device("cuda").type == "cuda"
    else:
        with pytest.raises(ValueError, match="CUDA is not available on this machine; choose auto"):
            compute_device("cuda")


def test_comfyui_names_the_model_it_loads(janus: Any) -> None:
    """ComfyUI logs "Requested to load <class name>" for the module a ModelPatcher holds."""
    assert type(janus.patcher.model).__name__ == "SCD tiny-janus"
    assert janus.patcher.model.inner is janus.model.module


def test_sampler_validation(node_classes: dict[str, Any], pack: ModuleType) -> None:
    sampler_config = sys.modules[f"{pack.__name__}.nodes.sampler"].sampler_config
    widgets = {option.name: option.recommended for option in OPTIONS} | {"temperature": 1.0, "top_p": 1.0}

    def config(coupler: str = "maximal", window: int = 8, candidates: int = 1, **options: float) -> Any:
        return sampler_config(coupler, window, 1, "left", candidates, **(widgets | options))

    assert config().cfg_scale is None and config().top_k is None  # the widgets' "recommended" sentinels
    assert config(cfg_scale=2.5, top_k=50).top_k == 50
    with pytest.raises(ValueError, match="cfg_scale must be -1"):
        config(cfg_scale=-0.5)
    assert config().temperature == 1.0 and config(temperature=-1.0, top_p=0.0).temperature is None
    with pytest.raises(ValueError, match=r"temperature must be -1 \(the model's recommended value\) or a number"):
        config(temperature=0.0)
    assert config(window=0).window == "auto"
    with pytest.raises(ValueError, match="window"):
        config(window=-1)
    assert config().candidates == 1  # the optional widget's default
    with pytest.raises(ValueError, match="candidates"):
        config("faithful", candidates=2)
    # a NaN or out-of-range widget value (the API format passes NaN through ComfyUI's min/max check) is named as
    # the widget reads, its "recommended" value included: not the library's None
    for widget, bad, expected in (("cfg_scale", math.nan, "-1 (the model's recommended value) or a number in 0..100"),
                                  ("cfg_scale", 101.0, "-1 (the model's recommended value) or a number in 0..100"),
                                  ("temperature", math.nan, "-1 (the model's recommended value) or a number in (0, 100]"),
                                  ("top_p", math.nan, "0 (the model's recommended value) or a number in (0, 1]"),
                                  ("top_k", -3, "0 (the model's recommended value) or an integer >= 1")):
        with pytest.raises(ValueError) as caught:
            config(**{widget: bad})
        assert str(caught.value) == f"{widget} must be {expected}, got {bad}"
    guidance_scale = sys.modules[f"{pack.__name__}.nodes.checks"].guidance_scale
    with pytest.raises(ValueError, match=r"^image_cfg must be -1 \(the model's recommended value\) or a number in "
                                         r"0\.\.100, got nan$"):
        guidance_scale("image_cfg", math.nan)


# -- executing the nodes on the tiny Janus --------------------------------------------------------
def test_mammothmoda2_previews_its_token_map_and_reports_the_dit_steps(node_classes: dict[str, Any],
                                                                       comfy: SimpleNamespace, tiny_preview_dir: Path,
                                                                       fake_server: FakeServer) -> None:
    """MammothModa2 through both stages: the sampler previews a token map (the DiT never runs for a preview), SCD
    VQ Decode moves ComfyUI's bar once per DiT step (its decoder_steps) and gives the image at the asked size; its
    decoder_seed and decoder_guidance are the library's set_decoding, each decode from the pipeline's defaults."""
    from scd_core import set_decoding
    from scd_core.models.families.mammothmoda2_decode import DiTSettings

    list_in_comfyui(comfy, "scd", tiny_preview_dir, "tiny-mammothmoda2")
    model = node_classes["SCDModelLoader"].execute("tiny-mammothmoda2", "auto", "auto").result[0]
    (cond,) = run_node(node_classes["SCDPromptEncode"], model=model, prompt="a red square", negative_prompt="",
                       width=96, height=64)  # one code per 32 px: 2 x 3
    tokens, stats = run_node(node_classes["SCDSampler"], **sampler_inputs(model, cond))
    assert tokens.shape == (1, 8) and stats.result.nfe == len(fake_server.previews)
    assert fake_server.previews[-1] is not None  # the finished token map at least
    sampled = len(fake_server.previews)
    (image,) = run_node(node_classes["SCDVQDecode"], model=model, tokens=tokens, decoder_steps=3)
    assert image.shape == (1, 64, 96, 3) and len(fake_server.previews) == sampled + 3
    assert model.model.decode_progress is None and model.model.stage_switch is None  # the node's hooks are gone
    (seeded,) = run_node(node_classes["SCDVQDecode"], model=model, tokens=tokens, decoder_steps=3, decoder_seed=4,
                         decoder_guidance=2.0)
    set_decoding(model.model, steps=3, seed=4, guidance=2.0)
    assert torch.equal(seeded, model.model.decode(tokens)) and not torch.equal(seeded, image)
    run_node(node_classes["SCDVQDecode"], model=model, tokens=tokens, decoder_steps=2)
    assert model.model.decoding == DiTSettings(steps=2)  # the rest the pipeline's


def test_pipeline_runs_and_reports_every_iteration(node_classes: dict[str, Any], janus: Any,
                                                   fake_server: FakeServer) -> None:
    assert janus.patcher.load_device == torch.device("cpu")
    (cond,) = run_node(node_classes["SCDPromptEncode"], model=janus, prompt="a red square", negative_prompt="")
    tokens, stats = run_node(node_classes["SCDSampler"], **sampler_inputs(janus, cond))
    n = janus.model.num_tokens
    assert tokens.shape == (1, n) and tokens.dtype == torch.long and tokens.device.type == "cpu"

    events = [data for name, data in fake_server.events if name == "scd.progress"]
    assert len(events) == stats.result.nfe == len(fake_server.texts) == len(fake_server.previews)
    assert [e["iteration"] for e in events] == list(range(stats.result.nfe))
    assert sum(e["committed"] for e in events) == n == events[-1]["total"]
    assert all(e["node"] == "7" and e["num_tokens"] == n and e["calls_saved"] == e["total"] - e["nfe"]
               for e in events)
    assert fake_server.texts[0] == ("7", f"1 call, {events[0]['total']} / {n} tokens")
    assert fake_server.texts[-1] == ("7", f"{stats.result.nfe} calls, {n} / {n} tokens")
    assert [text for _, text in fake_server.texts] == [
        f"{e['nfe']} call{'s' if e['nfe'] != 1 else ''}, {e['total']} / {n} tokens" for e in events]
    # the last iteration always carries the finished preview
    kind, preview, _ = fake_server.previews[-1]
    assert kind == "JPEG" and preview.size == (64, 64)

    (image,) = run_node(node_classes["SCDVQDecode"], model=janus, tokens=tokens)
    assert image.shape == (1, 64, 64, 3) and image.dtype == torch.float32
    assert 0.0 <= float(image.min()) and float(image.max()) <= 1.0

    chart, summary = run_node(node_classes["SCDStats"], stats=stats)
    assert chart.shape == (1, 300, 480, 3) and 0.0 <= float(chart.min()) <= float(chart.max()) <= 1.0
    assert f"in {stats.result.nfe} model calls" in summary and "fewer calls" in summary
    # three lines that stay lines in the frontend's Markdown text preview (a hard break ends each)
    lines = summary.split("\n")
    assert len(lines) == 3 and all(line.endswith("  ") for line in lines[:-1])
    # a compiled model's part that ran eagerly gets a line of its own, with why
    reason = "the sampling step: BackendCompilerFailed: no C++ compiler"
    stats.result.eager_fallbacks = [reason]
    _, summary = run_node(node_classes["SCDStats"], stats=stats)
    assert summary.split("\n")[-1] == f"ran eagerly (compile=True): {reason}"


def test_candidates_feed_trees_and_the_summary_says_so(node_classes: dict[str, Any], janus: Any,
                                                       fake_server: FakeServer) -> None:
    (cond,) = run_node(node_classes["SCDPromptEncode"], model=janus, prompt="a red square", negative_prompt="")
    tokens, stats = run_node(node_classes["SCDSampler"], **sampler_inputs(janus, cond, window=4, candidates=3))
    assert tokens.shape == (1, janus.model.num_tokens) and stats.config.candidates == 3
    assert stats.result.fed[1] == 1 + 3 * 3  # a tree: the shared token, then 3 chains of the 3 later slots
    (_, summary) = run_node(node_classes["SCDStats"], stats=stats)
    assert "3 candidates" in summary


def test_window_0_picks_the_width_per_call_and_the_summary_lists_the_widths(node_classes: dict[str, Any],
                                                                            janus: Any,
                                                                            fake_server: FakeServer) -> None:
    (cond,) = run_node(node_classes["SCDPromptEncode"], model=janus, prompt="a red square", negative_prompt="")
    tokens, stats = run_node(node_classes["SCDSampler"], **sampler_inputs(janus, cond, window=0))
    assert stats.config.window == "auto" and tokens.shape == (1, janus.model.num_tokens)
    assert len(stats.result.windows) == stats.result.nfe
    _, summary = run_node(node_classes["SCDStats"], stats=stats)
    used = collections.Counter(stats.result.windows[1:])
    (width, calls), *others = sorted(used.items(), key=lambda item: -item[1])
    listed = ", ".join([f"{calls} calls at width {width}"] + [f"{c} at width {w}" for w, c in others])
    assert f"window auto ({listed})" in summary


def test_the_automatic_window_keeps_its_costs_in_comfyui_s_user_directory(
        pack: ModuleType, node_classes: dict[str, Any], janus: Any, comfy: SimpleNamespace, fake_server: FakeServer,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scd_core.windows import window_memory

    monkeypatch.delenv(window_memory.ENV)  # the tests' "off"
    monkeypatch.setattr(window_memory, "_folder", None)  # restored after the test
    monkeypatch.setattr(window_memory, "_tracked", {})
    monkeypatch.setattr(window_memory, "_written", {})
    monkeypatch.setattr(comfy.folder_paths, "user_directory", str(tmp_path / "user"))  # as --user-directory does
    importlib.reload(pack.nodes)  # the pack's start, under that user directory
    (cond,) = run_node(node_classes["SCDPromptEncode"], model=janus, prompt="a red square", negative_prompt="")
    run_node(node_classes["SCDSampler"], **sampler_inputs(janus, cond, window=0))
    saved = json.loads((tmp_path / "user" / "comfyui-scd" / window_memory.FILE_NAME).read_text())
    assert saved["format"] == window_memory.FORMAT and len(saved["models"]) == 1


def test_a_window_wider_than_the_image_is_reported_as_the_width_used(node_classes: dict[str, Any], janus: Any,
                                                                     fake_server: FakeServer) -> None:
    (cond,) = run_node(node_classes["SCDPromptEncode"], model=janus, prompt="a red square", negative_prompt="")
    _, stats = run_node(node_classes["SCDSampler"], **sampler_inputs(janus, cond, window=64))
    _, summary = run_node(node_classes["SCDStats"], stats=stats)
    used = max(stats.result.windows)
    assert used <= janus.model.num_tokens < 64
    assert f"window {used} (set to 64: wider than the image)" in summary


def test_settings_far_from_the_model_s_warn_on_the_status_line_and_in_the_log(
        node_classes: dict[str, Any], janus: Any, fake_server: FakeServer, caplog: pytest.LogCaptureFixture) -> None:
    (cond,) = run_node(node_classes["SCDPromptEncode"], model=janus, prompt="a red square", negative_prompt="")
    with caplog.at_level(logging.WARNING):
        tokens, stats = run_node(node_classes["SCDSampler"], **sampler_inputs(janus, cond, cfg_scale=100.0))
    warning = "CFG 100 is far above this model's 5 (more than 3x tends to give noise)"
    assert tokens.shape == (1, janus.model.num_tokens)  # a warning, not an error
    assert [text for _, text in fake_server.texts][-1].endswith(f" tokens | {warning}")
    assert all(text.endswith(warning) for _, text in fake_server.texts)
    assert [record.getMessage() for record in caplog.records if warning in record.getMessage()] == [
        f"SCD Sampler (model 'tiny-janus'): {warning}"]
    fake_server.texts.clear()
    run_node(node_classes["SCDSampler"], **sampler_inputs(janus, cond, cfg_scale=15.0))  # 3x: in range
    assert fake_server.texts and not [text for _, text in fake_server.texts if "|" in text]


def test_stats_chart_is_legible_at_node_size(pack: ModuleType, node_classes: dict[str, Any]) -> None:
    # node_classes imports the nodes, chart among them
    import numpy as np

    chart = sys.modules[f"{pack.__name__}.nodes.chart"]
    image = np.asarray(chart.committed_chart([1, 4, 3, 6], [1.0, 0.5, 0.7, 0.9], "4 calls for 14 tokens"))
    node_width = 280  # a node shows the preview scaled to its width
    scale = node_width / image.shape[1]
    title_rows = np.nonzero((image == rgb(chart.TEXT)).all(-1).any(1))[0]
    assert len(title_rows) and (title_rows.max() - title_rows.min() + 1) * scale >= 10, "title too small"
    label_rows = np.nonzero((image == rgb(chart.AXIS)).all(-1)[image.shape[0] * 9 // 10:].any(1))[0]
    assert len(label_rows) and (label_rows.max() - label_rows.min() + 1) * scale >= 8, "axis label too small"


def rgb(color: str) -> tuple[int, int, int]:
    return tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))


def test_stats_chart_uses_the_live_charts_colours(pack: ModuleType, node_classes: dict[str, Any]) -> None:
    # node_classes imports the nodes, chart among them
    """One colour scheme in the sampler's live chart (web/js/scd_widget.js) and the SCD Stats chart."""
    import numpy as np

    chart = sys.modules[f"{pack.__name__}.nodes.chart"]
    widget = (REPO_ROOT / "web" / "js" / "scd_widget.js").read_text()
    for js_name, python_name in (("background", "BACKGROUND"), ("arBar", "AR_BAR"), ("scdBar", "SCD_BAR"),
                                 ("forcedBar", "FORCED_BAR"), ("baseline", "BASELINE"), ("text", "TEXT"),
                                 ("muted", "AXIS")):
        found = re.search(rf'\b{js_name}: "(#[0-9a-f]{{6}})"', widget)
        assert found and found.group(1) == getattr(chart, python_name).lower(), f"{js_name} differs"
    # an autoregressive run: every bar in the one-token colour, none in the several-tokens one
    image = np.asarray(chart.committed_chart([1] * 8, [], "8 calls for 8 tokens"))
    plot = image[chart.MARGIN_TOP:chart.HEIGHT - chart.MARGIN_BOTTOM, chart.MARGIN_LEFT:chart.WIDTH - chart.MARGIN_RIGHT]
    assert (plot == rgb(chart.AR_BAR)).all(-1).sum() > 1000
    assert not (plot == rgb(chart.SCD_BAR)).all(-1).any()
    assert not (image == rgb(chart.FORCED_BAR)).all(-1).any()  # no forced tokens: no colour, no legend entry


def test_stats_chart_stacks_forced_tokens_on_the_sampled_ones(pack: ModuleType, node_classes: dict[str, Any]) -> None:
    """A continuation's calls: 1 sampled + 127 given, then 4 sampled: purple bars as tall as the given tokens,
    green and grey ones as the sampled, and a legend entry."""
    import numpy as np

    chart = sys.modules[f"{pack.__name__}.nodes.chart"]
    committed, forced = [1, 128, 4, 4], [0, 127, 0, 0]
    image = np.asarray(chart.committed_chart(committed, [], "4 calls", forced))  # no acceptance line across
    plot = image[chart.MARGIN_TOP:chart.HEIGHT - chart.MARGIN_BOTTOM, chart.MARGIN_LEFT:chart.WIDTH - chart.MARGIN_RIGHT]
    column_height = lambda color: (plot == rgb(color)).all(-1).sum(0).max()  # noqa: E731  (the tallest bar)
    plot_h = chart.HEIGHT - chart.MARGIN_BOTTOM - chart.MARGIN_TOP
    assert abs(column_height(chart.FORCED_BAR) - plot_h * 127 / 128) <= 2
    assert abs(column_height(chart.SCD_BAR) - plot_h * 4 / 128) <= 2  # call 3 and 4 sampled 4 each
    assert abs(column_height(chart.AR_BAR) - plot_h * 1 / 128) <= 2  # calls 1 and 2 sampled one
    legend = image[:chart.MARGIN_TOP]
    assert (legend == rgb(chart.FORCED_BAR)).all(-1).sum() > 100


def test_sampler_is_thin_over_generate(node_classes: dict[str, Any], janus: Any, fake_server: FakeServer,
                                       pack: ModuleType) -> None:
    import scd_core

    (cond,) = run_node(node_classes["SCDPromptEncode"], model=janus, prompt="a blue circle")
    tokens, _ = run_node(node_classes["SCDSampler"], **sampler_inputs(janus, cond, coupler="faithful", seed=11,
                                                                      batch_size=2))
    config = scd_core.SamplerConfig(coupler="faithful", window=4, seed=11, draft_init="above")
    with torch.inference_mode():
        direct = scd_core.generate(janus.model, cond.cond, config, batch_size=2)
    assert torch.equal(tokens, direct.tokens)


def test_a_batch_is_the_images_its_seeds_make_one_at_a_time(node_classes: dict[str, Any], janus: Any,
                                                             fake_server: FakeServer) -> None:
    """Row i of a batch at seed s is the image seed s + i makes alone: a distributed seed input (ComfyUI-Distributed
    gives worker k seed s + k + 1) reproduces a single server's batch."""
    (cond,) = run_node(node_classes["SCDPromptEncode"], model=janus, prompt="a blue circle")
    sampler = node_classes["SCDSampler"]
    batch, _ = run_node(sampler, **sampler_inputs(janus, cond, seed=5, batch_size=3))
    alone = [run_node(sampler, **sampler_inputs(janus, cond, seed=5 + i))[0] for i in range(3)]
    assert torch.equal(batch, torch.cat(alone))
    assert not torch.equal(alone[0], alone[1])  # the seeds do make other images


def test_interrupt_stops_promptly_and_frees_the_run(node_classes: dict[str, Any], janus: Any, comfy: SimpleNamespace,
                                                    fake_server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    sessions: list[weakref.ref] = []
    original_start = janus.model.start

    def tracked_start(cond: Any, batch_size: int) -> Any:
        session = original_start(cond, batch_size)
        sessions.append(weakref.ref(session))
        return session

    monkeypatch.setattr(janus.model, "start", tracked_start)
    # the user presses Cancel while iteration 1 is reported
    fake_server.on_event = lambda name, data: (name == "scd.progress" and data["iteration"] == 1
                                               and comfy.mm.interrupt_current_processing(True))
    (cond,) = run_node(node_classes["SCDPromptEncode"], model=janus, prompt="stop me")
    with pytest.raises(comfy.mm.InterruptProcessingException) as caught:
        run_node(node_classes["SCDSampler"], **sampler_inputs(janus, cond, window=2, seed=5))
    assert len([e for e in fake_server.events if e[0] == "scd.progress"]) == 2  # stopped at the next call
    # ComfyUI keeps the exception after the run; it must not pin the engine's frames and KV cache
    error = caught.value
    gc.collect()
    assert len(sessions) == 1 and sessions[0]() is None
    assert error.__traceback__ is not None
    assert not comfy.mm.processing_interrupted()


def test_bad_inputs_give_actionable_errors(node_classes: dict[str, Any], janus: Any,
                                           fake_server: FakeServer) -> None:
    with pytest.raises(ValueError, match="prompt is empty"):
        run_node(node_classes["SCDPromptEncode"], model=janus, prompt="   ")
    with pytest.raises(ValueError, match="one image size only"):
        run_node(node_classes["SCDPromptEncode"], model=janus, prompt="x", width=512, height=512)
    with pytest.raises(ValueError, match="must both be positive pixel counts"):
        run_node(node_classes["SCDPromptEncode"], model=janus, prompt="x", width=512, height=0)
    (cond,) = run_node(node_classes["SCDPromptEncode"], model=janus, prompt="x")
    other = dataclasses.replace(janus, name="another-model")
    with pytest.raises(ValueError, match="same SCD Model Loader"):
        run_node(node_classes["SCDSampler"], **sampler_inputs(other, cond))
    with pytest.raises(ValueError, match=r"do not fit model 'tiny-janus'"):
        run_node(node_classes["SCDVQDecode"], model=janus, tokens=torch.zeros(1, 3, dtype=torch.long))


def test_errors_name_what_the_sampler_node_shows(node_classes: dict[str, Any], janus: Any,
                                                 fake_server: FakeServer) -> None:
    """No grid shapes, block verification or fixed shapes: the node has none of these."""
    (cond,) = run_node(node_classes["SCDPromptEncode"], model=janus, prompt="x")
    with pytest.raises(ValueError) as caught:
        run_node(node_classes["SCDSampler"], **sampler_inputs(janus, cond, draft_init="previous_frame"))
    assert str(caught.value) == ("draft_init previous_frame copies the same place one video frame earlier, but "
                                 "model 'tiny-janus' makes single images; choose auto, above, left or random")
    with pytest.raises(ValueError) as caught:
        run_node(node_classes["SCDSampler"], **sampler_inputs(janus, cond, coupler="faithful", candidates=2))
    assert str(caught.value) == ("candidates must be 1 with the faithful coupler (got 2): set candidates to 1 or "
                                 "choose another coupler")  # one short sentence, not the coupler's description
    assert "verification" not in str(caught.value) and not fake_server.events  # refused before sampling


def test_the_demo_asks_for_a_digit(node_classes: dict[str, Any], fake_server: FakeServer) -> None:
    (demo,) = node_classes["SCDModelLoader"].execute("demo", "auto", "auto").result
    with pytest.raises(ValueError) as caught:
        run_node(node_classes["SCDPromptEncode"], model=demo, prompt="a cat")
    assert "one of its classes (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)" in str(caught.value)
    assert "ImageNet" not in str(caught.value)


def test_sampling_settings_and_stats_explain_themselves(node_classes: dict[str, Any]) -> None:
    inputs = inputs_of(node_classes["SCDSampler"])
    for name in ("seed", "temperature", "batch_size", "cfg_scale", "top_k", "top_p"):
        assert inputs[name][1].get("tooltip"), name
    # what "the model's value" is, family by family
    assert "Emu3 2048" in inputs["top_k"][1]["tooltip"] and "generate's 50" in inputs["top_k"][1]["tooltip"]
    assert "5B-Video2World 0.7" in inputs["top_p"][1]["tooltip"]
    assert "row i uses seed + i" in inputs["batch_size"][1]["tooltip"]
    stats = node_classes["SCDStats"].GET_NODE_INFO_V1()
    assert "acceptance is the share of a call's drafts" in stats["description"]
    assert all(stats["output_tooltips"])


def test_tiny_lumina_runs_through_the_nodes(node_classes: dict[str, Any], comfy: SimpleNamespace,
                                            tiny_lumina_dir: Path, fake_server: FakeServer) -> None:
    """Loader lists and loads the folder; forced row-end/end-of-image ids survive; previews decode mid-run."""
    list_in_comfyui(comfy, "scd", tiny_lumina_dir, tiny_lumina_dir.name)
    (model,) = node_classes["SCDModelLoader"].execute(tiny_lumina_dir.name, "auto", "auto").result
    assert model.model.family == "lumina-mgpt"
    (cond,) = run_node(node_classes["SCDPromptEncode"], model=model, prompt="a red square", negative_prompt="")
    tokens, stats = run_node(node_classes["SCDSampler"], **sampler_inputs(model, cond, window=3, batch_size=2))
    n = model.model.num_tokens
    assert tokens.shape == (2, n) and len(stats.result.committed) == stats.result.nfe <= n
    for position, token in model.model.forced_tokens.items():
        assert (tokens[:, position] == token).all()
    assert len(fake_server.previews) == stats.result.nfe and fake_server.previews[-1][1].size == (64, 64)
    (image,) = run_node(node_classes["SCDVQDecode"], model=model, tokens=tokens)
    assert image.shape == (2, 64, 64, 3) and 0.0 <= float(image.min()) <= float(image.max()) <= 1.0


def test_tiny_emu3_runs_through_the_nodes(node_classes: dict[str, Any], comfy: SimpleNamespace,
                                          tiny_emu3_dir: Path, fake_server: FakeServer) -> None:
    """Listed under models/Emu3/, loaded, sampled with forced row-end and closing ids, previewed and decoded."""
    list_in_comfyui(comfy, "Emu3", tiny_emu3_dir, "Emu3-Gen-hf")
    assert "Emu3/Emu3-Gen-hf" in inputs_of(node_classes["SCDModelLoader"])["model"][1]["options"]
    (model,) = node_classes["SCDModelLoader"].execute("Emu3/Emu3-Gen-hf", "auto", "auto").result
    assert model.model.family == "emu3" and model.model.num_tokens == 8193  # 720 px by default
    (cond,) = run_node(node_classes["SCDPromptEncode"], model=model, prompt="a red square", negative_prompt="",
                       width=32, height=24)  # a 3 x 4 grid: 18 tokens
    tokens, stats = run_node(node_classes["SCDSampler"], **sampler_inputs(model, cond, window=4, batch_size=2))
    assert tokens.shape == (2, 18) and stats.result.nfe <= 18
    for position, token in model.model.forced_tokens.items():
        assert (tokens[:, position] == token).all()
    assert len(fake_server.previews) == stats.result.nfe and fake_server.previews[-1][1].size == (32, 24)
    (image,) = run_node(node_classes["SCDVQDecode"], model=model, tokens=tokens)
    assert image.shape == (2, 24, 32, 3) and 0.0 <= float(image.min()) <= float(image.max()) <= 1.0


def test_tiny_emu3p5_story_runs_through_the_nodes(node_classes: dict[str, Any], comfy: SimpleNamespace,
                                                  tiny_emu3p5_base_dir: Path, fake_server: FakeServer) -> None:
    """The story node gives the images as one batch and the text as a string, a progress bar and previews per
    image and a status line as the text grows; a request it cannot hold is one line."""
    list_in_comfyui(comfy, "scd", tiny_emu3p5_base_dir, "Emu3.5")
    (model,) = node_classes["SCDModelLoader"].execute("Emu3.5", "auto", "auto").result
    inputs = dict(model=model, prompt="a hedgehog", task="story", window=4, cfg_scale=3.0, seed=1,
                  max_new_tokens=20, width=32, height=16)
    images, text = run_node(node_classes["SCDEmu3p5Story"], **inputs)
    assert images.shape == (2, 16, 32, 3) and 0.0 <= float(images.min()) <= float(images.max()) <= 1.0
    assert text.startswith("Q\n[image 1]\nZ\n[image 2]")
    assert fake_server.previews[-1][1].size == (32, 16) and len(fake_server.previews) >= 2
    assert any(text.startswith("story: ") for _, text in fake_server.texts)
    with pytest.raises(ValueError, match="cannot hold one image"):
        run_node(node_classes["SCDEmu3p5Story"], **(inputs | dict(max_new_tokens=5)))


def test_emu3p5_size_auto_and_tiles_through_the_nodes(node_classes: dict[str, Any], comfy: SimpleNamespace,
                                                      tiny_emu3p5_base_dir: Path, janus: Any,
                                                      fake_server: FakeServer) -> None:
    """Prompt Encode's size auto: the sampler samples the tokens the core's generate_auto gives at the size the
    copy writes (10 x 20 codes), previewed at it; the decode node's tile_size gives the whole decode's pixels up to
    float32 rounding. A batch, a size with auto, auto or tiles on Janus, auto before an image prompt: one line."""
    list_in_comfyui(comfy, "scd", tiny_emu3p5_base_dir, "Emu3.5")
    (model,) = node_classes["SCDModelLoader"].execute("Emu3.5", "auto", "auto").result
    (cond,) = run_node(node_classes["SCDPromptEncode"], model=model, prompt="a lighthouse at dusk", size="auto")
    tokens, stats = run_node(node_classes["SCDSampler"], **sampler_inputs(model, cond))
    core, written = generate_auto(model.model, model.model.encode("a lighthouse at dusk"),
                                  SamplerConfig(coupler="maximal", window=4, seed=3, draft_init="above"))
    assert written.size == STORY_SIZE and torch.equal(tokens, core.tokens) and tokens.shape == (1, 10 * 21)
    assert fake_server.previews[-1][1].size == (320, 160)
    (whole,) = run_node(node_classes["SCDVQDecode"], model=model, tokens=tokens)
    (tiled,) = run_node(node_classes["SCDVQDecode"], model=model, tokens=tokens, tile_size=64)
    assert whole.shape == tiled.shape == (1, 160, 320, 3) and (whole - tiled).abs().max() <= 1e-4
    with pytest.raises(ValueError, match="one image at a time"):
        run_node(node_classes["SCDSampler"], **sampler_inputs(model, cond, batch_size=2))
    with pytest.raises(ValueError, match="set width and height to 0"):
        run_node(node_classes["SCDPromptEncode"], model=model, prompt="a lighthouse", width=64, size="auto")
    with pytest.raises(ValueError, match="text to image"):
        run_node(node_classes["SCDImagePrompt"], model=model, cond=cond, image=torch.rand(1, 32, 32, 3), task="x2i")
    with pytest.raises(ValueError, match="Emu3.5"):
        run_node(node_classes["SCDPromptEncode"], model=janus, prompt="a cat", size="auto")
    janus_tokens = torch.zeros(1, janus.model.num_tokens, dtype=torch.long)
    with pytest.raises(ValueError, match="decodes whole"):
        run_node(node_classes["SCDVQDecode"], model=janus, tokens=janus_tokens, tile_size=64)


def test_sampler_reserves_its_batch_before_loading(node_classes: dict[str, Any], janus: Any, comfy: SimpleNamespace,
                                                   fake_server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """ComfyUI is asked to free each image's KV cache and the distributions of the widest call before the
    weights load (load_models_gpu's memory_required), and a GPU run's status line says how much."""
    asked: list[int] = []
    load = comfy.mm.load_models_gpu
    monkeypatch.setattr(comfy.mm, "load_models_gpu",
                        lambda models, memory_required=0, **kw: asked.append(memory_required) or load(models, **kw))
    monkeypatch.setattr(comfy.mm, "is_device_cpu", lambda device: False)  # as on a GPU
    (cond,) = run_node(node_classes["SCDPromptEncode"], model=janus, prompt="a red square")
    for batch_size, window, candidates in ((1, 4, 1), (4, 4, 1), (4, 0, 1), (4, 4, 2)):
        fake_server.texts.clear()
        run_node(node_classes["SCDSampler"], **sampler_inputs(janus, cond, batch_size=batch_size, window=window,
                                                              candidates=candidates))
        assert all(f"reserved {asked[-1] / 2**20:.2f} MiB for the KV cache and distributions of {batch_size} "
                   f"image" in text for _, text in fake_server.texts)
    one, four, automatic, trees = asked[-4:]
    n = janus.model.num_tokens  # the automatic window's widest call is the whole image here
    assert four == 4 * one and one == janus.image_cache_bytes + 4 * janus.slot_bytes
    assert automatic == 4 * (janus.image_cache_bytes + n * janus.slot_bytes) and trees > four
    # what a compiled model keeps from its last image on a GPU (its CUDA graphs' KV cache) is reused or freed
    # before the run allocates: not asked for again
    held = torch.zeros(janus.image_cache_bytes // 2, dtype=torch.uint8)
    kept = SimpleNamespace(state=State.of({"cache": held, "view": held[1:]}), release=lambda: None)
    monkeypatch.setattr(janus.model, "graph_holder", KeptGraphs(), raising=False)
    janus.model.graph_holder.kept = kept
    run_node(node_classes["SCDSampler"], **sampler_inputs(janus, cond, batch_size=1, window=4))
    assert asked[-1] == one - held.numel()  # (its storage counted once)
    # a compiled model on CUDA: its graphs' pool holds the widest step's distributions between calls, unless
    # kept graphs are there to be replayed (or freed before a capture)
    monkeypatch.setattr(janus.model, "compiled", True)
    monkeypatch.setattr(janus.model.graph_holder, "kept", kept)
    assert janus.run_memory(4, 4) == four - held.numel()
    monkeypatch.setattr(comfy.mm, "is_device_cuda", lambda device: True)
    assert janus.run_memory(4, 4) == four - held.numel()
    monkeypatch.setattr(janus.model.graph_holder, "kept", None)
    assert janus.run_memory(4, 4) == four + 4 * 4 * janus.slot_bytes


# -- SCD Image Prompt ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo(node_classes: dict[str, Any]) -> Any:
    return node_classes["SCDModelLoader"].execute("demo", "auto", "auto").result[0]


def demo_digit(node_classes: dict[str, Any], demo: Any) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """The demo's 7 at seed 42: (its conditioning, tokens, decoded IMAGE)."""
    (cond,) = run_node(node_classes["SCDPromptEncode"], model=demo, prompt="7")
    tokens, _ = run_node(node_classes["SCDSampler"], **sampler_inputs(demo, cond, coupler="faithful", window=16,
                                                                      seed=42))
    (image,) = run_node(node_classes["SCDVQDecode"], model=demo, tokens=tokens)
    return cond, tokens, image


def test_vq_decode_gives_a_batch_the_pixels_each_image_has_alone(node_classes: dict[str, Any], demo: Any,
                                                                 fake_server: FakeServer) -> None:
    """A batch decoded on two threads: each row the pixels of its image decoded alone on one thread, as
    `python -m scd_core batch` writes them (the decoder's sums otherwise follow the threads and the batch)."""
    (cond,) = run_node(node_classes["SCDPromptEncode"], model=demo, prompt="7")
    tokens, _ = run_node(node_classes["SCDSampler"], **sampler_inputs(demo, cond, coupler="faithful", window=32,
                                                                      seed=0, batch_size=4))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        (images,) = run_node(node_classes["SCDVQDecode"], model=demo, tokens=tokens)
        torch.set_num_threads(1)
        alone = [demo.model.decode(row) for row in tokens.split(1)]
    finally:
        torch.set_num_threads(before)
    assert [torch.equal(image, row[0]) for image, row in zip(images, alone)] == [True] * 4


def test_image_prompt_schema_says_what_a_raster_model_sees(node_classes: dict[str, Any], omni: Any) -> None:
    node = node_classes["SCDImagePrompt"]
    inputs = inputs_of(node)
    assert list(inputs) == ["model", "cond", "image", "task", "mask", "keep_top", "image_cfg"]
    assert inputs["task"][0][0] == "continue"
    assert set(omni.model.image_tasks) <= set(inputs["task"][0])  # every task of the Omni checkpoint on offer
    description = node.GET_NODE_INFO_V1()["description"]
    assert "above and to the left" in description and "no exact masked inpainting" in description
    assert "no model calls" in description
    assert "any of its pixels is masked" in inputs["mask"][1]["tooltip"]
    assert inputs["keep_top"][1]["default"] == 0.5 and inputs["keep_top"][1]["max"] == 1.0


def test_image_prompt_continues_a_half_kept_digit(node_classes: dict[str, Any], demo: Any, pack: ModuleType,
                                                  fake_server: FakeServer) -> None:
    """The top 8 of 16 token rows of the demo's digit come back unchanged, the rest is sampled; the kept cells
    are counted as forced in the events and the Stats chart, and cost no calls of their own."""
    import numpy as np
    from scd_core.decoding.given import GivenCells

    cond, _, image = demo_digit(node_classes, demo)
    fake_server.events.clear()
    fake_server.texts.clear()
    (given,) = run_node(node_classes["SCDImagePrompt"], model=demo, cond=cond, image=image, task="continue",
                        keep_top=0.5)
    assert fake_server.texts == [("7", "kept the top 8 of 16 token rows, sampling the 8 below")]
    assert isinstance(given.cond, GivenCells) and given.model_name == "demo"
    codes = demo.model.encode_image(image)
    assert torch.equal(given.cond.tokens, codes) and given.cond.keep.sum() == 128 and given.cond.keep[0, :128].all()
    tokens, stats = run_node(node_classes["SCDSampler"], **sampler_inputs(demo, given, coupler="faithful",
                                                                          window=16, seed=1))
    assert torch.equal(tokens[:, :128], codes[:, :128])
    assert not torch.equal(tokens[:, 128:], codes[:, 128:])  # the lower half was sampled anew
    events = [data for name, data in fake_server.events if name == "scd.progress"]
    assert sum(e["forced"] for e in events) == sum(stats.result.forced) == 128
    assert stats.result.nfe < 128 + 2  # the kept half costs no call per token
    chart = sys.modules[f"{pack.__name__}.nodes.chart"]
    (picture, summary) = run_node(node_classes["SCDStats"], stats=stats)
    # the baseline is plain AR given the kept half: a call per sampled token, not per token
    assert summary.startswith(f"demo: 256 tokens x 1 (128 forced) in {stats.result.nfe} model calls "
                              f"(autoregressive: 128) - {128 / stats.result.nfe:.2f}x fewer calls")
    assert events[-1]["calls_saved"] == 128 - stats.result.nfe
    pixels = (picture[0].numpy() * 255).round().astype(np.uint8)
    assert (pixels == rgb(chart.FORCED_BAR)).all(-1).sum() > 500


def test_image_prompt_regenerates_the_masked_cells(node_classes: dict[str, Any], demo: Any,
                                                   fake_server: FakeServer) -> None:
    cond, _, image = demo_digit(node_classes, demo)
    mask = torch.zeros(1, 64, 64)
    mask[0, 40:48, 8:13] = 1.0  # rows 10-11, columns 2-3 of the 16 x 16 grid (pixel 12 lies in column 3)
    mask[0, 0:4, 60:64] = 0.4  # under half: not masked
    (given,) = run_node(node_classes["SCDImagePrompt"], model=demo, cond=cond, image=image, task="continue",
                        mask=mask)
    regenerate = torch.zeros(16, 16, dtype=torch.bool)
    regenerate[10:12, 2:4] = True
    assert torch.equal(given.cond.keep[0], ~regenerate.flatten())
    assert fake_server.texts[-1] == ("7", "regenerating 4 of 256 cells (16 x 16), keeping the others")
    tokens, _ = run_node(node_classes["SCDSampler"], **sampler_inputs(demo, given, coupler="faithful", window=16))
    kept = given.cond.keep[0]
    assert torch.equal(tokens[0, kept], given.cond.tokens[0, kept])


def test_image_prompt_notes_a_resized_image_on_its_status_line(node_classes: dict[str, Any], demo: Any,
                                                               fake_server: FakeServer) -> None:
    (cond,) = run_node(node_classes["SCDPromptEncode"], model=demo, prompt="3")
    wide = torch.rand(1, 48, 96, 3, generator=torch.Generator().manual_seed(0))
    run_node(node_classes["SCDImagePrompt"], model=demo, cond=cond, image=wide, task="continue", keep_top=0.25)
    assert fake_server.texts[-1] == ("7", "kept the top 4 of 16 token rows, sampling the 12 below; the 96 x 48 px "
                                          "image was resized to the model's 64 x 64 px (scaled to cover it and "
                                          "centre-cropped)")


def test_image_prompt_refuses_what_it_cannot_do(node_classes: dict[str, Any], demo: Any, janus: Any,
                                                fake_server: FakeServer, tiny_lumina2_dir: Path,
                                                comfy: SimpleNamespace) -> None:
    node = node_classes["SCDImagePrompt"]
    cond, _, image = demo_digit(node_classes, demo)
    with pytest.raises(ValueError) as caught:
        run_node(node, model=demo, cond=cond, image=image, task="continue", mask=torch.zeros(1, 32, 48))
    assert str(caught.value).startswith("the mask is 48 x 32 px but the image is 64 x 64 px")
    with pytest.raises(ValueError, match=r"this model \(demo\) takes no image task such as 'depth'"):
        run_node(node, model=demo, cond=cond, image=image, task="depth")
    (given,) = run_node(node, model=demo, cond=cond, image=image, task="continue")
    with pytest.raises(ValueError, match="already holds an image"):
        run_node(node, model=demo, cond=given, image=image, task="continue")
    with pytest.raises(ValueError, match="same SCD Model Loader"):
        run_node(node, model=janus, cond=cond, image=image, task="continue")
    with pytest.raises(ValueError, match=r"image values must lie in 0..1"):
        run_node(node, model=demo, cond=cond, image=image * 2, task="continue")
    # another aspect: the mask is fitted to the grid as the image is (the demo crops its middle square)
    bottom = torch.zeros(1, 48, 64)
    bottom[:, 24:] = 1.0
    (fitted,) = run_node(node, model=demo, cond=cond, image=image[:, :48], task="continue", mask=bottom)
    assert fitted.cond.keep.reshape(16, 16).all(1).tolist() == [True] * 8 + [False] * 8
    # the plain 2.0 checkpoint: scd_core's own refusal, naming the checkpoint and where the task lives
    list_in_comfyui(comfy, "scd", tiny_lumina2_dir, tiny_lumina2_dir.name)
    (plain,) = node_classes["SCDModelLoader"].execute(tiny_lumina2_dir.name, "auto", "auto").result
    (plain_cond,) = run_node(node_classes["SCDPromptEncode"], model=plain, prompt="a ball")
    with pytest.raises(ValueError, match=r"task 'depth' is not one the Lumina-mGPT 2\.0 checkpoint was trained for"):
        run_node(node, model=plain, cond=plain_cond, image=torch.rand(1, 32, 32, 3), task="depth")


@pytest.fixture(scope="module")
def omni(node_classes: dict[str, Any], comfy: SimpleNamespace, tiny_lumina2_dir: Path,
         tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny 2.0 folder under the Omni repository's name (which tells the checkpoints apart), loaded."""
    import shutil

    folder = tmp_path_factory.mktemp("omni") / "Lumina-mGPT-2.0-Omni"
    shutil.copytree(tiny_lumina2_dir, folder)
    list_in_comfyui(comfy, "scd", folder, folder.name)
    return node_classes["SCDModelLoader"].execute(folder.name, "auto", "auto").result[0]


def test_image_prompt_gives_omni_its_control_image_and_lumina_its_rows(node_classes: dict[str, Any], omni: Any,
                                                                       fake_server: FakeServer) -> None:
    """depth: the family's add_image (the dual panel's upper half given); continue on a grid with row-end
    columns: the kept rows' codes and row-ends come back, the mask counts image columns only."""
    node = node_classes["SCDImagePrompt"]
    (cond,) = run_node(node_classes["SCDPromptEncode"], model=omni, prompt="a ball", width=32, height=64)
    control = torch.rand(1, 32, 32, 3, generator=torch.Generator().manual_seed(2))
    (depth,) = run_node(node, model=omni, cond=cond, image=control, task="depth")
    expected = omni.model.add_image(cond.cond, control, "depth")
    assert torch.equal(depth.cond.tokens, expected.tokens) and torch.equal(depth.cond.keep, expected.keep)
    assert depth.cond.cond.cond == expected.cond.cond and fake_server.texts[-1] == ("7", "image added for depth")
    with pytest.raises(ValueError, match="a mask is for task 'continue'"):
        run_node(node, model=omni, cond=cond, image=control, task="depth", mask=torch.zeros(1, 32, 32))

    (square,) = run_node(node_classes["SCDPromptEncode"], model=omni, prompt="a ball", width=RESOLUTION_2,
                         height=RESOLUTION_2)
    picture = torch.rand(1, RESOLUTION_2, RESOLUTION_2, 3, generator=torch.Generator().manual_seed(3))
    mask = torch.zeros(1, RESOLUTION_2, RESOLUTION_2)
    mask[0, 16:, 8:16] = 1.0  # rows 2-3, column 1 of the 4 x 4 codes
    (given,) = run_node(node, model=omni, cond=square, image=picture, task="continue", mask=mask)
    assert fake_server.texts[-1] == ("7", "regenerating 2 of 16 cells (4 x 4), keeping the others")
    tokens, _ = run_node(node_classes["SCDSampler"], **sampler_inputs(omni, given, window=3))
    keep = given.cond.keep[0]
    assert keep.sum() == 14 and torch.equal(tokens[0, keep], given.cond.tokens[0, keep])
    for position, token in omni.model.forced_tokens.items():  # the row-ends and end of image, as ever
        assert tokens[0, position] == token


def tiny_glm_image(pack: ModuleType, tmp_path: Path, load_device: torch.device) -> tuple[Any, Path, Any]:
    """(the loader module, the tiny GLM-Image folder, its AR stage as the loader hands it on, loading on
    `load_device`), at the fixture's small size."""
    pytest.importorskip("diffusers")
    from glm_image_fixture import HEIGHT, WIDTH, write_tiny_glm_image
    from scd_core import load_model

    loader = sys.modules[f"{pack.__name__}.nodes.loader"]
    sockets = sys.modules[f"{pack.__name__}.nodes.sockets"]
    folder = write_tiny_glm_image(tmp_path / "glm")
    model = load_model(folder, device="cpu", dtype=torch.float32)
    model.set_image_size(WIDTH, HEIGHT)
    patcher = loader.classic_patcher_class()(loader.module_holder(model.module, "glm"), load_device=load_device,
                                             offload_device=torch.device("cpu"), size=loader.module_bytes(model.module))
    return loader, folder, sockets.LoadedModel(name="glm", model=model, patcher=patcher)


def test_glm_image_decode_loads_its_own_stage(pack: ModuleType, node_classes: dict[str, Any], tmp_path: Path) -> None:
    """The Decode node registers GLM-Image's DiT, VAE and glyph encoder with ComfyUI as a patcher of their own,
    sized by the decoding-stage estimate, and decodes the same pixels as the model's own decode."""
    from glm_image_fixture import HEIGHT, WIDTH
    from scd_core import load_model
    from scd_core.models.families import glm_image

    loader, folder, loaded = tiny_glm_image(pack, tmp_path, torch.device("cpu"))
    model, mm = loaded.model, loader.mm
    tokens = torch.randint(0, model.vocab_size, (1, model.num_tokens), generator=torch.Generator().manual_seed(0))
    (images,) = run_node(node_classes["SCDVQDecode"], model=loaded, tokens=tokens)
    stage = loaded.decoder_patcher
    assert any(entry.model is stage for entry in mm.current_loaded_models)
    assert stage.model_size() == glm_image.decoder_weights(folder) * 4  # float32
    # room for the VAE's decode at this size, as ComfyUI reserves for one
    assert model.decoding_memory() == 2178 * 64 * (HEIGHT // 8) * (WIDTH // 8) * 4
    assert torch.equal(images, model.decode(tokens))
    # the loader's status line states the stage's size at the compute dtype; one-stage families say nothing
    note = loader.decoding_note(model, torch.bfloat16)
    assert note.startswith(f"decoding stage {glm_image.decoder_weights(folder) * 2 / 2**30:.2f} GiB more")
    assert loader.decoding_note(load_model("demo", device="cpu"), torch.float32) == ""


def tiny_mammothmoda2(pack: ModuleType, folder: Path, load_device: torch.device) -> tuple[Any, Any]:
    """(the loader module, the tiny MammothModa2 Preview's LLM stage as the loader hands it on, loading on
    `load_device`), at 64 x 64 px."""
    from scd_core import load_model

    loader = sys.modules[f"{pack.__name__}.nodes.loader"]
    sockets = sys.modules[f"{pack.__name__}.nodes.sockets"]
    model = load_model(folder, device="cpu", dtype=torch.float32)
    model.set_image_size(64, 64)
    patcher = loader.classic_patcher_class()(loader.module_holder(model.module, "mammothmoda2"),
                                             load_device=load_device, offload_device=torch.device("cpu"),
                                             size=loader.module_bytes(model.module))
    return loader, sockets.LoadedModel(name="mammothmoda2", model=model, patcher=patcher)


@pytest.mark.parametrize("family", ("glm_image", "mammothmoda2"))
def test_two_stages_evict_each_other_through_comfyuis_model_management(
        family: str, pack: ModuleType, node_classes: dict[str, Any], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """Where the sampling stage and the decoding stage do not fit together, ComfyUI's own load_models_gpu offloads
    one for the other: Decode evicts the sampling stage, the next sampling evicts the decoding stage.  MammothModa2
    re-encodes its tokens with its LLM first: the LLM is whole on the device for those forwards, and leaves only
    once they are done (the loader's auto precision counts the larger stage, not both).  ComfyUI frees nothing for
    the plain "cpu" device, so both stages load on "cpu:0" (the same memory, another device to its model
    management) and its free memory is what a budget leaves after the models it holds there."""
    from scd_core import generate
    from scd_core.models.families import glm_image

    device = torch.device("cpu", 0)
    if family == "glm_image":
        loader, folder, loaded = tiny_glm_image(pack, tmp_path, device)
        decoder_bytes = glm_image.decoder_weights(folder) * 4  # float32
        model = loaded.model
        tokens = torch.randint(0, model.vocab_size, (1, model.num_tokens), generator=torch.Generator().manual_seed(0))
    else:
        loader, loaded = tiny_mammothmoda2(pack, request.getfixturevalue("tiny_preview_dir"), device)
        model = loaded.model
        decoder_bytes = model.decoding_weights() * 4
        tokens = generate(model, model.encode("a red cube"), SamplerConfig(window=4, seed=0)).tokens
    patcher, mm = loaded.patcher, loader.mm
    ar_bytes = patcher.model_size()
    budget = max(ar_bytes, decoder_bytes) + min(ar_bytes, decoder_bytes) // 2  # one stage fits, not both

    def held() -> int:
        return sum(entry.model_loaded_memory() for entry in mm.current_loaded_models if entry.device == device)

    def free(dev: Any = None, torch_free_too: bool = False) -> Any:
        left = budget - held() if dev == device else psutil_free(dev)
        return (left, left) if torch_free_too else left

    psutil_free = mm.get_free_memory
    monkeypatch.setattr(mm, "get_free_memory", free)
    monkeypatch.setattr(mm, "minimum_inference_memory", lambda: 0)
    monkeypatch.setattr(mm, "extra_reserved_memory", lambda: 0)
    monkeypatch.setattr(mm, "DISABLE_SMART_MEMORY", False)
    monkeypatch.setattr(model, "decoding_memory", lambda: 0)  # the weights alone decide here

    def stage_bytes(stage: Any) -> int:
        return sum(entry.model_loaded_memory() for entry in mm.current_loaded_models if entry.model is stage)

    llm_loaded: list[int] = []  # what the LLM stage held at each of its forwards during a decode
    if family == "mammothmoda2":
        model.module.model.embed_tokens.register_forward_pre_hook(lambda *_: llm_loaded.append(stage_bytes(patcher)))
    try:
        loaded.to_compute_device(memory_required=0)  # what the sampler does before sampling
        assert stage_bytes(patcher) == ar_bytes
        (images,) = run_node(node_classes["SCDVQDecode"], model=loaded, tokens=tokens, decoder_steps=2)
        assert stage_bytes(loaded.decoder_patcher) == decoder_bytes and stage_bytes(patcher) < ar_bytes
        assert held() <= budget
        loaded.to_compute_device(memory_required=0)  # the next prompt's sampling
        assert stage_bytes(patcher) == ar_bytes and stage_bytes(loaded.decoder_patcher) < decoder_bytes
        (again,) = run_node(node_classes["SCDVQDecode"], model=loaded, tokens=tokens, decoder_steps=2)
        assert torch.equal(again, images) and torch.equal(images, model.decode(tokens))
        if family == "mammothmoda2":  # two decodes, a negative and a re-encode each, the LLM whole for each
            assert llm_loaded[:4] == [ar_bytes] * 4
    finally:
        mm.unload_all_models()


def test_emu3p5_story_node_takes_reference_images(node_classes: dict[str, Any], comfy: SimpleNamespace,
                                                  tiny_emu3p5_base_dir: Path, fake_server: FakeServer,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The optional `references` batch: one reference each, every image at the last one's grid (2 x 3 codes, the
    reference area made small for the tiny copy), the core's story with the same pictures; a 1 x 1 px reference
    is one line."""
    from scd_core.models.families.emu3p5_story import StoryOptions, generate_story

    story_node = sys.modules[f"{node_classes['SCDEmu3p5Story'].__module__}"]
    monkeypatch.setattr(story_node, "OPTIONS", StoryOptions(image_area=48 * 32))
    list_in_comfyui(comfy, "scd", tiny_emu3p5_base_dir, "Emu3.5")
    (model,) = node_classes["SCDModelLoader"].execute("Emu3.5", "auto", "auto").result
    references = torch.randint(0, 256, (2, 32, 48, 3), generator=torch.Generator().manual_seed(5)).float() / 255
    inputs = dict(model=model, prompt="a hedgehog", task="story", window=4, cfg_scale=3.0, seed=1,
                  max_new_tokens=30, width=0, height=0, references=references)
    images, text = run_node(node_classes["SCDEmu3p5Story"], **inputs)
    core = generate_story(model.model, "a hedgehog", SamplerConfig(window=4, seed=1, cfg_scale=3.0),
                          StoryOptions(max_new_tokens=30, image_area=48 * 32), references=list(references))
    assert images.shape == (len(core.images), 32, 48, 3) and len(core.images) >= 2 and text == core.text.strip()
    with pytest.raises(ValueError, match="1 x 1 px"):
        run_node(node_classes["SCDEmu3p5Story"], **(inputs | dict(references=torch.rand(1, 1, 1, 3))))
