"""MammothModa2's memory: the LLM that samples (and re-encodes) the tokens, then the DiT that makes the pixels.

The token stage counts as every family's (`weights.memory`: decoder layers, both FFN experts included, at the
chosen precision, embeddings and heads at the compute dtype, a KV cache); the DiT, its VAE and Preview's Q-Former
refiner stay at the compute dtype.  Both stages stay on the device, or with `offload` the LLM leaves it after the
re-encode (the last LLM forward the DiT needs: the authors' decode re-encodes prompt + tokens and the negative
prompt before its first step), so the peak is the larger stage.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..weights.memory import MemoryEstimate, estimate_from_shapes

# checkpoint prefixes of the decoder stage (Dev keeps its Q-Former inside gen_transformer)
DECODER_PARTS = ("gen_transformer.", "gen_vae.", "gen_image_condition_refiner.")
# the DiT's image-editing weights, which text-to-image never reads
EDITING_ONLY = ("gen_transformer.ref_image_", "gen_transformer.image_index_embedding")


def staged_estimate(shapes: dict[str, tuple[int, ...]], unused: tuple[str, ...], tokens: int,
                    offload: bool = False) -> MemoryEstimate:
    """The estimate of a checkpoint with these tensor shapes: the LLM without `unused` or the decoder's parts,
    caching `tokens` positions a row, and the decoder's weights beside it (after it with `offload`)."""
    llm = estimate_from_shapes(shapes, tuple(unused) + DECODER_PARTS, tokens)
    return replace(llm, decoder_weights=decoder_weights(shapes), offload=offload)


def decoder_weights(shapes: dict[str, tuple[int, ...]]) -> int:
    """How many weights the DiT, VAE and refiner load from a checkpoint's tensor shapes."""
    return sum(math.prod(shape) for name, shape in shapes.items()
               if name.startswith(DECODER_PARTS) and not name.startswith(EDITING_ONLY))
