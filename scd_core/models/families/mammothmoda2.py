"""MammothModa2 (ByteDance): Preview (Qwen2.5-VL-7B) and Dev (Qwen3-VL-8B) with generation experts.

The authors make an image in two stages: this module samples the first, a grid of visual tokens, at their law; the
second, a ~2B DiT over a fresh LLM re-encoding of the tokens, is `decode` (mammothmoda2_condition.py,
mammothmoda2_decode.py, mammothmoda2_dit.py), loaded on its first call.

Sequence layout for a grid of H x W codes (Preview's default 32 x 32: 1056 positions)::

    <|im_start|>system ... <|im_start|>assistant\\n <|image start|> "H*W" <|image token|> | H rows of (W codes, EOL)
    ----------------------------------- prompt ----------------------------------------   --- generated ---

Each rule, with the authors' file (github.com/bytedance/mammothmoda: branch qwen25vl, mammothmoda2/ = Preview; branch
main, mamoda2/mammothmoda2/ = Dev; "model/modeling_mammothmoda2.py" is under those) and line:
- the loop (modeling_mammothmoda2.py generate_t2i, Preview 240-315, Dev 279-364): `ar_height` rows of `ar_width + 1`
  steps; the last step of each row is overwritten by `eol_token_id` (Preview 309-310, Dev 358-359), so it is forced
  here (`forced_tokens`: no call of its own).  No end-of-image is sampled.
- the grid: generate_t2i's defaults, Preview 32 x 32 (245-246), Dev 16 x 16 (286-287; processing_mammothmoda2.py
  266-267 too); the Dev README passes 32 x 32 to the processor only, which does not forward it.  A setting here.
- guidance (utils/logits_processor.py 19-36, modeling 306-311 / 257-262): with cfg_scale > 1 the batch is [cond,
  uncond], the uncond row the same prompt with `attention_mask[uncond, :-10] = 0`: it sees its last 10 tokens at
  positions 0..9 (text positions are attention_mask.cumsum - 1), so here it is those 10 tokens, left-padded.
  uncond + (cond - uncond) * cfg_scale on raw float logits; generate_t2i's default 6.0 (Dev 288, Preview 247); the
  READMEs' cfg_scale=7.0 goes to the processor, where it only doubles the batch.
- the processors after it, in order (modeling Dev 312-322, Preview 263-273): repetition penalty (if set, not 1),
  temperature (if not 1), the scope, top-k (if not 0) and top-p (if < 1), each keeping at least 3 tokens; then
  multinomial, or argmax when do_sample is false.  Their values, the scope's ids and eol_token_id come from the
  folder's t2i_generation_config.json (modeling Dev 96-111: GenerationConfig.from_pretrained, so a key it leaves out
  takes transformers' default, top_k 50 and do_sample false among them).  A repetition penalty is not implemented
  here: a folder that sets one is refused.
- the scope (modeling Dev 292-293, Preview 251-252; logits_processor.py 39-52): ids below visual_token_start_id and
  from start + visual_token_end_id on are set to -inf; with the absolute end id that sum lies past the logits, so the
  authors sample every id from the start to the end of the logits (16,384 codes and the unused ids after them).
  Both are offered: "authors" (the default, their law) and "codes" ([start, end), open PR #32's fix).
- the network (mammothmoda2_qwen2_5_vl/modeling_*.py 633-891, mammothmoda2_qwen3_vl/modeling_*.py 394-609, 917-927,
  1425-1528): ids >= gen_vocab_start_index embed through gen_embed_tokens[id - start] and, in the layers moe_type
  names ("ffn" all, "ffn-a:b" layers a..b-1), run gen_mlp instead of mlp; logits are cat(lm_head, gen_head), and a
  sampled column is the id fed back.  Routing is by the input id (no learned router), so a window computes what
  single steps compute; here it is a torch.where, no host branch.  Preview's attention may be routed too
  ("attention" in moe_type): refused, not implemented.  Layers: transformers' Qwen2 (Preview, q/k/v biases) and
  Qwen3 (Dev, q/k norms); with no image in the prompt the multimodal rotary positions are one-dimensional.
- the prompt: the chat template's text (vLLM-Omni's reproduction, validated against the authors' images; the
  template itself was not read) with the size as "H*W" (visual_prompt.py 5, the authors' own image strings).
- the tokenizer (mammothmoda2_qwen*_vl/tokenization_*.py): mammothu.tiktoken's ranks, then specials from id 151643:
  <|endoftext|>, <|im_start|>, <|im_end|>, the Qwen specials (19 Preview, 23 Dev), 181 <|extra_i|>, the margins up
  to 152064 (218 Preview, 214 Dev), five generation tokens (<|endofline|> = 152064 first), then the lines of
  mammothu_vision_tokens.txt.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..family import Family
from ..generate_defaults import generate_sampling
from ..sessions.cfg_session import CFGSession, cfg_prefix, check_positions
from ..sessions.code_rows import code_cells, forced_tokens
from ..sessions.row_attention import RowAttentionBackbone
from ..text.tiktoken_bpe import TiktokenBPE, read_ranks
from ..weights.checkpoints import ModelLoadError
from ..weights.generation_only import code_rows_head
from ..weights.hf_folders import check_safetensors_weights
from ..weights.memory import MemoryEstimate, checkpoint_shapes, kl_vae_decode_bytes, weight_files
from ..weights.quantize import quantize_then_move
from ..weights.streaming import HFNetwork, read_hf_network
from ..weights.tokenizer_files import read_json, without_nulls
from ...model import check_start, check_tokens, compute_device
from .mammothmoda2_condition import (NEGATIVE_PROMPT, NEGATIVE_TEMPLATE, ConditionRule, condition_rule, for_dit,
                                     negative_condition, positive_condition)
from .mammothmoda2_decode import (DiTCondition, DiTSettings, MammothDecoder, denoise, latents_to_pixels,
                                  load_decoder)
from .mammothmoda2_memory import decoder_weights, staged_estimate
from .mammothmoda2_routing import routed_layer

MODEL_TYPE = "mammothmoda2"
FAMILY = Family(
    label="MammothModa2",
    holds="a MammothModa2 folder (bytedance-research/MammothModa2-Preview or -Dev: config.json of model_type "
          "'mammothmoda2', t2i_generation_config.json, mammothu.tiktoken, mammothu_vision_tokens.txt); its DiT "
          "decoder needs diffusers",
    downloads=(("mammoth", "bytedance-research/MammothModa2-Preview (or MammothModa2-Dev)"),),
    roots=("MammothModa2",), cfg="MammothModa2 6",
    top_k="MammothModa2 its t2i_generation_config.json's, else 50 (1 where it sets do_sample false); at least 3",
    top_p="MammothModa2 its t2i_generation_config.json's, if it sets one",
    temperature="MammothModa2 its t2i_generation_config.json's, if any",
    decoder="MammothModa2 50 steps, guidance 5 (the READMEs pass 9)")
HINT = ("a MammothModa2 folder holds bytedance-research/MammothModa2-Preview or -Dev as published: config.json, "
        "t2i_generation_config.json, mammothu.tiktoken, mammothu_vision_tokens.txt and the *.safetensors shards")
GENERATION_FILE = "t2i_generation_config.json"
TOKENIZER_FILES = ("mammothu.tiktoken", "mammothu_vision_tokens.txt")
SPECIAL_START = 151643  # tokenization_*.py SPECIAL_START_ID
QWEN_SPECIALS = ("<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                 "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
                 "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                 "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>",
                 "</think>")
GEN_SPECIALS = ("<|endofline|>", "<|endoffile|>", "<|gen_placeholder|>", "<|useless token|>", "<|beginoftext|>")
IMAGE_START, IMAGE_TOKEN, IMAGE_END = "<|image start|>", "<|image token|>", "<|image end|>"
TEMPLATE = ("<|im_start|>system\nYou are a helpful image generator.<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n"
            "<|im_start|>assistant\n")
UNCOND_TAIL = 10  # generate_t2i: attention_mask[uncond, :-10] = 0
SCOPES = ("authors", "codes")
DEFAULT_CFG = 6.0
DEFAULT_PIXELS = (512, 512)  # decode_diffusion_image's height and width (their READMEs pass 1024)
PREVIEW_PIXELS, PENDING_GRAY = 512, 0.5  # progress previews: a token map about this wide, pending cells gray
MIN_TOKENS_KEPT = 3  # TopKLogitsWarper / TopPLogitsWarper(min_tokens_to_keep=3)
CACHE_TOKENS = 256 + 64 * 65  # a prompt and a 64 x 64 grid (vLLM-Omni's at 1024 px)
# the DiT, VAE, condition refiner, image tokenizer, vision tower and text head: never read for the token stage
UNUSED_WEIGHTS = ("gen_transformer.", "gen_vae.", "gen_image_condition_refiner.", "gen_tokenizer.",
                  "llm_model.model.visual.", "llm_model.visual.", "llm_model.lm_head.")
RENAMES = (("llm_model.model.language_model.gen_embed_tokens.", "gen_embed_tokens."),
           ("llm_model.model.gen_embed_tokens.", "gen_embed_tokens."), ("llm_model.gen_head.", "gen_head."),
           ("llm_model.model.language_model.", "model."), ("llm_model.model.", "model."))


@dataclass(frozen=True)
class Variant:
    """One published checkpoint: its backbone's layers and the authors' branch for it."""

    label: str
    layers: str  # transformers' model type of its text layers
    grid: tuple[int, int]  # generate_t2i's default (rows, cols)
    qwen_specials: int  # how many of QWEN_SPECIALS its tokenizer lists
    branch: str


VARIANTS = {"mammothmoda2_qwen2_5_vl": Variant("MammothModa2-Preview", "qwen2", (32, 32), 19, "qwen25vl"),
            "mammothmoda2_qwen3_vl": Variant("MammothModa2-Dev", "qwen3", (16, 16), 23, "main")}


@dataclass(frozen=True)
class MammothPrompt:
    """Token ids of the cond prompt (ending with the image header), its 10-token uncond tail, the grid and the
    DiT's (height, width) in pixels."""

    cond: tuple[int, ...]
    uncond: tuple[int, ...]
    size: tuple[int, int]
    pixels: tuple[int, int] = DEFAULT_PIXELS


