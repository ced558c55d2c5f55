"""The pack under both ComfyUI cores (nodes/core_compat.py): 0.3.75 as installed, and the late-2026 core's dynamic
VRAM (comfy-aimdo), its memory report and its model compiler's malloc graph through small fakes of what that core
adds (read in its sources: comfy.memory_management.aimdo_enabled, comfy.model_patcher.ModelPatcherDynamic /
CoreModelPatcher, comfy_aimdo.model_vbar.vbars_analyze, comfy.model_prefetch.pause_malloc_graph)."""

from __future__ import annotations

import contextlib
import sys
from types import ModuleType, SimpleNamespace
from typing import Any, Iterator

import pytest
import torch
from scd_core.compiled.capture_scope import outside_host_graphs

from test_nodes import comfy, node_classes, pack  # noqa: F401  (fixtures)

GIB = 2**30
CUDA = torch.device("cuda", 0)


def fake_module(monkeypatch: pytest.MonkeyPatch, name: str, **attributes: Any) -> ModuleType:
    module = ModuleType(name)
    module.__dict__.update(attributes)
    monkeypatch.setitem(sys.modules, name, module)
    return module


@pytest.fixture
def compat(pack: ModuleType, node_classes: dict[str, Any]) -> ModuleType:
    """nodes/core_compat.py as ComfyUI imports it (comfy_entrypoint, run by `node_classes`)."""
    return sys.modules[f"{pack.__name__}.nodes.core_compat"]


@pytest.fixture
def late_core(monkeypatch: pytest.MonkeyPatch, comfy: SimpleNamespace) -> Iterator[SimpleNamespace]:
    """The late core's dynamic VRAM, switched on: aimdo enabled, a dynamic patcher class as CoreModelPatcher,
    3 GiB of evictable weight pages."""
    import comfy.model_patcher

    class ModelPatcherDynamic:  # the real one subclasses ModelPatcher; only isinstance checks see it here
        pass

    fake_module(monkeypatch, "comfy.memory_management", aimdo_enabled=True)
    fake_module(monkeypatch, "comfy_aimdo")
    fake_module(monkeypatch, "comfy_aimdo.model_vbar", vbars_analyze=lambda: 3 * GIB)
    monkeypatch.setattr(comfy.model_patcher, "ModelPatcherDynamic", ModelPatcherDynamic, raising=False)
    monkeypatch.setattr(comfy.model_patcher, "CoreModelPatcher", ModelPatcherDynamic, raising=False)
    yield SimpleNamespace(classic=comfy.model_patcher.ModelPatcher, dynamic=ModelPatcherDynamic)


def test_the_installed_core_has_none_of_the_late_features(compat: ModuleType) -> None:
    assert not compat.dynamic_vram()
    assert compat.reclaimable_bytes() == 0
    assert compat.core_note(CUDA) == ""
    with compat.outside_malloc_graph():  # a no-op on a core without a model compiler
        pass


def test_dynamic_vram_is_detected_and_reported_on_cuda_only(compat: ModuleType, late_core: SimpleNamespace) -> None:
    assert compat.dynamic_vram()
    assert compat.reclaimable_bytes() == 3 * GIB
    assert "--lowvram changes nothing" in compat.core_note(CUDA)
    assert compat.core_note(torch.device("cpu")) == ""


def test_loader_wraps_the_model_in_the_classic_patcher_under_dynamic_vram(
        node_classes: dict[str, Any], late_core: SimpleNamespace) -> None:
    """The dynamic patcher streams only comfy.ops layers it prepared itself; the pack's casting layers follow
    the classic partial-load protocol."""
    loaded = node_classes["SCDModelLoader"].execute("demo", "cpu", "float32").result[0]
    assert type(loaded.patcher) is late_core.classic
    assert not isinstance(loaded.patcher, late_core.dynamic)


def test_memory_report_counts_evictable_pages_once(pack: ModuleType, node_classes: dict[str, Any],
                                                    comfy: SimpleNamespace, late_core: SimpleNamespace,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Free memory + classic models' loaded weights (ComfyUI unloads them) + the pages comfy-aimdo evicts;
    a dynamic model's loaded size is those pages already."""
    loader = sys.modules[f"{pack.__name__}.nodes.loader"]

    def loaded(patcher: Any, size: int) -> SimpleNamespace:  # an entry of current_loaded_models
        return SimpleNamespace(device=CUDA, model=patcher, model_loaded_memory=lambda: size)

    monkeypatch.setattr(comfy.mm, "current_loaded_models",
                        [loaded(object(), 1 * GIB), loaded(late_core.dynamic(), 5 * GIB)])
    monkeypatch.setattr(comfy.mm, "get_free_memory", lambda device=None, torch_free_too=False: 2 * GIB)
    assert loader.available_memory(CUDA) == (2 + 1 + 3) * GIB


def test_graph_capture_runs_outside_an_active_malloc_graph(node_classes: dict[str, Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The pack installs the core's pause_malloc_graph (synchronised) as scd_core's capture scope."""
    events: list[str] = []

    @contextlib.contextmanager
    def pause_malloc_graph(sync: bool = False) -> Iterator[None]:
        events.append(f"pause sync={sync}")
        yield
        events.append("resume")

    fake_module(monkeypatch, "comfy.model_prefetch", pause_malloc_graph=pause_malloc_graph)
    assert outside_host_graphs(lambda: events.append("capture") or "graph") == "graph"
    assert events == ["pause sync=True", "capture", "resume"]
