"""Emu3.5 and Emu3.5-Image (BAAI, 34B) over the project's row-cache network, with its IBQ image tokenizer.

Sequence layout for a grid of H x W codes (1024 px square: H = W = 64, 4160 image positions)::

    BOS template(question) <|extra_100|> <|image start|> "H*W" <|image token|> | H rows of W codes, EOL between | EOI
    ------------------------------- prompt ---------------------------------   ------ generated: H * (W + 1) ------

Each rule, with the authors' file it comes from (github.com/baaivision/Emu3.5):
- prompts (configs/example_config_t2i.py, build_unc_and_template; inference.py): the cond prompt is the t2i
  template around the question, a BOS put first if the template did not start with it; the uncond prompt is the
  template with an empty question and no task name.  Both are tokenised whole (special surface forms are ids).
- the image header (src/utils/logits_processor.py): with a target size the authors force "H*W" (the tokenizer's
  digits) and <|image token|> after <|image start|>, in both branches; here they are prompt tokens, so they cost no
  call.  The model writes <|image start|> itself after the prompt in the authors' loop (a text step); an image
  generator starts at it, so it ends the prompt here.
- the cells (logits_processor.py, in_image_logits_processor): offset k = 1.. after <|image token|> is EOI at
  k = H (W + 1), EOL at every other multiple of W + 1 (so no EOL after the last row), a visual code otherwise.
  EOL / EOI are forced (`forced_tokens`): no guidance, no call of their own.
- guidance (logits_processor.py, apply_cfg "no_text"): cfg * (log_softmax(c) - log_softmax(u)) + log_softmax(u)
  over the whole vocabulary, then only the visual ids (151854 on) stay.  The two log-normalisers are one constant
  per position, which the softmax and top-k that follow ignore: this is u + cfg (c - u) on the visual logits, what
  `sampling.to_probs` computes (tests/test_emu3p5.py checks the two against each other).  The uncond branch has
  its own cache and sees the same image tokens (update_unconditional_context).
- sampling (configs/example_config_t2i.py sampling_params; logits_processor.py apply_differential_topk): image
  temperature 1, top-k 5120 (10240 in configs/config.py for the base Emu3.5), top-p 1, after the guidance; CFG 5
  for Emu3.5-Image, 2 for Emu3.5 (the configs' comments).
- X2I (configs/example_config_x2i.py build_unc_and_template with use_image; inference.py; src/utils/input_utils.py):
  the "x2i task" template with <|IMAGE|> before the question, the uncond prompt with <|IMAGE|> and no question; each
  reference image (at most 3) is stretched to about image_area pixels (1024 x 1024 there) at its aspect, each side
  a multiple of 16 (smart_resize: Pillow's bicubic on the 8-bit picture, no crop), encoded, and written as
  <|image start|> "h*w" <|image token|>, its rows of codes with EOL between, <|image end|> in place of <|IMAGE|> in
  both prompts.  The output: the size asked where one was (their target_height / target_width), else the last
  reference's grid, which their processor reads from the uncond prompt (parse_hw) and forces.
- the network (src/emu3p5/modeling_emu3.py): a Llama-style decoder with a per-head RMSNorm on queries and keys
  before the rotary embedding (its flash-attention and eager paths; its SDPA class leaves the norms out), SwiGLU,
  untied head: transformers' Qwen3 layer, whose parameter names are the checkpoint's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from ..sessions.cfg_session import CFGSession, cfg_prefix, check_positions
from ..weights.checkpoints import ModelLoadError
from ..sessions.code_rows import code_cells, forced_tokens, with_row_ends
from ..sessions.kept_rows import KeptRows, KeptSession
from ..family import Family
from .emu3p5_header import SizeMask
from ..weights.generation_only import code_rows_head
from ..weights.hf_folders import check_safetensors_weights
from ..tokenizers.ibq import CONFIG as VQ_CONFIG
from ..tokenizers.ibq import IBQTokenizer
from ..tokenizers.taming_tiles import decode_tiles
from ..weights.quantize import quantize_then_move
from ..sessions.row_attention import RowAttentionBackbone, attention_layer
from ..sessions.row_session import RowSession
from ..weights.streaming import HFNetwork, read_hf_network
from ..text.tiktoken_bpe import TiktokenBPE, read_ranks
from ..weights.tokenizer_files import read_json, without_nulls
from ...images.image_input import check_images, log_note, prepare_images
from ...compiled.compilable import Compilable
from ...model import check_start, check_tokens, compute_device

MODEL_TYPE = "emu3"  # config.json spells it "Emu3", as the original Emu3-Gen layout does
FAMILY = Family(
    label="Emu3.5",
    holds="an Emu3.5 folder (BAAI/Emu3.5-Image or BAAI/Emu3.5: config.json of model_type 'Emu3' with q/k-norm "
          "weights, emu3.tiktoken, and the BAAI/Emu3.5-VisionTokenizer folder inside it)",
    downloads=(("emu3.5", "BAAI/Emu3.5-Image (or BAAI/Emu3.5), with BAAI/Emu3.5-VisionTokenizer in its "
                          "vision_tokenizer/ folder and the authors' src/tokenizer_emu3_ibq/ files beside "
                          "config.json"),),
    roots=("Emu3.5",), cfg="Emu3.5-Image 5, Emu3.5 2", sizes=("Emu3.5 (any aspect, 16 px steps)",),
    compile=True, image_tasks=("x2i",))
HINT = ("an Emu3.5 folder holds BAAI/Emu3.5-Image (or BAAI/Emu3.5), the authors' tokenizer files "
        "(emu3.tiktoken, emu3_vision_tokens.txt) and BAAI/Emu3.5-VisionTokenizer in vision_tokenizer/")
TOKENIZER_FILES = ("emu3.tiktoken", "emu3_vision_tokens.txt")
TOKENIZER_SOURCE = "src/tokenizer_emu3_ibq/ of github.com/baaivision/Emu3.5"
# Special tokens follow the mergeable ranks: <|endoftext|>, <|im_start|>, <|im_end|>, <|extra_0..204|>, then the
# lines of emu3_vision_tokens.txt (tokenization_emu3.py); ids in the published model: 151643 on.
BASE_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", *(f"<|extra_{i}|>" for i in range(205)))
BOS, BSS, EOL = "<|extra_203|>", "<|extra_100|>", "<|extra_200|>"
IMAGE_TOKEN, IMAGE_START, IMAGE_END = "<|image token|>", "<|image start|>", "<|image end|>"
VISUAL_TOKEN = "<|visual token {:06d}|>"
# config.json fields that name special ids (configuration_emu3.py), checked against the tokenizer files
CONFIG_IDS = {"bos_token_id": BOS, "img_token_id": IMAGE_TOKEN, "boi_token_id": IMAGE_START,
              "eoi_token_id": IMAGE_END, "eol_token_id": EOL}
TEMPLATE = "<|extra_203|>You are a helpful assistant for t2i task. USER: {question} ASSISTANT: <|extra_100|>"
UNCOND_PROMPT = "<|extra_203|>You are a helpful assistant. USER:  ASSISTANT: <|extra_100|>"
X2I = "x2i"
# the X2I prompts split where the reference images go (<|IMAGE|> in the authors' template)
X2I_TEMPLATE = ("<|extra_203|>You are a helpful assistant for x2i task. USER: ", "{question} ASSISTANT: <|extra_100|>")
X2I_UNCOND = ("<|extra_203|>You are a helpful assistant. USER: ", " ASSISTANT: <|extra_100|>")
REFERENCE_AREA = 1024 * 1024  # pixels of a reference image (example_config_x2i.py image_area)
MAX_REFERENCES = 3
DOWNSAMPLE = 16
DEFAULT_SIZE = (64, 64)  # the authors' "1:1" (example_config_t2i.py aspect_ratios): 1024 x 1024 px
# (cfg, image top-k) of each checkpoint (configs/example_config_t2i.py, configs/config.py)
IMAGE_MODEL, BASE_MODEL = (5.0, 5120), (2.0, 10240)
VISION_FOLDERS = ("vision_tokenizer", "VisionTokenizer", "Emu3.5-VisionTokenizer")
CACHE_TOKENS = 128 + 64 * 65  # a prompt and a 1024 px image (memory estimates)
# Decoding in tiles (taming_tiles): auto (0) decodes whole up to 64 x 64 codes (the default 1024 x 1024 px, and
# other aspects of that area), in tiles of 512 px (32 codes; ComfyUI's VAEDecodeTiled default) above
AUTO_TILE, TILE_ABOVE, DEFAULT_TILE = 0, 64 * 64, 512


@dataclass(frozen=True)
class Emu3p5Prompt:
    """Token ids of the cond and uncond prompts (each ending with the image header) and the grid they ask for."""

    cond: tuple[int, ...]
    uncond: tuple[int, ...]
    size: tuple[int, int]
    question: str = ""
    references: tuple[tuple[int, ...], ...] = ()  # each reference image's ids, <|image start|> to <|image end|>
    size_asked: bool = True  # False: no width / height given, so X2I takes the last reference's grid
    kept: Optional[KeptRows] = None  # a story's cache rows, holding a start of cond and uncond (emu3p5_story)


class Emu3p5Tokenizer:
    """The authors' text tokenizer from its two files: the BPE ranks and the vision tokens listed after the
    specials."""

    def __init__(self, folder: Path) -> None:
        missing = [name for name in TOKENIZER_FILES if not (folder / name).is_file()]
        if missing:
            raise ModelLoadError(f"{folder} lacks {' and '.join(missing)}: copy them from {TOKENIZER_SOURCE}")
        ranks = read_ranks(folder / TOKENIZER_FILES[0])
        vision = [line.strip() for line in (folder / TOKENIZER_FILES[1]).read_text(encoding="utf-8").splitlines()
                  if line.strip()]
        start = max(ranks.values()) + 1
        self.ids = {token: start + i for i, token in enumerate((*BASE_SPECIALS, *vision))}
        self.bpe = TiktokenBPE(ranks, self.ids)
        codes = [self.ids.get(VISUAL_TOKEN.format(code)) for code in range(len(vision))]
        self.code_ids = torch.tensor([i for i in codes if i is not None], dtype=torch.long)
        if not self.code_ids.numel() or IMAGE_TOKEN not in self.ids:
            raise ModelLoadError(f"{folder / TOKENIZER_FILES[1]} lists no {VISUAL_TOKEN.format(0)} or no "
                                 f"{IMAGE_TOKEN}: copy it again from {TOKENIZER_SOURCE}")

    def encode(self, text: str) -> list[int]:
        return self.bpe.encode(text)


def checkpoint_kind(folder: Path) -> tuple[float, int]:
    """(CFG, image top-k) the authors recommend for the checkpoint in `folder`: Emu3.5-Image's where the folder's
    name says "image", else the base Emu3.5's."""
    return IMAGE_MODEL if "image" in folder.name.lower() else BASE_MODEL