class MammothTokenizer:
    """The authors' tokenizer from its two files: the BPE ranks, then the specials from id 151643 on."""

    def __init__(self, folder: Path, variant: Variant) -> None:
        missing = [name for name in TOKENIZER_FILES if not (folder / name).is_file()]
        if missing:
            raise ModelLoadError(f"{folder} lacks {' and '.join(missing)}: {HINT}")
        ranks = read_ranks(folder / TOKENIZER_FILES[0])
        vision = [line.strip() for line in (folder / TOKENIZER_FILES[1]).read_text(encoding="utf-8").splitlines()
                  if line.strip()]
        margins = 152064 - SPECIAL_START - 3 - variant.qwen_specials - 181
        names = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", *QWEN_SPECIALS[:variant.qwen_specials],
                 *(f"<|extra_{i}|>" for i in range(181)), *(f"<|extra_margin_{i}|>" for i in range(margins)),
                 *GEN_SPECIALS, *vision)
        self.ids = {token: SPECIAL_START + i for i, token in enumerate(names)}
        absent = [name for name in (IMAGE_START, IMAGE_TOKEN, IMAGE_END) if name not in self.ids]
        if absent:
            raise ModelLoadError(f"{folder / TOKENIZER_FILES[1]} lists no {' or '.join(absent)}: {HINT}")
        self.bpe = TiktokenBPE(ranks, self.ids)

    def encode(self, text: str) -> list[int]:
        return self.bpe.encode(text)


