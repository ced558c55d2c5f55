"""The T5 text encoders (LlamaGen text-to-image: FLAN-T5-XL; Cosmos Video2World: T5-11B) at the model's precision.

`T5EncoderModel.from_pretrained` would build the encoder in float32 before any cast (19 GB for T5-11B's 4.7B
weights, more than the Cosmos backbone it conditions).  Here it is read like the transformers-backed families
(`streaming.read_hf_network`): built on the meta device, filled tensor by tensor at the compute dtype, the
linear layers of its blocks quantised as they arrive; the decoder and LM head of a full T5 checkpoint are never
read.  The features only condition the model: sampling stays exact given them, whatever the precision.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..weights.hf_folders import check_safetensors_weights
from ..weights.streaming import HFNetwork, read_hf_network

BLOCKS = "encoder.block"  # the quantised linear layers: attention q/k/v/o and the feed-forward wi/wo


def load_t5_encoder(folder: Path, dtype: torch.dtype, precision: str, repository: str):
    """The T5 encoder of a transformers folder (`repository`: what to download), computing in `dtype`, its blocks'
    linear layers at `precision`; token embeddings and norms stay at `dtype`.

    T5's `_keep_in_fp32_modules` (`wo`, the feed-forward output) is honoured as transformers does in float16:
    kept float32 and unquantised, because its outputs overflow float16.  In bfloat16 (float32's exponent range)
    and float32 nothing overflows, so `wo` takes the compute dtype and the precision like every other layer:
    it is a third of T5-11B (24 x 65536 x 1024 weights), which float32 would make 6.4 GB.
    """
    from transformers import T5Config, T5EncoderModel

    hint = f"it needs the transformers files of {repository} (config.json, *.safetensors, tokenizer files)"
    check_safetensors_weights(folder, hint)
    # checkpoints store the token embeddings once, as `shared`; transformers 4.x shares the module, 5.x ties it
    # while loading, so the meta-built encoder gets the module itself
    spec = HFNetwork(T5Config, T5EncoderModel, (), BLOCKS, "a T5 encoder", hint,
                     shared=(("encoder.embed_tokens", "shared"),))
    encoder = read_hf_network(folder, spec, dtype, precision)
    for block in encoder.encoder.block:
        feed_forward = block.layer[-1].DenseReluDense
        if type(feed_forward.wo) is not nn.Linear:
            feed_forward.wo = QuantizedOutput(feed_forward.wo)
    return encoder


class QuantizedOutput(nn.Module):
    """A quantised `wo` as T5's feed-forward must see it.  T5 casts the input of `wo` to `wo.weight.dtype` (for a
    float32 `wo`) unless that is int8: packed 4-bit weights are uint8, so the activations would be cast to
    integers, and our int8 layer has no `weight`.  With no `weight` here T5 casts nothing; the layer computes in
    its input's dtype."""

    weight = None

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)
