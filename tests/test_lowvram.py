"""ComfyUI's low-VRAM streaming of a model larger than free memory (nodes/lowvram.py), in process.

ComfyUI never loads partially on a CPU through load_models_gpu, so the tests drive the loader
node's ModelPatcher directly, as load_models_gpu would with a memory budget: ComfyUI's own
`ModelPatcher.load` decides which modules stay offloaded and casts their weights per call.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator, Optional

import pytest
import torch
from scd_core import SamplerConfig, generate
from scd_core.windows.auto_window import cost_key
from scd_core.compiled.cuda_graphs import KeptGraphs

from cosmos_fixture import context_frames, write_cosmos
from emu3_fixture import tiny_emu3_dir  # noqa: F401  (fixture)
from llamagen_fixture import write_safetensors_c2i, write_t2i
from lumina_fixture import tiny_lumina2_dir, tiny_lumina_dir  # noqa: F401  (fixtures)
from test_nodes import comfy, janus, node_classes, pack  # noqa: F401  (fixtures)

CPU = torch.device("cpu")
PRECISIONS = ["none", "int8"] + (["nf4"] if importlib.util.find_spec("bitsandbytes") else [])
COSMOS, LUMINA2 = "Cosmos/Cosmos-1.0-Autoregressive-4B", "Lumina-mGPT-2.0-32"
# what each model is prompted with (Cosmos continues a clip of context frames)
PROMPTS = {"demo": "7", "tiny-janus": "a red square", "Emu3/Emu3-Gen-hf": "a red square",
           "Lumina-mGPT-7B-64": "a red square", LUMINA2: "a red square", COSMOS: None,
           "LlamaGen/c2i-B": "3", "LlamaGen/t2i-B": "a red cat on the mat"}


@pytest.fixture(scope="module")
def models(node_classes: dict[str, Any], comfy: SimpleNamespace, janus: Any, tiny_emu3_dir: Path,
           tiny_lumina_dir: Path, tiny_lumina2_dir: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Any]:
    """Loads a model by name through the loader node (`janus` registers tiny-janus; the others are listed here,
    each under the models/ folder a user would put it in, for this module only: other tests expect them missing)."""
    roots = tmp_path_factory.mktemp("lowvram_models")
    for root_name, folders in (("Emu3", {"Emu3-Gen-hf": tiny_emu3_dir}),
                               ("scd", {Path(tiny_lumina_dir).name: tiny_lumina_dir,
                                        Path(tiny_lumina2_dir).name: tiny_lumina2_dir})):
        (roots / root_name).mkdir()
        for name, folder in folders.items():
            (roots / root_name / name).symlink_to(folder, target_is_directory=True)
    write_cosmos(roots / "Cosmos", "4B")
    write_safetensors_c2i(roots / "LlamaGen" / "c2i-B")
    write_t2i(roots / "LlamaGen" / "t2i-B", with_t5=True)  # its T5 encoder streams too
    registered = [(root_name, str(roots / root_name)) for root_name in ("Emu3", "scd", "Cosmos", "LlamaGen")]
    for root_name, path in registered:
        comfy.folder_paths.add_model_folder_path(root_name, path)

    def load(name: str, quantize: str) -> Any:
        loaded = node_classes["SCDModelLoader"].execute(name, "cpu", "float32", quantize).result[0]
        if name.startswith("Emu3"):
            loaded.model.set_image_size(32, 24)  # a 3 x 4 grid
        return loaded
    yield load
    for root_name, path in registered:
        comfy.folder_paths.folder_names_and_paths[root_name][0].remove(path)



def casting_modules(loaded: Any) -> list[torch.nn.Module]:
    return [m for m in loaded.patcher.model.modules() if getattr(m, "comfy_cast_weights", False)]


# A pinned window, and the automatic one with the faithful coupler, whose tokens do not depend on the widths
# (the automatic window picks them from timed calls, which streaming changes).
CONFIGS = [SamplerConfig(window=8, seed=3), SamplerConfig(coupler="faithful", window="auto", seed=3)]


def run(loaded: Any, prompt: Optional[str], config: SamplerConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Position-0 logits, tokens and the decoded images."""
    model = loaded.model
    if prompt is None:  # a video model: the clip it continues
        cond = model.encode_video(context_frames(9))
        decode = lambda tokens: model.decode(tokens, cond)  # noqa: E731
    else:
        cond, decode = model.encode(prompt), model.decode
    logits = model.start(cond, 1).prefill()[0]
    tokens = generate(model, cond, config).tokens
    return logits, tokens, decode(tokens)