@dataclass(frozen=True)
class T2IConfig:
    """What generate_t2i reads from t2i_generation_config.json."""

    start: int  # visual_token_start_id
    end: int  # visual_token_end_id (absolute, exclusive)
    eol: int
    do_sample: bool
    sampling: Any  # decoding.sampling.Sampling: temperature, top-k, top-p


def read_t2i_config(folder: Path) -> T2IConfig:
    """The folder's t2i_generation_config.json; a missing file or id, a do_sample other than true / false or a
    repetition penalty is one ModelLoadError."""
    path = folder / GENERATION_FILE
    if not path.is_file():
        raise ModelLoadError(f"{folder} has no {GENERATION_FILE} (the authors' sampling settings and visual ids); "
                             "download it with the checkpoint")
    saved = without_nulls(read_json(path))
    names = ("visual_token_start_id", "visual_token_end_id", "eol_token_id")
    absent = [name for name in names if not isinstance(saved.get(name), int)]
    if absent:
        raise ModelLoadError(f"{path} lacks {', '.join(absent)}; download it again")
    if not isinstance(saved.get("do_sample", False), bool):  # bool("false") would sample where the argmax is meant
        raise ModelLoadError(f"{path} sets do_sample {saved['do_sample']!r}; it must be true or false")
    if saved.get("repetition_penalty", 1.0) != 1.0:
        raise ModelLoadError(f"{path} sets repetition_penalty {saved['repetition_penalty']}, which this sampler does "
                             "not implement yet (it would change the authors' law)")
    start, end, eol = (saved[name] for name in names)
    sampling = generate_sampling(folder, {}, GENERATION_FILE)
    return T2IConfig(start, end, eol, bool(saved.get("do_sample", False)), sampling)


