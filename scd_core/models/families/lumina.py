"""Lumina-mGPT (7B; 512/768/1024 px) and Lumina-mGPT 2.0, through transformers' Chameleon classes.

Sequence layout at W x H px (h = H/32 and w = W/32 grid cells of 32 px; d = 16 px per
token for Lumina-mGPT 1, 8 for 2.0, so rows = H/d and cols = W/d)::

    BOS "Generate an image of WxH according to the following prompt:\\n{prompt}<reserved08706>"
    <racm3:break> <reserved{8800+h}> <reserved{8800+w}>   |  rows x (cols codes, <reserved08799>)  <eoss>
    ------------------------- prompt ------------------------   ------- generated: rows * (cols + 1) + 1 -------

The row-end and end-of-image positions are forced; every other position samples
among the image codes only (`code_ids`; only their lm_head rows are computed):
Chameleon's `IMGIMG*` tokens (8192, ids 4..8195) for Lumina-mGPT 1, ids
155000 + code (16384) for 2.0.  The special tokens are looked up by name: 2.0's
tokenizer gives the same names other ids.  The unconditional context is only
[begin-of-image, height, width] (positions from 0), as in the authors' CFG;
the cond and uncond rows are left-padded to one length and batched over a
per-row KV cache (`RowCache`, as Janus runs it), so each sample advances at its own pace.

Lumina-mGPT 2.0 as its authors' plain text-to-image path samples it (Alpha-VLLM/Lumina-mGPT-2.0:
generate_examples/generate.py, inference_solver.py, xllmx/model/tokenizer.py, movqgan/):
- BOS: the tokenizer's named BOS, or its EOS when it names none (their wrapper's rule on
  transformers' bos_token_id); the prompt text as given, not stripped, encoded in one string
  with the end-of-turn token, without special tokens.
- Any width x height in multiples of 32; the header names the height cells, then the width cells.
- Guidance: before each token after the header their CFG processor rewrites its running scale
  g = max(4, g * (1 - n / (4 * h * w))), n = tokens after begin-of-image (size tokens and
  row-ends included); a scale of 1 switches CFG off (`decaying_guidance`, `cfg_schedule`).
  Defaults CFG 4, top-k 4096, temperature 1 (their sample.sh).
- MoVQGAN-270M decodes in float32 whatever the model's dtype; its checkpoint is loaded
  non-strictly there (entries the decoder does not use are set aside here, with a warning).
- Their model writes the header itself (text top-k 10); here it is given, so the size asked
  is the size generated.  Their accelerated path (--speculative_jacobi) samples otherwise.
Lumina-mGPT 1 is read from the published files only: square sizes, constant guidance.

Weights: the published shards come from the authors' fork of an older
transformers Chameleon, which stores each q/k-norm weight and bias with one row
per model-parallel shard ([1, 128] for the 7B) where transformers keeps one row
per head.  The shapes are read from the safetensors headers, the rows repeated
over the heads of their shard, and every tensor must then match the model:
nothing is re-initialised, nothing is skipped except what is listed in
UNUSED_PREFIXES.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

import torch

from ...images.image_input import prepare_images
from ...model import check_start, check_tokens, compute_device
from ..sessions.cfg_session import CFGSession, cfg_prefix, check_positions
from ..weights.checkpoints import PICKLE_SUFFIXES, ModelLoadError, read_weights
from ..sessions.code_rows import code_cells, forced_tokens, with_row_ends
from ..family import Family
from ..weights.generation_only import code_rows_head
from ..weights.hf_folders import load_or_refuse
from ..weights.quantize import assign_quantizing, quantize_then_move
from ..weights.streaming import parameters_on_meta
from ..weights.tokenizer_files import TextTokenizer, positive_int, read_json
from ..tokenizers.chameleon_vqgan import CHECKPOINT as VQGAN_CHECKPOINT, load_chameleon_vqgan
from .janus import RowBackbone
from ..tokenizers.movqgan import CHECKPOINT as MOVQGAN_CHECKPOINT, load_movqgan
from ..tokenizers.taming import VQDecoder
from ..tokenizers.taming_encoder import VQEncoder, load_encoder
from ..tokenizers.vq16 import ENCODER_KEYS

MODEL_TYPE = "chameleon"
FAMILY = Family(
    label="Lumina-mGPT",
    holds="a Lumina-mGPT folder (model_type 'chameleon' plus vqgan.ckpt or movqgan_270M.ckpt)",
    downloads=(("lumina-mgpt-2.0-omni", "the Hugging Face repository Alpha-VLLM/Lumina-mGPT-2.0-Omni (keep 'Omni' in "
                                        "the folder name) plus MoVQGAN's movqgan_270M.ckpt"),
               ("lumina-mgpt-2", "the Hugging Face repository Alpha-VLLM/Lumina-mGPT-2.0 plus MoVQGAN's "
                                 "movqgan_270M.ckpt"),
               ("lumina", "the Hugging Face repository Alpha-VLLM/Lumina-mGPT-7B-768 (or -512, -1024) plus "
                          "Chameleon's vqgan.ckpt and vqgan.yaml")),
    cfg="Lumina-mGPT 3 / 2.0: 4", top_k="Lumina-mGPT 2000 / 2.0: 4096",
    cfg_note="Lumina-mGPT 2.0 follows its authors: 1 turns CFG off; any other scale acts as at least 4 and decays "
             "to 4 within the first image row.",
    sizes=("Lumina-mGPT 2.0 (any aspect, multiples of 32)", "Lumina-mGPT 1 (square, multiples of 32)"),
    image_tasks=("depth", "canny", "subject"))  # 2.0-Omni's (OMNI_PANELS)
BOI, EOI, ROW_END, END_OF_TURN, BOS = "<racm3:break>", "<eoss>", "<reserved08799>", "<reserved08706>", "<s>"
PROMPT_TEMPLATE = "Generate an image of {width}x{height} according to the following prompt:\n{prompt}"
GRID_CELL = 32  # pixels per height/width token
IMAGE_TOKEN = re.compile(r"^IMGIMG([A-J]+)Z$")  # Chameleon's image tokens: the code index spelled with A=0 .. J=9
MOVQ_CODE_OFFSET = 155000
# Set aside on purpose: the image encoder (no published weights; generation never encodes
# images) and rotary tables (recomputed from config.json).
UNUSED_PREFIXES = ("model.vqmodel.",)
UNUSED_SUFFIXES = ("rotary_emb.inv_freq",)
# what the memory estimate leaves out: those, and the VQ checkpoint's encoder side (loaded on the first image
# in the prompt, `encode_image`, never at load)
UNUSED_WEIGHTS = UNUSED_PREFIXES + ENCODER_KEYS
CACHE_TOKENS = 80 + 2357  # a prompt and a 768 px image (memory estimates)
HINT = ("a Lumina-mGPT folder is the Hugging Face repository (Alpha-VLLM/Lumina-mGPT-7B-768 or -512/-1024, "
        "or Alpha-VLLM/Lumina-mGPT-2.0) plus its image tokenizer (Chameleon's vqgan.ckpt, or movqgan_270M.ckpt "
        "for 2.0); see the README's 'Model folders' table")


@dataclass(frozen=True)
class Variant:
    """What differs between Lumina-mGPT 1 and 2.0."""

    family: str
    vq_file: str
    vq_places: tuple[str, ...]  # subfolders searched for the VQ checkpoint, the model folder first
    downsample: int             # pixels per image token side
    cfg_scale: float
    top_k: int
    default_resolution: Optional[int]
    square_only: bool             # Lumina-mGPT 1: other aspects not checked against its authors' code
    cfg_floor: Optional[float]    # 2.0: the guidance decays to this floor along the image (`decaying_guidance`)
    vq_dtype: Optional[torch.dtype]  # the decoder's dtype whatever the model's (None: the model's)
    checkpoint: str                  # how errors name it
    image_tasks: tuple[str, ...] = ()  # image-conditioned tasks it was trained for (OMNI_PANELS)


LUMINA_1 = Variant("lumina-mgpt", VQGAN_CHECKPOINT, (".", "chameleon", "chameleon/tokenizer"), 16,
                   cfg_scale=3.0, top_k=2000, default_resolution=None,  # CFG 3 as in the authors' code
                   square_only=True, cfg_floor=None, vq_dtype=None, checkpoint="Lumina-mGPT 1")
LUMINA_2 = Variant("lumina-mgpt-2", MOVQGAN_CHECKPOINT, (".", "movqgan", "movqgan/270M"), 8,
                   cfg_scale=4.0, top_k=4096, default_resolution=768,  # the 2.0 README's settings
                   square_only=False, cfg_floor=4.0, vq_dtype=torch.float32, checkpoint="Lumina-mGPT 2.0")
# Lumina-mGPT 2.0-Omni's image-conditioned tasks as the authors' generate.py builds them (--task i2i --i2i_task):
# what the given upper half of the dual panel shows, as their prompt names it ("subject" is their literal string).
# Their code builds no other image-conditioned prompt: editing, hed and openpose appear only in text-to-pair prompts.
OMNI_PANELS = {"depth": "depth map", "canny": "canny edge map",
               "subject": "Bubbly and effervescent with a sparkling allure."}
OMNI_TEMPLATE = ("Generate a dual-panel image of {width}x{height} where the <upper half> displays a <{panel}>, while "
                 "the <lower half> retains the original image for direct visual comparison:\n{prompt}")
LUMINA_2_OMNI = replace(LUMINA_2, checkpoint="Lumina-mGPT 2.0-Omni", image_tasks=tuple(OMNI_PANELS))
# Chameleon's text tokenizer, for the 512 px repository that ships none.
TOKENIZER_PLACES = ((".", "tokenizer.json"), (".", "text_tokenizer.json"), ("chameleon", "text_tokenizer.json"),
                    ("chameleon/tokenizer", "text_tokenizer.json"))


@dataclass(frozen=True)
class LuminaPrompt:
    """Token ids of the cond prefix (prompt + image header) and the uncond one (image header alone)."""

    cond: tuple[int, ...]
    uncond: tuple[int, ...]
    image_size: tuple[int, int]  # (width, height) pixels the header asks for: the session must generate it
    text: str = ""                   # the prompt and negative prompt as given, for `add_image` to re-template
    negative: Optional[str] = None


def decaying_guidance(scale: float, num_tokens: int, cells: int, floor: float) -> torch.Tensor:
    """Lumina-mGPT 2.0's guidance scale at each generated position, as its authors' CFG processor sets it.

    Before each token after the header it rewrites its running scale g (starting at `scale`) as
    max(floor, g * (1 - n / (4 * cells))), n = the tokens after begin-of-image so far (the height and width
    tokens, codes and row-ends: n = position + 2), `cells` = the 32 px cells of the image.  So a scale below
    the floor acts as the floor, one above decays to it (within the first rows at 768 px).
    """
    scales, g = [], float(scale)
    for position in range(num_tokens):
        g = max(floor, g * (1 - (position + 2) / (4 * cells)))
        scales.append(g)
    return torch.tensor(scales)


class LuminaModel:
    """A loaded Lumina-mGPT: TokenModel for the engine, plus encode/decode for prompts and pixels."""

    default_temperature = 1.0

    def __init__(self, net: torch.nn.Module, vq: VQDecoder, tokenizer: TextTokenizer, code_ids: torch.Tensor,
                 variant: Variant, resolution: int, bos: int, vq_path: Path) -> None:
        # generation samples only the image-code rows of lm_head (8192 or 16384 of 65536+): the others are freed
        net.lm_head = code_rows_head(net.lm_head, code_ids)
        self.module = torch.nn.ModuleDict({"lm": net, "vq": vq}).eval()
        self.family = variant.family
        self.default_cfg_scale = variant.cfg_scale
        self.default_top_k = variant.top_k
        self._tokenizer = tokenizer
        self.code_ids = code_ids
        self.vocab_size = code_ids.numel()
        self._code_of = torch.full((net.config.vocab_size,), -1, dtype=torch.long)
        self._code_of[code_ids] = torch.arange(self.vocab_size)  # token id -> code index, -1 for other ids
        self._bos = bos
        self._boi, self._eoi, self._row_end = (tokenizer.token_id(t) for t in (BOI, EOI, ROW_END))
        self._variant = variant
        self._vq_path = vq_path
        self._encoder: Optional[VQEncoder] = None
        self.set_image_size(resolution, resolution)

    def set_image_size(self, width: int, height: int) -> None:
        """width x height pixels for the next encode/generate, each a multiple of 32; the folder's size by default.

        2.0 takes any such size, as its authors sample it; Lumina-mGPT 1 (one resolution per checkpoint) square
        sizes only here.
        """
        for name, side in (("width", width), ("height", height)):
            if not isinstance(side, int) or isinstance(side, bool) or side < GRID_CELL or side % GRID_CELL:
                raise ValueError(f"{name} must be a positive multiple of {GRID_CELL} pixels, got {side!r}")
        if self._variant.square_only and width != height:
            raise ValueError(f"Lumina-mGPT 1 generates square images here: got {width} x {height}; give width "
                             "and height the same value (Lumina-mGPT 2.0 takes other aspects)")
        # the header: height then width, in 32 px cells
        self._size_tokens = tuple(self._tokenizer.token_id(f"<reserved{8800 + side // GRID_CELL:05d}>")
                                  for side in (height, width))
        self.image_size = (width, height)
        rows, cols = height // self._variant.downsample, width // self._variant.downsample
        self.size = (rows, cols)
        self.grid = (rows, cols + 1)  # the row-end column included, so `above` lands on the same image column
        self.num_tokens = rows * (cols + 1) + 1
        self.forced_tokens = forced_tokens(rows, cols, self._row_end, (self._eoi,))

    def cfg_schedule(self, scale: float) -> Optional[torch.Tensor]:
        """The guidance at each position for a configured `scale`: 2.0's decays as its authors' sampler does
        (`decaying_guidance`), where a scale of 1 switches CFG off; Lumina-mGPT 1 keeps `scale` (None)."""
        if self._variant.cfg_floor is None or scale == 1.0:
            return None
        width, height = self.image_size
        return decaying_guidance(scale, self.num_tokens, (width // GRID_CELL) * (height // GRID_CELL),
                                 self._variant.cfg_floor)

    @property
    def device(self) -> torch.device:
        return compute_device(self, self.module["lm"].lm_head.weight)

    def encode(self, prompt: str, negative_prompt: Optional[str] = None) -> LuminaPrompt:
        """Prefix ids; without a negative prompt the uncond context is the bare image header, as the authors run it."""
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
        if negative_prompt is not None and not isinstance(negative_prompt, str):
            raise ValueError(f"negative_prompt must be a string or None, got {type(negative_prompt).__name__}")
        header = (self._boi, *self._size_tokens)
        cond = self._prompt_ids(prompt) + header
        if negative_prompt is not None and not negative_prompt.strip():
            negative_prompt = None
        uncond = header if negative_prompt is None else self._prompt_ids(negative_prompt) + header
        return LuminaPrompt(cond=cond, uncond=uncond, image_size=self.image_size, text=prompt,
                            negative=negative_prompt)

    def _prompt_ids(self, text: str, template: str = PROMPT_TEMPLATE, **fields: str) -> tuple[int, ...]:
        """BOS, then the template around the text as given (not stripped) and the end-of-turn token, encoded
        as one string, as the authors' conversation template does."""
        width, height = self.image_size
        body = template.format(width=width, height=height, prompt=text, **fields)
        return (self._bos, *self._tokenizer.encode(body + END_OF_TURN))

    @property
    def image_tasks(self) -> tuple[str, ...]:
        """The image-conditioned tasks of the loaded checkpoint (Lumina-mGPT 2.0-Omni's; none for the others)."""
        return self._variant.image_tasks

    def _vq_encoder(self) -> VQEncoder:
        """The image tokenizer's encoder, read from its checkpoint on first use (generation never needs it), in
        float32 whatever the model's dtype, as both authors' tokenizers encode.  It adds, for the published
        checkpoints, about 110M parameters (420 MiB) for MoVQGAN-270M and 29M (115 MiB) for Chameleon's VQGAN."""
        if self._encoder is None:
            self._encoder = load_encoder(read_weights(self._vq_path), str(self._vq_path))
        device = self.module["vq"].post_quant_conv.weight.device  # follows the decoder wherever the model was moved
        return self._encoder.to(device=device, dtype=torch.float32)

    def _image_codes(self, images: torch.Tensor, width: int, height: int) -> torch.Tensor:
        """ComfyUI images (B, H, W, 3) in 0..1, center-cropped to width x height as the authors' preprocessing does,
        to codes (B, height/d, width/d)."""
        pixels = authors_center_crop(images, width, height)  # (B, 3, height, width) in [-1, 1]
        d = self._variant.downsample
        codes = self._vq_encoder().encode(pixels)
        return codes.view(-1, height // d, width // d).cpu()

    def _code_grid_ids(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (B, rows, cols) to the engine's ids (B, rows * (cols + 1)): each row's code ids, then a row-end."""
        return with_row_ends(self.code_ids[codes], self._row_end)

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """ComfyUI IMAGE (B, H, W, 3) in 0..1 -> (B, num_tokens) ids at the current size, row-ends and end-of-image
        included (what `decode` takes); the image resized and center-cropped as the authors' preprocessing does."""
        width, height = self.image_size
        grid = self._code_grid_ids(self._image_codes(images, width, height))
        return torch.cat((grid, torch.full((grid.shape[0], 1), self._eoi, dtype=grid.dtype)), dim=1)

    def add_image(self, cond: LuminaPrompt, images: torch.Tensor, task: str) -> Any:
        """Lumina-mGPT 2.0-Omni's image-conditioned generation, as the authors' generate.py (--task i2i) builds it:
        a `GivenCells` of `omni_cells`."""
        prompt, tokens, keep = self.omni_cells(cond, images, task)
        from ...decoding.given import GivenCells

        return GivenCells(prompt, tokens, keep)

    def omni_cells(self, cond: LuminaPrompt, images: torch.Tensor, task: str
                   ) -> tuple[LuminaPrompt, torch.Tensor, torch.Tensor]:
        """The prompt, cell tokens and kept cells of Lumina-mGPT 2.0-Omni's image-conditioned generation.

        The image is center-cropped to the upper half of the current W x H panel (H/2 a multiple of 32) and
        tokenized; the prompt becomes their dual-panel template naming what the upper half shows; the sequence
        is header, then the upper half's rows (codes and row-ends), from which the model continues the lower
        half.  Those rows are given cells (`GivenCells`) in both the cond and the uncond branch, as in their
        sequence, whose uncond context is everything from begin-of-image on.  The guidance: their processor first
        updates its scale at the first sampled token, with n >= half the image's tokens, which puts any scale
        other than 1 at the floor 4; `cfg_schedule` is at that floor from the same point on.
        """
        if task not in self.image_tasks:
            offered = f"it takes {', '.join(self.image_tasks)}" if self.image_tasks else \
                "it takes no image in the prompt (Lumina-mGPT 2.0-Omni does: depth, canny, subject)"
            raise ValueError(f"task {task!r} is not one the {self._variant.checkpoint} checkpoint was trained "
                             f"for: {offered}")
        check_start(cond, LuminaPrompt, "LuminaModel.encode()", 1)
        if cond.image_size != self.image_size:
            self.set_image_size(*cond.image_size)
        width, height = self.image_size
        if height % (2 * GRID_CELL):
            raise ValueError(f"a dual panel needs a height that halves into multiples of {GRID_CELL} pixels: got "
                             f"{width} x {height}; the authors use 512 x 1024")
        upper = self._code_grid_ids(self._image_codes(images, width, height // 2))
        header = (self._boi, *self._size_tokens)
        prompt = LuminaPrompt(cond=self._prompt_ids(cond.text, OMNI_TEMPLATE, panel=OMNI_PANELS[task]) + header,
                              uncond=cond.uncond, image_size=cond.image_size, text=cond.text, negative=cond.negative)
        tokens = torch.full((upper.shape[0], self.num_tokens), int(self.code_ids[0]), dtype=torch.long)
        for position, token in self.forced_tokens.items():
            tokens[:, position] = token
        tokens[:, : upper.shape[1]] = upper
        keep = torch.zeros_like(tokens, dtype=torch.bool)
        keep[:, : upper.shape[1]] = True
        return prompt, tokens, keep

    def start(self, cond: LuminaPrompt, batch_size: int) -> CFGSession:
        check_start(cond, LuminaPrompt, "LuminaModel.encode()", batch_size)
        if cond.image_size != self.image_size:  # the size the prompt was encoded for wins
            self.set_image_size(*cond.image_size)
        check_positions(cond.cond, cond.uncond, self.num_tokens, self.module["lm"].config.max_position_embeddings,
                        "use a shorter prompt")
        prefix, mask = cfg_prefix(cond.cond, cond.uncond, self._boi, batch_size, self.device)
        lm = self.module["lm"]
        return CFGSession(prefix, mask, self.num_tokens,
                          backbone=lambda cache: RowBackbone(lm.model, cache),
                          embed_prefix=lm.model.embed_tokens, embed_image=lm.model.embed_tokens,
                          # the code rows only: transformers' own head would mask the image rows
                          head=lm.lm_head)

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, num_tokens) to float32 CPU images (batch, H, W, 3) in 0..1."""
        check_tokens(tokens, self.num_tokens, self._code_of.numel())
        rows, cols = self.size
        codes = self._code_of[code_cells(tokens.cpu().long(), rows, cols)]
        if codes.numel() and int(codes.min()) < 0:
            raise ValueError("an image position holds a token that is not an image code")
        vq = self.module["vq"]  # float32 for 2.0 whatever the model's dtype, as its authors decode
        images = vq.decode(codes.flatten(1).to(self.device), rows, cols)
        return ((images.float() + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1).cpu()


def authors_center_crop(images: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """ComfyUI IMAGE (B, H, W, 3) in 0..1 -> (B, 3, height, width) in [-1, 1], as the authors prepare an image:
    their item processor's center_crop, which is `image_input.centre_crop` (8-bit RGB, box-halved, bicubic, the
    centre cut out).  (Lumina-mGPT 1 trains with a random offset; its centre is used here.)  An image of another
    size than the target is resized with a warning naming both."""
    import warnings

    if not isinstance(images, torch.Tensor) or images.dim() != 4 or images.shape[-1] != 3 or not images.shape[0]:
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ValueError(f"images must be a ComfyUI IMAGE (batch, height, width, 3), got {shape}")
    if (images.shape[2], images.shape[1]) != (width, height):
        warnings.warn(f"the image is {images.shape[2]} x {images.shape[1]} px; it is resized and center-cropped "
                      f"to {width} x {height} as the authors' preprocessing does", stacklevel=3)
    return prepare_images(images, (height, width), "crop").pixels


# ----------------------------------------------------------------------------- folders

def detect(folder: Path) -> bool:
    """A Chameleon-architecture folder: config.json of model_type "chameleon"."""
    try:
        return read_json(Path(folder) / "config.json").get("model_type") == MODEL_TYPE
    except ModelLoadError:
        return False


def _find(folder: Path, places: tuple[str, ...], name: str) -> Optional[Path]:
    for place in places:
        path = folder / place / name
        if path.is_file():
            return path
    return None


def _variant(folder: Path) -> tuple[Variant, Path]:
    """Which Lumina-mGPT the folder holds, told by its image tokenizer, and that tokenizer's checkpoint."""
    for variant in (LUMINA_2, LUMINA_1):
        path = _find(folder, variant.vq_places, variant.vq_file)
        if path is not None:
            # the Omni repository's files are the plain 2.0 layout: its name (Lumina-mGPT-2.0-Omni) tells it
            omni = variant is LUMINA_2 and "omni" in folder.name.lower()
            return (LUMINA_2_OMNI if omni else variant), path
    raise ModelLoadError(f"{folder} has no image tokenizer checkpoint: put Chameleon's {VQGAN_CHECKPOINT} (with "
                         f"vqgan.yaml) in the folder or in chameleon/ for Lumina-mGPT 1, or {MOVQGAN_CHECKPOINT} in "
                         "the folder or in movqgan/ for Lumina-mGPT 2.0")


def _tokenizer(folder: Path, variant: Variant) -> TextTokenizer:
    places = TOKENIZER_PLACES if variant is LUMINA_1 else TOKENIZER_PLACES[:1]
    for place, name in places:
        if (folder / place / name).is_file():
            return TextTokenizer(folder / place, name)
    wanted = "tokenizer.json (or Chameleon's text_tokenizer.json in the folder or in chameleon/)" \
        if variant is LUMINA_1 else "tokenizer.json"
    raise ModelLoadError(f"{folder} has no text tokenizer: expected {wanted}")


def _resolution(folder: Path, variant: Variant) -> int:
    """Pixels per side, from the folder name as the repositories spell it (…-512, …-768-Omni, …-1024)."""
    numbers = [int(n) for n in re.findall(r"(?:^|[-_])(\d{2,4})(?=[-_]|$)", folder.name)]
    sizes = [n for n in numbers if n % GRID_CELL == 0 and n >= GRID_CELL]
    if sizes:
        return sizes[-1]
    if variant.default_resolution is not None:
        return variant.default_resolution
    raise ModelLoadError(f"cannot tell the resolution of {folder}: keep the repository's name, which ends in "
                         "the resolution (Lumina-mGPT-7B-512, -768, -768-Omni or -1024)")


def _bos(tokenizer: TextTokenizer, variant: Variant) -> int:
    """The prompt's first token.

    Lumina-mGPT 1: Chameleon's <s> (id 0, not config.json's bos_token_id 1).  2.0, by its authors' tokenizer
    wrapper: the BOS the tokenizer files name, or, when they name none (Qwen-style vocabularies), their EOS.
    """
    if variant is LUMINA_1:
        return tokenizer.special_id("bos_token", BOS)
    for role in ("bos_token", "eos_token"):
        name = tokenizer.special_name(role)
        if name is not None:
            return tokenizer.token_id(name)
    raise ModelLoadError("the tokenizer files (tokenizer_config.json, special_tokens_map.json) name neither a "
                         "bos_token nor an eos_token, which start Lumina-mGPT 2.0's prompts; download them again")


def _code_ids(tokenizer: TextTokenizer, variant: Variant, codebook_size: int, vocab_size: int,
              folder: Path) -> torch.Tensor:
    """The token id of each image code, in code order."""
    if variant is not LUMINA_1:
        ids = torch.arange(MOVQ_CODE_OFFSET, MOVQ_CODE_OFFSET + codebook_size)
    else:
        code_to_id: dict[int, int] = {}
        for token, token_id in tokenizer.vocabulary().items():
            match = IMAGE_TOKEN.match(token)
            if match:
                code_to_id[int(match.group(1).translate(str.maketrans("ABCDEFGHIJ", "0123456789")))] = token_id
        if sorted(code_to_id) != list(range(codebook_size)):
            raise ModelLoadError(f"{folder}: the tokenizer has {len(code_to_id)} image tokens (IMGIMG...) but the "
                                 f"VQGAN has {codebook_size} codes; the tokenizer and vqgan.ckpt do not belong "
                                 "together")
        ids = torch.tensor([code_to_id[code] for code in range(codebook_size)])
    if int(ids.max()) >= vocab_size:
        raise ModelLoadError(f"{folder}: image code ids reach {int(ids.max())} but config.json's vocabulary has "
                             f"{vocab_size} entries; the image tokenizer does not belong to this model")
    return ids


def _vocab_size(config: dict[str, Any], folder: Path) -> int:
    """config.json's vocab_size for checking the code ids: transformers' default where it is left out or null."""
    vocab_size = config.get("vocab_size")
    if vocab_size is None:
        from transformers import ChameleonConfig

        return ChameleonConfig().vocab_size
    return positive_int(vocab_size, "vocab_size", folder / "config.json")


def _shard_files(folder: Path) -> list[Path]:
    """The weight shards the index names (all *.safetensors without an index); pickles are never opened."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = [folder / name for name in sorted(set((read_json(index).get("weight_map") or {}).values()))]
        missing = [path.name for path in shards if not path.is_file()]
        if missing:
            raise ModelLoadError(f"{folder} lacks weight shards {', '.join(missing)}; download them again")
    else:
        shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES and p.name != VQGAN_CHECKPOINT
                         and p.name != MOVQGAN_CHECKPOINT)
        found = f"only pickled weights ({', '.join(pickles)}), which are not loaded for safety" if pickles \
            else "no *.safetensors weights"
        raise ModelLoadError(f"{folder} has {found}; {HINT}")
    return shards


def _checkpoint_plan(folder: Path, expected: dict[str, torch.Size], heads: dict[str, int]
                     ) -> dict[str, tuple[Path, int]]:
    """From the safetensors headers: each expected tensor's file and how often to repeat its rows.

    `heads` maps q/k-norm keys to the heads they cover: their stored rows (one per
    model-parallel shard) are repeated over the heads of each shard.
    """
    from safetensors import safe_open

    plan: dict[str, tuple[Path, int]] = {}
    unexpected: list[str] = []
    for path in _shard_files(folder):
        try:
            handle = safe_open(str(path), framework="pt")
        except Exception as err:  # SafetensorError for truncated or corrupt headers
            raise ModelLoadError(f"{path} is not a readable safetensors file ({err}); it may be truncated: "
                                 "download it again") from err
        with handle:
            for key in handle.keys():
                if key.startswith(UNUSED_PREFIXES) or key.endswith(UNUSED_SUFFIXES):
                    continue
                if key not in expected:
                    unexpected.append(key)
                    continue
                shape, want = tuple(handle.get_slice(key).get_shape()), tuple(expected[key])
                repeat = 1
                if key in heads and len(shape) == 2 and shape[1:] == want[1:] and shape[0] and \
                        heads[key] % shape[0] == 0:
                    repeat = heads[key] // shape[0]
                if (shape[0] * repeat, *shape[1:]) != want:
                    raise ModelLoadError(f"{path}: {key} has shape {list(shape)} where config.json implies "
                                         f"{list(want)}; the folder may mix files of different models")
                plan[key] = (path, repeat)
    missing = sorted(set(expected) - set(plan))
    if missing or unexpected:
        raise ModelLoadError(f"{folder}: the weights do not match config.json (missing {missing[:4]}, unexpected "
                             f"{sorted(unexpected)[:4]}); {HINT}")
    return plan


def _read_network(folder: Path, dtype: torch.dtype, precision: str) -> torch.nn.Module:
    """ChameleonForConditionalGeneration with every weight from the shards, q/k norms expanded to one row per head,
    read tensor by tensor and the backbone's linear layers quantised to `precision` as they arrive."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    config = ChameleonConfig.from_pretrained(str(folder))
    if config.vocabulary_map is None:  # only used to encode input images, which generation never does
        config.vocabulary_map = {}
    config._attn_implementation = "sdpa"
    with parameters_on_meta():
        net = ChameleonForConditionalGeneration(config)
    del net.model.vqmodel  # the image encoder: no published weights, never called here (see UNUSED_PREFIXES)
    expected = {key: value.shape for key, value in net.state_dict().items()}
    heads = {}
    for key in expected:
        if ".self_attn.q_norm." in key:
            heads[key] = config.num_attention_heads
        elif ".self_attn.k_norm." in key:
            heads[key] = config.num_key_value_heads
    plan = _checkpoint_plan(folder, expected, heads)  # every expected tensor is there, in the expected shape
    from safetensors import safe_open

    for path in sorted({path for path, _ in plan.values()}):
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():
                if key in plan:
                    tensor, repeat = handle.get_tensor(key), plan[key][1]
                    tensor = tensor if repeat == 1 else tensor.repeat_interleave(repeat, dim=0)
                    assign_quantizing(net, key, tensor, "model", precision, dtype)
    return net.eval().requires_grad_(False)


def load(folder: Path, device: torch.device, dtype: torch.dtype, quantize: str = "none") -> LuminaModel:
    """Load a Lumina-mGPT 1 or 2.0 folder onto `device`, computing in `dtype`, the backbone's linear layers at
    `quantize` precision (quantize.PRECISIONS)."""
    folder = Path(folder)
    if dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        raise ValueError(f"dtype must be float32, bfloat16, float16 (or float64 for tests), got {dtype}")
    config = read_json(folder / "config.json") if (folder / "config.json").is_file() else {}
    if config.get("model_type") != MODEL_TYPE:
        raise ModelLoadError(f"{folder / 'config.json'} is missing or not of model_type {MODEL_TYPE!r}; {HINT}")
    variant, vq_path = _variant(folder)
    tokenizer = _tokenizer(folder, variant)
    resolution = _resolution(folder, variant)
    vq = load_chameleon_vqgan(vq_path) if variant is LUMINA_1 else load_movqgan(vq_path)
    code_ids = _code_ids(tokenizer, variant, vq.spec.codebook_size, _vocab_size(config, folder), folder)
    bos = _bos(tokenizer, variant)
    def build() -> LuminaModel:
        net = _read_network(folder, dtype, quantize)  # quantised while reading: never whole in `dtype`
        model = LuminaModel(net, vq.to(variant.vq_dtype or dtype), tokenizer, code_ids, variant, resolution, bos,
                            vq_path)
        quantize_then_move(model.module, net.model, "none", dtype, device)
        return model

    model = load_or_refuse(build, folder, "Lumina-mGPT", HINT)
    return model