def reference_size(width: int, height: int, area: int = REFERENCE_AREA) -> tuple[int, int]:
    """(height, width) in pixels a reference image of width x height is stretched to: about `area` pixels at its
    aspect, each side rounded to the nearest multiple of 16 (the authors' smart_resize).  An aspect so extreme
    that a side rounds to no code is refused (their resize would fail on it)."""
    aspect = width / height
    new_height = int((area / aspect) ** 0.5)
    new_width = int(new_height * aspect)
    if min(new_height, new_width) < DOWNSAMPLE // 2:
        raise ValueError(f"the reference image is {width} x {height} px: at about {area} px its shorter side "
                         f"rounds to no {DOWNSAMPLE} px code; crop it to a less extreme aspect")
    return tuple(codes_along(side) * DOWNSAMPLE for side in (new_height, new_width))


def codes_along(pixels: int) -> int:
    """16 px codes nearest `pixels`, halves rounded up (smart_resize's rounding; Python's round would take 1000 px
    to 62 codes, not 63), at least one."""
    return max(1, (pixels + DOWNSAMPLE // 2) // DOWNSAMPLE)


def decoding_tile(rows: int, cols: int, tile_size: int = AUTO_TILE) -> Optional[int]:
    """Pixels a side of the tiles a rows x cols grid decodes in, None for whole: `tile_size` (at least
    DOWNSAMPLE), whole when one tile covers the image; AUTO_TILE: DEFAULT_TILE above TILE_ABOVE codes."""
    whole_number = isinstance(tile_size, int) and not isinstance(tile_size, bool)
    if not whole_number or not (tile_size == AUTO_TILE or tile_size >= DOWNSAMPLE):
        raise ValueError(f"tile_size must be 0 (auto: whole up to {TILE_ABOVE} codes, tiles of {DEFAULT_TILE} px "
                         f"above) or a tile side of at least {DOWNSAMPLE} px, got {tile_size!r}")
    if tile_size == AUTO_TILE:
        return DEFAULT_TILE if rows * cols > TILE_ABOVE else None
    return tile_size if tile_size < max(rows, cols) * DOWNSAMPLE else None


def grid_for(width: int, height: int) -> tuple[int, int]:
    """(rows, cols) of 16 px codes nearest width x height pixels."""
    if not all(isinstance(side, int) and side >= DOWNSAMPLE // 2 for side in (width, height)):
        raise ValueError(f"width and height must be pixel counts of at least {DOWNSAMPLE // 2} (Emu3.5 draws "
                         f"{DOWNSAMPLE} px codes), got {width} x {height}")
    return codes_along(height), codes_along(width)


class Emu3p5Model(Compilable):
    """A loaded Emu3.5: TokenModel for the engine, plus encode/decode for prompts and pixels."""

    layer_step = staticmethod(attention_layer)
    family = "emu3p5"
    default_temperature = 1.0
    image_tasks = (X2I,)
    reference_area = REFERENCE_AREA
    decodes_in_tiles = True  # `decode` takes tile_size (the decode node's setting)

    def __init__(self, module: torch.nn.Module, tokenizer: Emu3p5Tokenizer, vq: IBQTokenizer,
                 recommended: tuple[float, int] = IMAGE_MODEL) -> None:
        self.module, self._tokenizer, self.vq = module, tokenizer, vq
        self.default_cfg_scale, self.default_top_k = recommended
        self.code_ids = tokenizer.code_ids
        self.vocab_size = self.code_ids.numel()
        ids = tokenizer.ids
        self.size_mask = SizeMask.for_tokenizer(tokenizer.encode, ids[IMAGE_TOKEN])
        if recommended == BASE_MODEL:  # the base model writes text too (emu3p5_story): its rows before the codes
            module.text_head = module.size_head = code_rows_head(module.lm_head, torch.arange(int(self.code_ids[0])))
        else:  # Emu3.5-Image keeps the rows up to its size digits and '*' (emu3p5_auto: the model's own size)
            module.size_head = code_rows_head(module.lm_head, torch.arange(max(self.size_mask.characters) + 1))
        # generation samples only the visual rows of lm_head: the others are freed
        module.lm_head = code_rows_head(module.lm_head, self.code_ids)
        self._code_of = torch.zeros(module.config.vocab_size, dtype=torch.long)
        self._code_of[self.code_ids] = torch.arange(self.vocab_size)  # id -> code; non-code ids decode as code 0
        self._image_start, self._image_token, self._image_end, self._row_end = (
            ids[t] for t in (IMAGE_START, IMAGE_TOKEN, IMAGE_END, EOL))
        self._bos = ids[BOS]
        self.forget_image_size()

    @property
    def device(self) -> torch.device:
        return compute_device(self, next(self.module.parameters()))

    def set_image_size(self, width: int, height: int) -> None:
        """About width x height pixels (each side rounded to 16 px codes) from the next encode on."""
        self._set_grid(*grid_for(width, height))
        self._size_asked = True

    def forget_image_size(self) -> None:
        """No size asked (width and height 0): from the next encode on, text-to-image at DEFAULT_SIZE and X2I at
        the last reference image's grid, as the authors' processor forces it (parse_hw)."""
        self._set_grid(*DEFAULT_SIZE)
        self._size_asked = False

    def _set_grid(self, rows: int, cols: int) -> None:
        self.size = (rows, cols)
        self.grid = (rows, cols + 1)  # the row-end column included, so `above` lands on the same column
        self.num_tokens = rows * (cols + 1)
        self.forced_tokens = forced_tokens(rows, cols, self._row_end, (self._image_end,), last_row_end=False)
        self.image_shape = (rows * DOWNSAMPLE, cols * DOWNSAMPLE)

    def encode(self, prompt: str, negative_prompt: Optional[str] = None) -> Emu3p5Prompt:
        """The authors' t2i prompts for the current size; their uncond prompt has no text, so a negative prompt
        is refused rather than ignored."""
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
        if negative_prompt:
            raise ValueError("Emu3.5 takes no negative prompt (its uncond branch is the template without a "
                             "question); leave it empty")
        return self._prompt(prompt, (), self._size_asked)

    def _prompt(self, question: str, references: tuple[tuple[int, ...], ...], size_asked: bool) -> Emu3p5Prompt:
        encode = self._tokenizer.encode
        if references:
            images = [token for reference in references for token in reference]
            cond = [*encode(X2I_TEMPLATE[0]), *images, *encode(X2I_TEMPLATE[1].format(question=question))]
            uncond = [*encode(X2I_UNCOND[0]), *images, *encode(X2I_UNCOND[1])]
        else:
            cond, uncond = encode(TEMPLATE.format(question=question)), encode(UNCOND_PROMPT)
        if cond[0] != self._bos:  # inference.py puts a BOS first when the template did not
            cond.insert(0, self._bos)
        return Emu3p5Prompt(cond=self._with_header(cond), uncond=self._with_header(uncond), size=self.size,
                            question=question, references=references, size_asked=size_asked)

    def _with_header(self, ids: list[int], size: Optional[tuple[int, int]] = None) -> tuple[int, ...]:
        rows, cols = size or self.size
        return (*ids, self._image_start, *self._tokenizer.encode(f"{rows}*{cols}"), self._image_token)

    def add_image(self, cond: Emu3p5Prompt, images: Any, task: str) -> Emu3p5Prompt:
        """X2I: `cond`'s question with one more reference image (a ComfyUI IMAGE of one picture, (1, H, W, 3) in
        0..1) in the authors' x2i prompts, at most MAX_REFERENCES; the output at `cond`'s size where one was
        asked, else at this (the last) reference's grid, as the authors' processor forces it."""
        if task != X2I:
            raise ValueError(f"task {task!r} is not one Emu3.5 takes: it takes {X2I} (reference images)")
        check_start(cond, Emu3p5Prompt, "Emu3p5Model.encode()", 1)
        if len(cond.references) >= MAX_REFERENCES:
            raise ValueError(f"this conditioning already holds {MAX_REFERENCES} reference images, the most the "
                             "authors give Emu3.5")
        images = check_images(images)
        if images.shape[0] != 1:
            raise ValueError(f"give one reference image per SCD Image Prompt (chain up to {MAX_REFERENCES}), got a "
                             f"batch of {images.shape[0]}")
        reference, grid = self.reference_ids(images, self.reference_area)
        self._set_grid(*(cond.size if cond.size_asked else grid))
        return self._prompt(cond.question, (*cond.references, reference), cond.size_asked)

    def reference_ids(self, images: torch.Tensor, area: int) -> tuple[tuple[int, ...], tuple[int, int]]:
        """One checked image's (a (1, H, W, 3) IMAGE) tokens as the prompt holds them (the header at its own size,
        its rows, EOL between) and its grid (rows, cols): stretched to about `area` px as smart_resize does it
        (Pillow's bicubic on the 8-bit picture)."""
        if min(images.shape[1:3]) < DOWNSAMPLE:  # less than one code of picture: surely not the image meant
            raise ValueError(f"the reference image is {images.shape[2]} x {images.shape[1]} px: give one of at "
                             f"least {DOWNSAMPLE} x {DOWNSAMPLE} px (Emu3.5 draws {DOWNSAMPLE} px codes)")
        height, width = reference_size(images.shape[2], images.shape[1], area)
        prepared = prepare_images(images, (height, width), "stretch")
        log_note(prepared)
        encoder = self.vq.encoder().to(self.vq.decoder.post_quant_conv.weight.device)
        rows, cols = height // DOWNSAMPLE, width // DOWNSAMPLE
        codes = self.code_ids[encoder.encode(prepared.pixels).cpu()].view(rows, cols)
        body = with_row_ends(codes[None], self._row_end)[0, :-1]  # no EOL after the last row
        return (*self._with_header([], (rows, cols)), *body.tolist(), self._image_end), (rows, cols)

    def start(self, cond: Emu3p5Prompt, batch_size: int) -> RowSession:
        check_start(cond, Emu3p5Prompt, "Emu3p5Model.encode()", batch_size)
        if cond.size != self.size:  # the size the prompt was encoded for wins
            self._set_grid(*cond.size)
        check_positions(cond.cond, cond.uncond, self.num_tokens, self.module.config.max_position_embeddings,
                        "ask for a smaller image")
        if cond.kept is not None:  # the session feeds the rows only what they lack
            return KeptSession(cond.kept, (cond.cond, cond.uncond), self.num_tokens, self.module.lm_head)
        prefix, mask = cfg_prefix(cond.cond, cond.uncond, self._bos, batch_size, self.device)
        net = self.module
        return CFGSession(prefix, mask, self.num_tokens,
                          backbone=lambda cache: RowAttentionBackbone(net.model, cache, self.compiled_layer),
                          embed_prefix=net.get_input_embeddings(), embed_image=net.get_input_embeddings(),
                          head=net.lm_head, static_shapes=self.compiled)

    def code_grid(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, num_tokens) -> codes (batch, rows * cols), the row-end column dropped."""
        check_tokens(tokens, self.num_tokens, self._code_of.numel())
        rows, cols = self.size
        return self._code_of[code_cells(tokens.cpu(), rows, cols).flatten(1)]

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, tile_size: int = AUTO_TILE) -> torch.Tensor:
        """Token ids (batch, num_tokens) to float32 CPU images (batch, H, W, 3) in 0..1 via the IBQ decoder, in
        tiles of `tile_size` pixels a side (`decoding_tile`; taming_tiles: the whole decode's pixels up to float32
        rounding, a bounded part of it on the compute device)."""
        rows, cols = self.size
        tile = decoding_tile(rows, cols, tile_size)
        decoder = self.vq.decoder
        codes = self.code_grid(tokens).to(decoder.post_quant_conv.weight.device)
        images = decode_tiles(decoder, codes, rows, cols, tile) if tile else decoder.decode(codes, rows, cols)
        return ((images.float() + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1).cpu()


class Emu3p5ConfigReader:
    """`read_hf_network`'s config class: config.json as transformers' Qwen3Config (the same layer)."""

    @staticmethod
    def from_pretrained(folder: str) -> Any:
        from transformers import Qwen3Config

        path = Path(folder) / "config.json"
        config = without_nulls(read_json(path))
        if config.get("rope_scaling"):
            raise ModelLoadError(f"{path} asks for rope_scaling {config['rope_scaling']}, which this loader does "
                                 "not implement")
        names = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
                 "pad_token_id", "bos_token_id", "eos_token_id")
        # configuration_emu3.py's defaults for what config.json leaves out
        defaults = dict(num_key_value_heads=8, head_dim=128, max_position_embeddings=9216, rms_norm_eps=1e-5,
                        rope_theta=1_000_000.0)
        fields = {name: config.get(name, defaults.get(name)) for name in names if name in config or name in defaults}
        # rope_theta, not rope_parameters: transformers 4.x stores and ignores the latter (theta stays 10000);
        # 5.x maps rope_theta into rope_parameters.  No sliding window (4.x keeps its unused 4096 and warns).
        return Qwen3Config(**fields, tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0,
                           rope_theta=config.get("rope_theta", defaults["rope_theta"]), sliding_window=None)


def _has_qk_norm(folder: Path) -> bool:
    """Whether the folder's weights hold per-head query norms (Emu3.5 does, the original Emu3-Gen does not)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = (read_json(index).get("weight_map") or {}).keys()
    else:
        from safetensors import SafetensorError, safe_open

        shards = sorted(folder.glob("*.safetensors"))
        try:
            with safe_open(str(shards[0]), framework="pt") as handle:
                names = list(handle.keys())
        except (IndexError, SafetensorError):  # no shard, or an unreadable one: the family that claims it explains
            return False
    return any(name.endswith("self_attn.q_norm.weight") for name in names)


def detect(folder: Path) -> bool:
    """An Emu3.5 folder: config.json of model_type "Emu3" whose weights carry q/k norms."""
    folder = Path(folder)
    path = folder / "config.json"
    try:
        return (path.is_file() and str(read_json(path).get("model_type")).lower() == MODEL_TYPE
                and _has_qk_norm(folder))
    except (ModelLoadError, OSError, ValueError):
        return False


def vision_folder(folder: Path) -> Path:
    """The VisionTokenizer folder: one of VISION_FOLDERS inside the model folder or beside it."""
    for place in (folder, folder.parent):
        for name in VISION_FOLDERS:
            if (place / name / VQ_CONFIG).is_file():
                return place / name
    raise ModelLoadError(f"{folder} has no VisionTokenizer: download BAAI/Emu3.5-VisionTokenizer (config.yaml, "
                         f"model.ckpt) into {folder / VISION_FOLDERS[0]}")


def load(folder: Path, device: torch.device, dtype: torch.dtype, quantize: str = "none") -> Emu3p5Model:
    """Load an Emu3.5 folder onto `device`, computing in `dtype`, the backbone's linear layers at `quantize`
    precision (quantize.PRECISIONS); the VQ decoder is float32 on the same device."""
    folder = Path(folder)
    if dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        raise ValueError(f"dtype must be float32, bfloat16, float16 (or float64 for tests), got {dtype}")
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"{folder} has no config.json: {HINT}")
    tokenizer = Emu3p5Tokenizer(folder)
    config = without_nulls(read_json(folder / "config.json"))
    for field, token in CONFIG_IDS.items():
        if field in config and config[field] != tokenizer.ids[token]:
            raise ModelLoadError(f"{folder}: config.json's {field} {config[field]} is not the tokenizer files' id "
                                 f"{tokenizer.ids[token]} of {token}; the folder mixes files of different models")
    vq = IBQTokenizer(vision_folder(folder))
    if vq.codebook_size != tokenizer.code_ids.numel():
        raise ModelLoadError(f"{vq.source} has {vq.codebook_size} codes where emu3_vision_tokens.txt lists "
                             f"{tokenizer.code_ids.numel()} visual tokens; the folder mixes different models")
    check_safetensors_weights(folder, HINT)
    from transformers import Qwen3ForCausalLM

    module = read_hf_network(folder, HFNetwork(Emu3p5ConfigReader, Qwen3ForCausalLM, (), "model", "Emu3.5", HINT),
                             dtype, quantize)
    model = Emu3p5Model(module, tokenizer, vq, checkpoint_kind(folder))  # slices lm_head
    quantize_then_move(model.module, module.model, "none", dtype, device)
    vq.decoder.to(device)
    return model