def expert_layers(moe_type: str, count: int) -> range:
    """The layers whose FFN is routed: moe_type "ffn" (all) or "ffn-a:b" (a..b-1), as the authors' moe_enable."""
    kind, _, span = str(moe_type).partition("-")
    if "attention" in kind:
        raise ModelLoadError(f"config.json's moe_type {moe_type!r} routes attention too, which this loader does not "
                             "implement (only the FFN experts)")
    if kind not in ("ffn", "none"):
        raise ModelLoadError(f"config.json's moe_type {moe_type!r} is not one the authors' code takes")
    if kind == "none":
        return range(0)
    start, _, end = span.partition(":")
    return range(int(start), min(int(end), count)) if span else range(count)


class MammothConfigReader:
    """`read_hf_network`'s config class: llm_config's text fields as transformers' Qwen2Config / Qwen3Config, with
    the generation experts' sizes attached."""

    @staticmethod
    def from_pretrained(folder: str) -> Any:
        from transformers import Qwen2Config, Qwen3Config

        config = without_nulls(read_json(Path(folder) / "config.json"))
        llm = without_nulls(config.get("llm_config") or {})
        text = {**llm, **without_nulls(llm.get("text_config") or {})}
        variant = variant_of(Path(folder), config)
        rope = text.get("rope_scaling") or {}
        if rope and rope.get("type", rope.get("rope_type")) not in ("mrope", "default"):
            raise ModelLoadError(f"{folder}: rope_scaling {rope} is not implemented here")
        names = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
                 "rope_theta")
        fields = {name: text[name] for name in names if name in text}
        made = (Qwen2Config if variant.layers == "qwen2" else Qwen3Config)(
            **fields, tie_word_embeddings=False, attention_dropout=0.0, use_sliding_window=False, sliding_window=None)
        made.gen_vocab_size = int(text.get("gen_vocab_size", 32800))
        made.gen_vocab_start_index = int(text.get("gen_vocab_start_index", 152064 if variant.layers == "qwen3"
                                                  else made.vocab_size))
        made.expert_layers = tuple(expert_layers(text.get("moe_type", "ffn"), made.num_hidden_layers))
        if not text.get("extra_gen_vocab", True):
            raise ModelLoadError(f"{folder}: llm_config has no extra generation vocabulary (extra_gen_vocab false); "
                                 "not a published MammothModa2 layout")
        return made


