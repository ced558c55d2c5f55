"""The pack's ComfyUI nodes (V3 schema), thin wrappers over scd_core.  Imported only inside ComfyUI."""

from comfy_api.latest import ComfyExtension, io

from .decode import SCDVQDecode
from .encode import SCDPromptEncode
from .loader import SCDModelLoader
from .sampler import SCDSampler
from .stats import SCDStatsNode
from .video_context import SCDVideoContext

NODES = [SCDModelLoader, SCDPromptEncode, SCDSampler, SCDVQDecode, SCDStatsNode, SCDVideoContext]


class SCDExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return list(NODES)