def load_partially(loaded: Any) -> None:
    """ComfyUI's partial load with room for about half the weights (as load_models_gpu on a small GPU)."""
    loaded.patcher.load(CPU, lowvram_model_memory=loaded.patcher.model_size() // 2)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", list(PROMPTS))
def test_a_partially_loaded_model_streams_and_samples_the_full_load_s_tokens(
        models: Any, name: str, precision: str) -> None:
    loaded = models(name, precision)
    assert loaded.streamable
    loaded.patcher.load(CPU, full_load=True)
    assert loaded.model.offload is None and loaded.model.compute_device == CPU
    full = [run(loaded, PROMPTS[name], config) for config in CONFIGS]
    released = []  # what a compiled model keeps on a GPU: its last generation's graphs and KV cache
    loaded.model.graph_holder = KeptGraphs()
    loaded.model.graph_holder.kept = SimpleNamespace(release=lambda: released.append(True))
    loaded.patcher.detach()
    assert loaded.model.compute_device is None
    assert loaded.model.graph_holder.kept is None and released  # freed when ComfyUI unloads it (KeptGraphs.forget)

    load_partially(loaded)
    streamed = casting_modules(loaded)
    assert loaded.patcher.model.model_lowvram and streamed
    assert loaded.patcher.loaded_size() < loaded.patcher.model_size()
    if name != LUMINA2:  # its tiny embedding holds 90% of the weights, and ComfyUI keeps room to stream 2-3
        assert loaded.patcher.loaded_size() > 0  # times the largest offloaded module: nothing else fits
    if precision != "none":  # the quantised layers themselves stream (int8's weights are buffers)
        layer = {"int8": "Int8Linear", "nf4": "Linear4bit"}[precision]
        assert any(type(m).__name__ == layer for m in streamed)
    assert loaded.model.offload == "comfy-lowvram"
    partial = [run(loaded, PROMPTS[name], config) for config in CONFIGS]
    for (logits, tokens, images), (logits_full, tokens_full, images_full) in zip(partial, full):
        assert torch.equal(logits, logits_full)
        assert torch.equal(tokens, tokens_full)
        assert torch.equal(images, images_full)
    loaded.patcher.detach()


def test_without_casting_layers_comfyui_leaves_weights_behind_and_calls_it_complete(
        models: Any, pack: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: plain modules that do not fit stay on the offload device and nothing is flagged to
    cast (on a GPU the next call fails on mixed devices); the test above would catch it."""
    monkeypatch.setattr(pack.nodes.loader, "make_streamable", lambda network: 0)
    loaded = models("demo", "int8")
    load_partially(loaded)
    assert not casting_modules(loaded) and not loaded.patcher.model.model_lowvram
    assert loaded.patcher.loaded_size() < loaded.patcher.model_size() // 2
    loaded.patcher.detach()


def test_a_casting_layer_that_changed_dtype_would_change_the_logits(models: Any, pack: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: casting must only move tensors; a copy through bfloat16 shows in the logits."""
    loaded = models("demo", "none")
    loaded.patcher.load(CPU, full_load=True)
    logits_full = run(loaded, "7", CONFIGS[0])[0]
    loaded.patcher.detach()
    moved = pack.nodes.lowvram._moved
    monkeypatch.setattr(pack.nodes.lowvram, "_moved",
                        lambda tensor, device: moved(tensor, device).to(torch.bfloat16).to(tensor.dtype))
    load_partially(loaded)
    assert any(isinstance(m, pack.nodes.lowvram.CastingLeaf) for m in casting_modules(loaded))
    assert not torch.equal(run(loaded, "7", CONFIGS[0])[0], logits_full)
    loaded.patcher.detach()


def test_streaming_has_its_own_call_costs(models: Any) -> None:
    """The automatic window learns costs under streaming apart from a full load's (`offload` in the key)."""
    loaded = models("demo", "none")
    loaded.patcher.load(CPU, full_load=True)
    full_key = cost_key(loaded.model, 1)
    loaded.patcher.detach()
    load_partially(loaded)
    assert "comfy-lowvram" in cost_key(loaded.model, 1) and cost_key(loaded.model, 1) != full_key
    loaded.patcher.detach()
    assert "comfy-lowvram" not in cost_key(loaded.model, 1)


def test_compiled_models_load_fully(models: Any, node_classes: dict[str, Any]) -> None:
    loaded = node_classes["SCDModelLoader"].execute("demo", "cpu", "float32", "none", True).result[0]
    assert not loaded.streamable and not any(hasattr(m, "comfy_cast_weights") for m in loaded.model.module.modules())


def test_the_loader_says_before_the_run_when_the_model_will_stream(pack: Any) -> None:
    fit_note = pack.nodes.loader.fit_note
    assert fit_note(2 * 2**30, 2**30, 4 * 2**30, True) == ""
    note = fit_note(6 * 2**30, 2**30, 4 * 2**30, True)
    assert "4.00 GiB free" in note and "stream ~3.00 GiB" in note and "window goes wide" in note
    assert "turn compile off" in fit_note(6 * 2**30, 2**30, 4 * 2**30, False)
