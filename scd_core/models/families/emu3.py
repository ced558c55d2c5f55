"""Emu3-Gen in the Hugging Face format (BAAI/Emu3-Gen-hf), through transformers' Emu3ForConditionalGeneration.

Sequence layout for a grid of H x W codes (720 px square: H = W = 90, 8193 tokens)::

    BOS text <|image start|> "H*W" <|image token|>  |  H x (W codes, <|extra_200|>)  <|extra_201|> <|image end|> EOS
    ------------------- prompt -------------------     ------------- generated: H * (W + 1) + 3 --------------

The row-end and the three closing tokens are forced; every other position
samples among the 32768 `<|visual token NNNNNN|>` ids only (`code_ids`, whose
lm_head rows are the only ones computed).  CFG as the authors run it: the prompt
gets a quality suffix, the uncond rows hold a negative prompt with the same
image prefix; cond and uncond rows are left-padded to one length and batched.
The KV cache is pre-allocated for the whole image with one length per row
(`scd_core.models.sessions.row_cache`), so each sample of a batch advances at its own pace.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from ..sessions.cfg_session import CFGSession, cfg_prefix, check_positions
from ..weights.checkpoints import ModelLoadError
from ..sessions.code_rows import code_cells, forced_tokens, with_row_ends
from ..family import Family
from ..generate_defaults import generate_sampling
from ..weights.generation_only import code_rows_head
from ..weights.hf_folders import check_safetensors_weights, config_model_type
from ..tokenizers.image_encoder import LazyImageEncoder, hf_vq_encoder
from ..weights.quantize import quantize_then_move
from ..sessions.row_attention import RowAttentionBackbone, attention_layer
from ..weights.streaming import HFNetwork, read_hf_network
from ..weights.tokenizer_files import TextTokenizer, positive_int, read_json, without_nulls
from ...images.image_input import no_image_encoder
from ...compiled.compilable import Compilable
from ...model import check_start, check_tokens, compute_device
from ...decoding.sampling import Sampling

MODEL_TYPE = "emu3"
FAMILY = Family(
    label="Emu3", holds="an Emu3-Gen folder (BAAI/Emu3-Gen-hf: model_type 'emu3')",
    downloads=(("emu3", "the Hugging Face repository BAAI/Emu3-Gen-hf (the transformers format)"),),
    repos=("BAAI/Emu3-Gen-hf",),
    roots=("Emu3",), cfg="Emu3 3", top_k="Emu3 2048",
    top_p="Emu3 its generation_config.json's, if it sets one", temperature="Emu3 its generation_config.json's, if any",
    sizes=("Emu3 (any aspect, 8 px steps)",), compile=True)
HF_FORMAT_HINT = ("download the transformers-format repository BAAI/Emu3-Gen-hf instead (BAAI/Emu3-Gen holds "
                  "the original layout, which needs its own custom code)")
BOS, EOS = "<|extra_203|>", "<|extra_204|>"
IMAGE_START, IMAGE_WRAPPER, IMAGE_END = "<|image start|>", "<|image token|>", "<|image end|>"
ROW_END, FRAME_END = "<|extra_200|>", "<|extra_201|>"
VISUAL_TOKEN = "<|visual token {:06d}|>"
# The authors' recommended prompting (BAAI's Emu3-Gen example).
QUALITY_SUFFIX = " masterpiece, film grained, best quality."
NEGATIVE_PROMPT = ("lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, "
                   "cropped, worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, "
                   "username, blurry.")
DEFAULT_RATIO, DEFAULT_AREA = "1:1", 720 * 720
DOWNSAMPLE = 8  # pixels per token side, as Emu3's processor assumes
# The VQ's encoder side turns images into codes: generation never runs it.
UNUSED_MODULES = ("model.vqmodel.encoder", "model.vqmodel.quant_conv")
# their checkpoint names, in the published (BAAI/Emu3-Gen-hf) and in transformers' own spelling
UNUSED_WEIGHTS = ("vqmodel.encoder.", "vqmodel.quant_conv.", "model.vqmodel.encoder.", "model.vqmodel.quant_conv.")
# What an image in the prompt loads on first use: the encoder side and the codebook, in both spellings.
IMAGE_ENCODER_WEIGHTS = UNUSED_WEIGHTS + ("vqmodel.quantize.", "model.vqmodel.quantize.")
# The published shards' names -> transformers' module names (transformers renames them the same way on loading).
PUBLISHED_NAMES = (("text_model.model.", "model.text_model."), ("text_model.lm_head.", "lm_head."),
                   ("vqmodel.", "model.vqmodel."))
CACHE_TOKENS = 120 + 8193  # a prompt and a 720 px image (memory estimates)
# BAAI's image_generation.py: generate(GenerationConfig(do_sample=True, top_k=2048, ...)) with CFG 3 as a logits
# processor; transformers fills the rest from the folder's generation_config.json, then its global defaults
AUTHORS_GENERATION = {"do_sample": True, "top_k": 2048}
AUTHORS_CFG = 3.0


def grid_size(ratio: str, image_area: int) -> tuple[int, int]:
    """(rows, cols) of codes for a "W:H" aspect ratio and a pixel area, as Emu3's processor computes them."""
    try:
        width, height = (int(part) for part in ratio.split(":"))
    except (AttributeError, ValueError):
        raise ValueError(f"ratio must look like '16:9' (width:height), got {ratio!r}") from None
    if width < 1 or height < 1 or not isinstance(image_area, int) or image_area < 1:
        raise ValueError(f"ratio sides and image_area must be positive integers, got {ratio!r}, {image_area!r}")
    scale = (image_area / (width * height)) ** 0.5
    rows, cols = int(round(height * scale / DOWNSAMPLE)), int(round(width * scale / DOWNSAMPLE))
    if rows < 1 or cols < 1:
        raise ValueError(f"image_area {image_area} at ratio {ratio} is less than one {DOWNSAMPLE} px token")
    return rows, cols