class MammothNetwork(nn.Module):
    """The text backbone (transformers' Qwen2 / Qwen3 model) with the generation embedding, head and FFN experts,
    under the checkpoint's names once RENAMES strip llm_model.model.language_model."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        from transformers import Qwen2Model, Qwen3Model

        self.model = (Qwen2Model if config.model_type == "qwen2" else Qwen3Model)(config)
        self.gen_embed_tokens = nn.Embedding(config.gen_vocab_size, config.hidden_size)
        self.gen_head = nn.Linear(config.hidden_size, config.gen_vocab_size, bias=False)
        for index in config.expert_layers:
            layer = self.model.layers[index]
            layer.gen_mlp = type(layer.mlp)(config)
        self.text_vocab, self.gen_start = config.vocab_size, config.gen_vocab_start_index

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """(rows, T) ids -> (rows, T, hidden + 1): the routed embeddings and, last, the route (1: generation)."""
        routed = ids >= self.gen_start
        text = self.model.embed_tokens(ids.clamp(max=self.text_vocab - 1))
        gen = self.gen_embed_tokens((ids - self.gen_start).clamp(min=0, max=self.gen_embed_tokens.num_embeddings - 1))
        return torch.cat([torch.where(routed[..., None], gen, text), routed[..., None].to(text.dtype)], dim=-1)

    def logits(self, count: int, hidden: torch.Tensor) -> torch.Tensor:
        """The scope's first `count` columns of cat(lm_head, gen_head) (`scope_head`, set at load) for `hidden`."""
        return F.linear(hidden, self.scope_head.weight[:count])


class RoutedBackbone:
    """The session's backbone: `embed`'s output (route last) through the layers over the row cache."""

    def __init__(self, net: MammothNetwork, cache: Any) -> None:
        self.net, self.cache = net, cache

    def __call__(self, inputs: torch.Tensor, branches: int = 1) -> torch.Tensor:
        route = inputs[..., -1:] > 0.5
        step = partial(routed_layer, route=route)
        return RowAttentionBackbone(self.net.model, self.cache, layer_step=step)(inputs[..., :-1], branches)


def check_grid(rows: Any, cols: Any) -> tuple[int, int]:
    if not all(isinstance(side, int) and not isinstance(side, bool) and side >= 1 for side in (rows, cols)):
        raise ValueError(f"the grid must be at least 1 x 1 codes, got {rows} x {cols}")
    return rows, cols


