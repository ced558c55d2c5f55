"""What transformers' `generate` samples with for a model folder when its caller changes nothing.

`generate` builds its GenerationConfig from the config the caller passes, then the folder's
generation_config.json for what that leaves unset, then transformers' global defaults (top_k 50,
temperature 1, top_p 1) for what both leave unset.  Families whose reference pipeline samples through
`generate` (GLM-Image, Emu3) read their default temperature / top-k / top-p here, so that the sampler's "the
model's value" is the law that pipeline samples from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..decoding.sampling import Sampling
from .weights.checkpoints import ModelLoadError
from .weights.tokenizer_files import read_json

GENERATION_CONFIG = "generation_config.json"


def generate_sampling(folder: Path, given: dict[str, Any], name: str = GENERATION_CONFIG) -> Sampling:
    """The temperature, top-k (None for none) and top-p that `generate` samples with for the model in `folder` when
    called with `GenerationConfig(**given)` (the reference pipeline's own keys), as the installed transformers
    builds it; `name`: the generation config file it reads (MammothModa2's t2i_generation_config.json)."""
    from transformers import GenerationConfig

    path = Path(folder) / name
    saved = read_json(path) if path.is_file() else {}
    try:
        config = GenerationConfig.from_dict({**saved, **given})
    except (TypeError, ValueError) as err:
        raise ModelLoadError(f"{path} is not a generation config transformers accepts ({err})") from err
    # transformers 5 leaves unset keys None and fills them in generate; 4.x's constructor already filled them
    global_defaults = getattr(GenerationConfig, "_get_default_generation_params", dict)()
    value = {key: global_defaults.get(key) if getattr(config, key) is None else getattr(config, key)
             for key in ("temperature", "top_k", "top_p")}
    # generate adds no warper for a temperature or top-p of None or 1, nor a top-k of None or 0
    temperature, top_k, top_p = value["temperature"], value["top_k"], value["top_p"]
    for name, number in (("temperature", temperature), ("top_p", top_p)):
        if number is not None and not (isinstance(number, (int, float)) and number > 0):
            raise ModelLoadError(f"{path} sets {name} {number!r}; it must be a positive number")
    if top_k is not None and not (isinstance(top_k, int) and top_k >= 0):
        raise ModelLoadError(f"{path} sets top_k {top_k!r}; it must be a non-negative integer")
    return Sampling(temperature=1.0 if temperature is None else float(temperature), top_k=top_k or None,
                    top_p=1.0 if top_p is None else min(float(top_p), 1.0))
