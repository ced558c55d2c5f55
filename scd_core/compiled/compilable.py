"""What `load_model(..., compile=True)` switches a family's model to: its decoder layer compiled once for all
layers (scd_core.compiled.compiled_regions) and a holder of the CUDA graphs its last generation keeps for the next
(scd_core.compiled.cuda_graphs)."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from . import compiled_regions
from .cuda_graphs import KeptGraphs


class Compilable:
    """A TokenModel that `load_model(..., compile=True)` switches to static-shape calls: its family names the
    one-layer function its sessions run each decoder layer through (`layer_step`), compiled once for all
    layers, and hands `compiled_layer` to its sessions.  Once compiled, it holds what its last generation
    keeps for the next (`graph_holder`: its CUDA graphs, `cuda_graphs.KeptGraphs`)."""

    compiled = False
    compiled_layer: Optional[compiled_regions.CompiledRegion] = None
    graph_holder: Optional[KeptGraphs] = None
    shared_across_generations = True  # (graph_state: the model is not part of a generation's state)
    layer_step: Callable[..., torch.Tensor]

    def enable_compile(self) -> None:
        if not compiled_regions.torch_tested(torch.__version__):
            oldest = ".".join(map(str, compiled_regions.OLDEST_TESTED_TORCH))
            compiled_regions.warn_once("old-torch", f"compile=True needs torch {oldest} or newer (this is "
                                       f"{torch.__version__}); running eagerly (the same images, uncompiled)")
            return
        self.compiled = True
        self.compiled_layer = compiled_regions.compile_region(
            type(self).layer_step, f"the {getattr(self, 'family', 'model')} decoder layer")
        self.graph_holder = KeptGraphs()
