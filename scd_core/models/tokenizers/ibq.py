"""Emu3.5's image tokenizer (BAAI/Emu3.5-VisionTokenizer): an IBQ VQ at 16x downsampling, read safely.

IBQ ("index backpropagation quantisation") keeps the taming-transformers VQGAN encoder and decoder (GroupNorm,
residual blocks, attention where a level has it, nearest-neighbour upsampling) and changes the quantiser: a latent
vector z takes the code whose entry e has the largest dot product z.e (the argmax of its logits over the codebook),
not the nearest one; decoding looks the codes up in the codebook as before.  So the decoder is `taming.py`'s and the
encoder `taming_encoder.py`'s with that one choice (`IBQEncoder.pick`); both read their architecture off the weights.

The folder holds `config.yaml` (the quantiser's n_embed / embed_dim and the encoder/decoder's ddconfig) and a pickled
Lightning-style `model.ckpt` (weights under "state_dict").  It is opened with torch.load(weights_only=True) only;
a checkpoint that needs more is refused with the command that converts it once to `model.safetensors`
(`python -m scd_core.models.tokenizers.ibq`), which the loader then prefers.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Optional

import torch

from ..weights.checkpoints import ModelLoadError, read_safetensors, read_torch_checkpoint
from .taming import VQDecoder, load_decoder
from .taming_encoder import VQEncoder, load_encoder

CONFIG, CHECKPOINT, CONVERTED = "config.yaml", "model.ckpt", "model.safetensors"


class IBQEncoder(VQEncoder):
    """The taming encoder with IBQ's choice of code."""

    @staticmethod
    def pick(z: torch.Tensor, book: torch.Tensor) -> torch.Tensor:
        """Latent vectors (B, N, dim) -> the code whose entry has the largest dot product with each."""
        return (z @ book.t()).argmax(dim=-1)


def converter_command(checkpoint: Path) -> str:
    """The conversion command, allowing the classes the checkpoint pickles besides tensors (torch's own list of
    them), which the user then reviews."""
    needed = torch.serialization.get_unsafe_globals_in_checkpoint(str(checkpoint))
    return f"python -m scd_core.models.tokenizers.ibq {checkpoint}" + "".join(f" --allow {name}" for name in needed)


def read_config(folder: Path) -> dict[str, Any]:
    """config.yaml's top level (plain YAML: read with safe_load)."""
    import yaml

    path = folder / CONFIG
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ModelLoadError(f"{path} is not readable YAML ({type(err).__name__}); download it again") from None
    if not isinstance(config, dict) or not isinstance(config.get("n_embed"), int):
        raise ModelLoadError(f"{path} names no n_embed (the codebook size): not an IBQ VisionTokenizer config")
    return config


def read_state(folder: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The tokenizer's tensors and the file they came from: model.safetensors when present (converted), else
    model.ckpt through weights_only loading; a checkpoint that holds more than tensors is refused with the
    converter's command."""
    converted = folder / CONVERTED
    if converted.is_file():
        return read_safetensors(converted), str(converted)
    checkpoint = folder / CHECKPOINT
    if not checkpoint.is_file():
        raise ModelLoadError(f"{folder} has neither {CHECKPOINT} nor {CONVERTED}: download BAAI/Emu3.5-VisionTokenizer "
                             "into it")
    try:
        return read_torch_checkpoint(checkpoint, keys=("state_dict",)), str(checkpoint)
    except ModelLoadError as err:
        if "was refused" not in str(err):
            raise
        raise ModelLoadError(f"{err}; to convert it once to {CONVERTED}, allowing those classes only: "
                             f"{converter_command(checkpoint)}") from None


class IBQTokenizer:
    """The VisionTokenizer folder: its decoder (loaded now) and its encoder (loaded on the first image given)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        config = read_config(self.folder)
        state, self.source = read_state(self.folder)
        self.decoder: VQDecoder = load_decoder(state, spatial_norm=False, source=self.source)
        spec = self.decoder.spec
        if (spec.codebook_size, spec.embed_dim) != (config["n_embed"], config.get("embed_dim", spec.embed_dim)):
            raise ModelLoadError(f"{self.source} holds a {spec.codebook_size} x {spec.embed_dim} codebook where "
                                 f"{self.folder / CONFIG} says {config['n_embed']} x {config.get('embed_dim')}; "
                                 "the folder mixes files of different tokenizers")
        self._encoder: Optional[IBQEncoder] = None

    @property
    def codebook_size(self) -> int:
        return self.decoder.spec.codebook_size

    @property
    def downsample(self) -> int:
        return self.decoder.spec.downsample

    def encoder(self) -> VQEncoder:
        """The encoder side, read from the same file on first use (generation never needs it)."""
        if self._encoder is None:
            state, source = read_state(self.folder)
            self._encoder = load_encoder(state, source, IBQEncoder)
        return self._encoder


def allowed_class(name: str) -> Any:
    """The class (or function) `module.Name` that the user allows the conversion's weights_only loading to build."""
    import importlib

    module, _, attribute = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError, ValueError):
        raise ModelLoadError(f"--allow {name}: no such class is installed") from None


def convert(checkpoint: Path, allow: tuple[str, ...] = ()) -> Path:
    """Write the tensors of `checkpoint` (an IBQ model.ckpt) to model.safetensors beside it, reading it with
    weights_only loading that may also build the classes named in `allow` (what a Lightning checkpoint keeps
    next to its weights, e.g. its hyper-parameters); returns the file written."""
    from safetensors.torch import save_file

    with torch.serialization.safe_globals([allowed_class(name) for name in allow]):
        state = read_torch_checkpoint(Path(checkpoint), keys=("state_dict",))
    target = Path(checkpoint).with_name(CONVERTED)
    save_file({name: tensor.contiguous() for name, tensor in state.items()}, str(target), metadata={"format": "pt"})
    return target


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m scd_core.models.tokenizers.ibq",
                                     description="Convert an Emu3.5 VisionTokenizer model.ckpt to model.safetensors "
                                                 "(weights_only loading: nothing in the file is run).")
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--allow", action="append", default=[], metavar="MODULE.CLASS",
                        help="a class the checkpoint pickles besides tensors, allowed after you checked it")
    args = parser.parse_args(argv)
    try:
        print(f"wrote {convert(args.checkpoint, tuple(args.allow))}")
    except ModelLoadError as err:
        parser.exit(1, f"error: {err}\n")


if __name__ == "__main__":
    main()