@dataclass(frozen=True)
class Emu3Prompt:
    """Token ids of the cond and uncond prefixes (each ending with the image prefix) and the grid they ask for."""

    cond: tuple[int, ...]
    uncond: tuple[int, ...]
    size: tuple[int, int]


class Emu3Model(Compilable):
    """A loaded Emu3-Gen: TokenModel for the engine, plus encode/decode for prompts and pixels."""

    layer_step = staticmethod(attention_layer)
    family = "emu3"
    default_cfg_scale = AUTHORS_CFG  # the authors' classifier_free_guidance

    def __init__(self, module: torch.nn.Module, tokenizer: TextTokenizer, code_ids: torch.Tensor,
                 image_encoder: Optional[LazyImageEncoder] = None,
                 sampling: Optional[Sampling] = None) -> None:
        """`image_encoder`: the VQ's encoder side, loaded on the first `encode_image` (None: no image input);
        `sampling`: the temperature, top-k and top-p by default (`sampling_defaults`; None: the authors' top-k)."""
        sampling = sampling or Sampling(top_k=AUTHORS_GENERATION["top_k"])
        self.default_temperature, self.default_top_k, self.default_top_p = (
            sampling.temperature, sampling.top_k, sampling.top_p)
        self.module = module
        self.image_encoder = image_encoder
        self._tokenizer = tokenizer
        self.code_ids = code_ids
        self.vocab_size = code_ids.numel()
        # generation samples only the 32768 image-code rows of lm_head (of ~184k): the others are freed
        module.lm_head = code_rows_head(module.lm_head, code_ids)
        self._code_of = torch.zeros(module.config.text_config.vocab_size, dtype=torch.long)
        self._code_of[code_ids] = torch.arange(self.vocab_size)  # id -> code; non-code ids decode as code 0
        self._bos = tokenizer.special_id("bos_token", BOS)
        self._eos = tokenizer.special_id("eos_token", EOS)
        self._image_start, self._image_wrapper, self._image_end, self._row_end, self._frame_end = (
            tokenizer.token_id(t) for t in (IMAGE_START, IMAGE_WRAPPER, IMAGE_END, ROW_END, FRAME_END))
        self.set_resolution(DEFAULT_RATIO, DEFAULT_AREA)

    @property
    def device(self) -> torch.device:
        return compute_device(self, next(self.module.parameters()))

    def set_resolution(self, ratio: str = DEFAULT_RATIO, image_area: int = DEFAULT_AREA) -> None:
        """Image aspect ("W:H") and pixel area for the next encode/generate; 1:1 at 720 x 720 by default."""
        self._set_grid(*grid_size(ratio, image_area))

    def set_image_size(self, width: int, height: int) -> None:
        """About width x height pixels (each side rounded to Emu3's 8 px tokens) for the next encode."""
        self.set_resolution(f"{width}:{height}", width * height)

    def _set_grid(self, rows: int, cols: int) -> None:
        self.size = (rows, cols)
        self.grid = (rows, cols + 1)  # the row-end column included, so `above` lands on the same column
        self.num_tokens = rows * (cols + 1) + 3
        self.forced_tokens = forced_tokens(rows, cols, self._row_end, (self._frame_end, self._image_end, self._eos))
        self.image_shape = (rows * DOWNSAMPLE, cols * DOWNSAMPLE)

    def encode(self, prompt: str, negative_prompt: Optional[str] = None, *, quality_suffix: bool = True
               ) -> Emu3Prompt:
        """Prefix ids for the current resolution; None as negative prompt means the authors' negative prompt."""
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
        if negative_prompt is not None and not isinstance(negative_prompt, str):
            raise ValueError(f"negative_prompt must be a string or None, got {type(negative_prompt).__name__}")
        text = prompt.strip() + (QUALITY_SUFFIX if quality_suffix else "")
        negative = NEGATIVE_PROMPT if negative_prompt is None else negative_prompt.strip()
        return Emu3Prompt(cond=self._prefix_ids(text), uncond=self._prefix_ids(negative), size=self.size)

    def _prefix_ids(self, text: str) -> tuple[int, ...]:
        rows, cols = self.size
        return (self._bos, *self._tokenizer.encode(text), self._image_start,
                *self._tokenizer.encode(f"{rows}*{cols}"), self._image_wrapper)

    def start(self, cond: Emu3Prompt, batch_size: int) -> CFGSession:
        check_start(cond, Emu3Prompt, "Emu3Model.encode()", batch_size)
        if cond.size != self.size:  # the size the prompt was encoded for wins
            self._set_grid(*cond.size)
        check_positions(cond.cond, cond.uncond, self.num_tokens, self.module.config.text_config.max_position_embeddings,
                        "use a shorter prompt or a smaller image_area")
        prefix, mask = cfg_prefix(cond.cond, cond.uncond, self._bos, batch_size, self.device)
        net = self.module
        return CFGSession(prefix, mask, self.num_tokens,
                          backbone=lambda cache: RowAttentionBackbone(net.model.text_model, cache,
                                                                      self.compiled_layer),
                          embed_prefix=net.get_input_embeddings(), embed_image=net.get_input_embeddings(),
                          head=net.lm_head,  # its rows are the image codes only
                          static_shapes=self.compiled)

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, num_tokens) to float32 CPU images (batch, H, W, 3) in 0..1 via Emu3's VQ decoder."""
        check_tokens(tokens, self.num_tokens, self._code_of.numel())
        rows, cols = self.size
        codes = self._code_of[code_cells(tokens, rows, cols).cpu()].to(self.device)
        images = self.module.model.vqmodel.decode(codes)
        return ((images.float() + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1).cpu()

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """ComfyUI IMAGE (batch, H, W, 3) in 0..1 -> token ids (batch, num_tokens) at the current size, as
        `decode` takes them (row ends and closing tokens included).  The authors resize an image to the pixel
        area and round each side to 8 px; one of another aspect than the current size is scaled to cover it and
        centre-cropped."""
        if self.image_encoder is None:
            raise no_image_encoder(self)
        codes = self.image_encoder.codes(images, self.image_shape, self.device)
        closing = torch.tensor([self._frame_end, self._image_end, self._eos]).expand(codes.shape[0], 3)
        return torch.cat([with_row_ends(self.code_ids[codes], self._row_end), closing], dim=1)


class Emu3ImageCodes(torch.nn.Module):
    """Emu3's VQ encoder side: transformers' Emu3VQVAE.encode, one image at a time (its nearest-code search
    holds a positions x 32768 distance matrix)."""

    def __init__(self, vq: torch.nn.Module) -> None:
        super().__init__()
        self.vq = vq

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels (batch, 3, H, W) in -1..1 -> codes (batch, H/8, W/8)."""
        sizes = torch.tensor([pixels.shape[-2:]])
        codes = []
        for image in pixels.split(1):
            encoded = self.vq.encode(image, sizes)
            codes.append(getattr(encoded, "image_tokens", encoded)[0])  # a list before transformers 5
        return torch.stack(codes)


def image_encoder(folder: Path, config: Any, dtype: torch.dtype) -> LazyImageEncoder:
    """The VQ encoder of the Emu3 folder `folder` (its Emu3Config `config`), read on first use at `dtype`."""
    from transformers import Emu3VQVAE

    files = sorted(folder.glob("*.safetensors"))
    renames = (("model.vqmodel.", ""), ("vqmodel.", ""))
    return LazyImageEncoder(
        FAMILY.label, files, IMAGE_ENCODER_WEIGHTS,
        lambda vq_dtype: Emu3ImageCodes(hf_vq_encoder(Emu3VQVAE, config.vq_config, files, renames, vq_dtype,
                                                      HF_FORMAT_HINT)), dtype)


def detect(folder: Path) -> bool:
    """An Emu3 folder: config.json of model_type "emu3", or the original layout ("Emu3"), to explain it."""
    return str(config_model_type(folder)).lower() == MODEL_TYPE


def _check_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{folder} has no config.json; expected an Emu3-Gen folder in the transformers "
                             f"format (config.json, *.safetensors, tokenizer.json): {HF_FORMAT_HINT}")
    config = without_nulls(read_json(path))  # a null field means its default
    model_type = config.get("model_type")
    if (model_type != MODEL_TYPE and str(model_type).lower() == MODEL_TYPE) or "auto_map" in config:
        raise ModelLoadError(f"{folder} holds the original BAAI/Emu3-Gen layout (custom code, no VQ decoder); "
                             f"{HF_FORMAT_HINT}")
    if model_type != MODEL_TYPE:
        raise ModelLoadError(f"{path} has model_type {model_type!r}, not {MODEL_TYPE!r}: not an Emu3 folder")
    return config


def code_ids_from(config: dict, tokenizer: TextTokenizer, folder: Path) -> torch.Tensor:
    """Ids of the visual tokens in code order, from config.json's vocabulary_map, checked against the tokenizer."""
    vocabulary = config.get("vocabulary_map") or {}
    codebook = positive_int(config.get("vq_config", {}).get("codebook_size", 32768), "vq_config.codebook_size",
                            folder / "config.json")
    try:
        ids = [int(vocabulary[VISUAL_TOKEN.format(code)]) for code in range(codebook)]
    except KeyError as err:
        raise ModelLoadError(f"{folder / 'config.json'}: vocabulary_map lacks the visual token {err.args[0]} "
                             f"of a {codebook}-code VQ; {HF_FORMAT_HINT}") from None
    for code in (0, codebook - 1):
        if tokenizer.token_id(VISUAL_TOKEN.format(code)) != ids[code]:
            raise ModelLoadError(f"{folder}: tokenizer.json and config.json disagree on the id of "
                                 f"{VISUAL_TOKEN.format(code)}; the folder mixes files of different models")
    return torch.tensor(ids, dtype=torch.long)


def sampling_defaults(folder: Path) -> Sampling:
    """The temperature, top-k and top-p the authors' generate call samples the model in `folder` with: top-k 2048, the
    rest from the folder's generation_config.json, else transformers' global defaults (1: none)."""
    return generate_sampling(folder, AUTHORS_GENERATION)


def load(folder: Path, device: torch.device, dtype: torch.dtype, quantize: str = "none") -> Emu3Model:
    """Load a transformers-format Emu3-Gen folder onto `device`, computing in `dtype`, the backbone's linear
    layers at `quantize` precision (quantize.PRECISIONS)."""
    folder = Path(folder)
    if dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        raise ValueError(f"dtype must be float32, bfloat16, float16 (or float64 for tests), got {dtype}")
    config = _check_config(folder)
    tokenizer = TextTokenizer(folder)
    code_ids = code_ids_from(config, tokenizer, folder)
    check_safetensors_weights(folder, HF_FORMAT_HINT)
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    # the backbone is quantised as it is read
    module = read_hf_network(folder, HFNetwork(Emu3Config, Emu3ForConditionalGeneration, UNUSED_MODULES,
                                               "model.text_model", "Emu3-Gen", HF_FORMAT_HINT, PUBLISHED_NAMES),
                             dtype, quantize)
    model = Emu3Model(module, tokenizer, code_ids, image_encoder(folder, module.config, dtype),  # slices lm_head
                      sampling_defaults(folder))
    quantize_then_move(model.module, module.model.text_model, "none", dtype, device)
    return model