class MammothModa2Model:
    """A loaded MammothModa2: TokenModel for the engine, encode for prompts, decode through its DiT.  Decode
    settings: `decoding` (DiTSettings: steps, guidance, the starting noise's seed, cfg_range; `set_decoding`),
    `pixels` (height, width; set_image_size: each prompt keeps the size it was encoded at); a host's hooks:
    `decode_progress` (called (step, steps) after each DiT step) and `stage_switch` (called once the LLM's
    re-encodes are done, before the DiT's first step: a host that keeps the stages apart loads the decoder's there,
    and may offload the LLM)."""

    family = "mammothmoda2"
    default_cfg_scale = DEFAULT_CFG
    min_tokens_kept = MIN_TOKENS_KEPT
    default_decoding = DiTSettings()
    decodes_rows_alone = True  # each row's forwards and DiT run alone, the LLM's for every row first

    def __init__(self, module: MammothNetwork, tokenizer: MammothTokenizer, t2i: T2IConfig, variant: Variant,
                 folder: Path, config: dict) -> None:
        self.module, self._tokenizer, self.t2i, self.variant = module, tokenizer, t2i, variant
        self.folder, self.config = folder, config
        self.rule: ConditionRule = condition_rule(config, variant.layers == "qwen3")
        self._decoder: Optional[MammothDecoder] = None
        self._decoding: Optional[MammothPrompt] = None
        self.decoding, self.pixels = self.default_decoding, DEFAULT_PIXELS
        self.decode_progress: Optional[Callable[[int, int], None]] = None
        self.stage_switch: Optional[Callable[[], None]] = None
        self.label = variant.label
        sampling = t2i.sampling
        # do_sample false: the authors take the argmax of the processed scores, which top-k 1 keeps alone
        self.default_temperature, self.default_top_p = sampling.temperature, sampling.top_p
        self.default_top_k = sampling.top_k if t2i.do_sample else 1
        self.min_tokens_kept = MIN_TOKENS_KEPT if t2i.do_sample else 1
        columns = module.text_vocab + module.gen_head.out_features
        if not module.text_vocab <= t2i.start < t2i.end <= columns:
            raise ModelLoadError(f"{GENERATION_FILE}'s visual ids {t2i.start}..{t2i.end} do not lie in the generation "
                                 f"head's columns {module.text_vocab}..{columns}; the folder mixes different models")
        # every scope lies in gen_head's columns, its rows (column - text vocabulary); lm_head is never read.  The
        # "codes" scope is a prefix of the authors': the first rows of one sliced head.
        module.scope_head = code_rows_head(module.gen_head, torch.arange(t2i.start, columns) - module.text_vocab)
        del module.gen_head
        ids = tokenizer.ids
        self._image_start, self._image_token, self._image_end = ids[IMAGE_START], ids[IMAGE_TOKEN], ids[IMAGE_END]
        self._negative_ids = tuple(tokenizer.encode(NEGATIVE_TEMPLATE.format(prompt=NEGATIVE_PROMPT)))
        self.set_scope("authors")
        self.set_grid(*variant.grid)

    @property
    def device(self) -> torch.device:
        return compute_device(self, self.module.gen_embed_tokens.weight)

    def set_scope(self, scope: str) -> None:
        """Which ids are sampled: "authors" (their code: visual_token_start_id to the end of the logits) or "codes"
        (the 16,384 codes, visual_token_start_id .. visual_token_end_id, open PR #32)."""
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        count = self.t2i.end - self.t2i.start if scope == "codes" else self.module.scope_head.out_features
        self.scope, self.vocab_size = scope, count
        self.code_ids = torch.arange(self.t2i.start, self.t2i.start + count)

    def set_grid(self, rows: int, cols: int) -> None:
        """Sample `rows` x `cols` codes (generate_t2i's ar_height x ar_width) from the next encode on."""
        rows, cols = check_grid(rows, cols)
        self.size = (rows, cols)
        self.grid = (rows, cols + 1)  # the row-end column included, so `above` lands on the same column
        self.num_tokens = rows * (cols + 1)
        self.forced_tokens = forced_tokens(rows, cols, self.t2i.eol, ())

    def set_image_size(self, width: int, height: int) -> None:
        """The DiT's width x height pixels, and the grid for them: one code per 32 px (the authors' README samples
        32 x 32 codes for their 1024 px images).  Each side a multiple of 16: 8 pixels a latent, 2 x 2 patches."""
        if not all(isinstance(side, int) and not isinstance(side, bool) for side in (width, height)):
            raise ValueError(f"width and height must be pixel counts, got {width} x {height}")
        if width < 16 or height < 16 or width % 16 or height % 16:
            raise ValueError(f"MammothModa2's width and height must be multiples of 16 pixels, got {width} x {height}")
        self.set_grid(height // 32, width // 32)
        self.pixels = (height, width)

    def encode(self, prompt: str, negative_prompt: Optional[str] = None) -> MammothPrompt:
        """The chat prompt with the image header for the current grid; the uncond row is its last 10 tokens."""
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
        if negative_prompt:
            raise ValueError("MammothModa2's token stage takes no negative prompt (its uncond row is the prompt's "
                             "last 10 tokens); leave it empty")
        rows, cols = self.size
        encode = self._tokenizer.encode
        cond = (*encode(TEMPLATE.format(prompt=prompt)), self._image_start, *encode(f"{rows}*{cols}"),
                self._image_token)
        return MammothPrompt(cond=cond, uncond=cond[-UNCOND_TAIL:], size=self.size, pixels=self.pixels)

    def start(self, cond: MammothPrompt, batch_size: int, guided: bool = True) -> CFGSession:
        """A session of `batch_size` rows of `cond`; `guided` False leaves the uncond rows out (CFG 1: the authors
        then run the cond row alone)."""
        check_start(cond, MammothPrompt, "MammothModa2Model.encode()", batch_size)
        if cond.size != self.size:  # the grid the prompt was encoded for wins
            self.set_grid(*cond.size)
        self._decoding = cond
        check_positions(cond.cond, cond.uncond, self.num_tokens, self.module.model.config.max_position_embeddings,
                        "ask for a smaller grid")
        prefix, mask = cfg_prefix(cond.cond, cond.uncond, cond.cond[0], batch_size, self.device)
        net = self.module
        return CFGSession(prefix, mask, self.num_tokens, backbone=lambda cache: RoutedBackbone(net, cache),
                          embed_prefix=net.embed, embed_image=net.embed, head=partial(net.logits, self.vocab_size),
                          guided=guided)

    def decoder(self, device: Optional[torch.device] = None) -> MammothDecoder:
        """The DiT, refiner and VAE, read from the folder on first use, on `device` (default: the language model's;
        a host that offloads one stage for the other builds it where it keeps it offloaded)."""
        if self._decoder is None:
            self._decoder = load_decoder(self.folder, self.config, self.module.model.config.hidden_size,
                                         self.variant.layers == "qwen3", self.module.gen_embed_tokens.weight.dtype,
                                         device or self.device)
        return self._decoder

    def decoding_memory(self) -> int:
        """Bytes beyond the weights that decoding one image at the current size may take at once (its VAE's
        decode); images are decoded one at a time."""
        return kl_vae_decode_bytes(*self.pixels, self.module.gen_embed_tokens.weight.element_size())

    def decoding_weights(self) -> int:
        """How many weights the DiT, VAE and refiner hold, for a host's memory notes."""
        return decoder_weights(checkpoint_shapes(weight_files(self.folder)))

    def decoding_modules(self, device: Optional[torch.device] = None) -> MammothDecoder:
        """The decoding stage's networks, for a host that moves them in and out of the compute device apart from
        the LLM (ComfyUI's model management); the LLM's re-encode runs before `stage_switch`."""
        return self.decoder(device)

    def decode(self, tokens: torch.Tensor, cond: Optional[MammothPrompt] = None) -> torch.Tensor:
        """Tokens (batch, num_tokens) to float32 CPU images (batch, H, W, 3) in 0..1: each row re-encoded after its
        prompt with <|image end|>, then the DiT from seeded noise and the VAE; `cond` the prompt (default: the
        last one a session started)."""
        cond = self._decoding if cond is None else cond
        if cond is None:
            raise ValueError("MammothModa2's decode needs the prompt the tokens were sampled for: pass "
                             "cond=model.encode(prompt), or start a session first")
        rows, cols = cond.size
        check_tokens(tokens, rows * (cols + 1), self.module.gen_start + self.module.gen_embed_tokens.num_embeddings,
                     "MammothModa2 token ids")
        decoder = self.decoder()
        with torch.no_grad():  # every LLM forward first, so that a host may offload the LLM before the DiT
            device = self.device
            negative = negative_condition(self.module, torch.tensor([self._negative_ids], device=device), self.rule)
            conditions = [positive_condition(self.module, torch.tensor([[*cond.cond, *row, self._image_end]],
                                                                       device=device), self.rule)
                          for row in tokens.tolist()]
        if self.stage_switch is not None:
            self.stage_switch()
        return torch.cat([self.render(condition, negative, cond.pixels, decoder) for condition in conditions])

    @torch.no_grad()
    def render(self, condition: DiTCondition, negative: DiTCondition, pixels: tuple[int, int],
               decoder: MammothDecoder) -> torch.Tensor:
        """One image from its LLM condition: the DiT's loop from the seeded noise, then the VAE."""
        height, width = pixels
        scale, channels = decoder.scale_factor, decoder.gen_transformer.channels
        generator = torch.Generator().manual_seed(self.decoding.seed)
        where = next(decoder.parameters()).device  # the DiT's, which a host may keep apart from the LLM
        noise = torch.randn(1, channels, height // scale, width // scale, generator=generator)
        noise = noise.to(where, self.module.gen_embed_tokens.weight.dtype)
        condition = for_dit(condition.to(where), self.rule, decoder.gen_image_condition_refiner)
        latents = denoise(decoder.gen_transformer, noise, condition, negative.to(where), self.decoding,
                          self.decode_progress)
        return latents_to_pixels(decoder.gen_vae, latents)

    def preview_frame(self, prefix: torch.Tensor) -> torch.Tensor:
        """A token map of the grid being sampled from a row's committed ids (1, done): (H, W, 3), one fixed colour
        per code, pending cells gray.  Progress previews stay cheap: the DiT never runs for them."""
        rows, cols = self.size
        ids = torch.full((1, self.num_tokens), self.t2i.start)
        ids[:, :prefix.shape[1]] = prefix[:1].cpu()
        cells = code_cells(ids, rows, cols)[0] - self.t2i.start
        palette = torch.rand(self.vocab_size, 3, generator=torch.Generator().manual_seed(0))
        colours = palette[cells.clamp(0, self.vocab_size - 1)]
        colours[code_cells(torch.arange(self.num_tokens)[None], rows, cols)[0] >= prefix.shape[1]] = PENDING_GRAY
        side = max(1, PREVIEW_PIXELS // max(rows, cols))
        return colours.repeat_interleave(side, 0).repeat_interleave(side, 1)


def variant_of(folder: Path, config: dict) -> Variant:
    """The checkpoint config.json's llm_config names; anything else is one ModelLoadError."""
    kind = (config.get("llm_config") or {}).get("model_type")
    if kind not in VARIANTS:
        raise ModelLoadError(f"{folder}: config.json's llm_config model_type {kind!r} is neither of "
                             f"{', '.join(VARIANTS)} (Preview, Dev): {HINT}")
    return VARIANTS[kind]


def check_weights_match(folder: Path, variant: Variant) -> None:
    """The weights are the variant's: Dev's Qwen3 layers carry q/k norms, Preview's Qwen2.5 layers do not (the
    authors' issue #2: a Preview checkpoint taken for Dev's code, or the reverse)."""
    normed = any(name.endswith("self_attn.q_norm.weight") for name in checkpoint_shapes(weight_files(folder)))
    if normed != (variant.layers == "qwen3"):
        other = "Dev's (Qwen3-VL, q/k norms)" if normed else "Preview's (Qwen2.5-VL, no q/k norms)"
        raise ModelLoadError(f"{folder}: config.json names {variant.label} but the weights are {other}; the folder "
                             "mixes the two checkpoints (the authors' issue #2): download it again")


def detect(folder: Path) -> bool:
    """A MammothModa2 folder: config.json of model_type "mammothmoda2"."""
    path = Path(folder) / "config.json"
    try:
        return path.is_file() and read_json(path).get("model_type") == MODEL_TYPE
    except (ModelLoadError, OSError, ValueError):
        return False


def memory_estimate(folder: Path) -> MemoryEstimate:
    """The loader's estimate from the weight files' headers: the token stage (its decoder layers quantisable, its
    KV cache) and the DiT, VAE and refiner beside it at the compute dtype (`mammothmoda2_memory`)."""
    return staged_estimate(checkpoint_shapes(weight_files(Path(folder))), UNUSED_WEIGHTS, CACHE_TOKENS)


def load(folder: Path, device: torch.device, dtype: torch.dtype, quantize: str = "none") -> MammothModa2Model:
    """Load a MammothModa2 folder's language model onto `device`, computing in `dtype`, its decoder layers' linear
    layers at `quantize` precision (quantize.PRECISIONS); the DiT, VAE and vision tower are not read."""
    folder = Path(folder)
    if dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        raise ValueError(f"dtype must be float32, bfloat16, float16 (or float64 for tests), got {dtype}")
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"{folder} has no config.json: {HINT}")
    config = read_json(folder / "config.json")
    variant = variant_of(folder, config)
    tokenizer = MammothTokenizer(folder, variant)
    t2i = read_t2i_config(folder)
    if tokenizer.ids["<|endofline|>"] != t2i.eol:
        raise ModelLoadError(f"{GENERATION_FILE}'s eol_token_id {t2i.eol} is not the tokenizer's <|endofline|> "
                             f"{tokenizer.ids['<|endofline|>']}; the folder mixes files of different models")
    check_safetensors_weights(folder, HINT)
    check_weights_match(folder, variant)
    module = read_hf_network(folder, HFNetwork(MammothConfigReader, MammothNetwork, (), "model", FAMILY.label, HINT,
                                               RENAMES), dtype, quantize)
    model = MammothModa2Model(module, tokenizer, t2i, variant, folder, config)  # slices gen_head to the scope
    quantize_then_move(module, module.model, "none", dtype, device)
    return model
