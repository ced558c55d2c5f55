"""Janus-Pro (1B, 7B) in the Hugging Face format, through transformers' JanusForConditionalGeneration.

Image tokens come from `generation_head`, not `lm_head`, and re-enter the
Llama backbone as embeddings from `prepare_embeddings_for_image_generation`.
Classifier-free guidance is batched as transformers does it: the cond rows
first, then the uncond rows, whose prompt tokens (all but BOS and
begin-of-image) are replaced by Janus's pad token -- or, when a negative prompt
is given, its own tokens.  The two row groups may then differ in length; the
shorter one is left-padded and masked, with position ids that skip the padding.

Each sample of a batch advances at its own pace.  transformers' cache classes
keep one length for the whole batch, so the session keeps its own pre-allocated
`RowCache` (one length per row, the cond and uncond rows of a sample moving
together), builds the 4-D attention mask and the per-row position ids itself, and
lets transformers' layers write through a thin `Cache` view of it.

Janus-4o (a Janus-Pro-7B fine-tune, recognised by its folder name) also edits: the
source image enters the prompt twice, as its SigLIP understanding features and as
its VQ codes' generation embeddings, and guidance runs over three rows per sample
(full, part, uncond) with its authors' two weights (`edit_guidance`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Optional, Union

import torch

from ..sessions.cfg_session import CFGSession, cfg_prefix
from ..weights.checkpoints import ModelLoadError
from ..family import Family
from ..sessions.hf_cache import cache_keyword, row_cache_view
from ..weights.hf_folders import check_safetensors_weights, config_model_type
from ..tokenizers.image_encoder import LazyImageEncoder, hf_vq_encoder
from ..weights.quantize import quantize_then_move
from ..sessions.row_attention import RowAttentionBackbone, attention_layer
from ..sessions.row_cache import RowCache
from ..weights.streaming import HFNetwork, fill_from_safetensors, parameters_on_meta, read_hf_network
from ...compiled.compilable import Compilable
from ...model import check_start, check_tokens, compute_device
from ..weights.tokenizer_files import TextTokenizer, read_json
from ..tokenizers.vq16 import cosine_nearest, encode_latent
from ...images.image_input import check_images, no_image_encoder

MODEL_TYPE = "janus"
FAMILY = Family(
    label="Janus-Pro",
    holds="a Janus-Pro folder in the transformers format (config.json with model_type 'janus', *.safetensors, "
          "tokenizer.json)",
    downloads=(("janus", "the Hugging Face repository deepseek-community/Janus-Pro-1B or "
                         "deepseek-community/Janus-Pro-7B (the transformers format)"),),
    repos=("deepseek-community/Janus-Pro-1B", "deepseek-community/Janus-Pro-7B"),
    roots=("Janus-Pro",), cfg="Janus-Pro 5", compile=True, image_tasks=("edit",))
# The deepseek-ai repositories hold the original code's layout (config model_type "multi_modality").
ORIGINAL_MODEL_TYPE = "multi_modality"
HF_FORMAT_HINT = ("download the transformers-format checkpoint deepseek-community/Janus-Pro-1B or "
                  "deepseek-community/Janus-Pro-7B instead (the deepseek-ai/* repositories use the original layout)")
BOS_TOKEN = "<｜begin▁of▁sentence｜>"
CFG_PAD_TOKEN = "<｜▁pad▁｜>"  # Janus's pad for uncond rows; not the tokenizer's own pad token
BEGIN_OF_IMAGE = "<begin_of_image>"
END_OF_IMAGE = "<end_of_image>"
IMAGE_PLACEHOLDER = "<image_placeholder>"  # where the understanding features of an image in the prompt go
PROMPT_TEMPLATE = "<|User|>: {text}\n\n<|Assistant|>:"
EDIT = "edit"
EDIT_CHECKPOINT = "janus-4o"  # in the folder's name: its config does not name the fine-tune (docs/models.md)
DEFAULT_IMAGE_CFG = 5.0  # the authors' cfg_weight2
# Understanding only: the SigLIP vision tower and its aligner encode input images, lm_head predicts text; the
# VQ's encoder side turns images into codes.  Generation never runs them.
UNUSED_MODULES = ("model.vision_model", "model.aligner", "lm_head", "model.vqmodel.encoder",
                  "model.vqmodel.quant_conv")
UNUSED_WEIGHTS = tuple(f"{name}." for name in UNUSED_MODULES)  # their names in the checkpoint
# What an image in the prompt loads on first use: the VQ's encoder side and its codebook (checkpoint names),
# and for editing the understanding tower.
IMAGE_ENCODER_WEIGHTS = ("model.vqmodel.encoder.", "model.vqmodel.quant_conv.", "model.vqmodel.quantize.")
UNDERSTANDING_WEIGHTS = ("model.vision_model.", "model.aligner.")
# Janus's image processor fits an image inside its square and pads it with its mean colour, int(0.5 * 255).
PAD_GREY = 127 / 255
CACHE_TOKENS = 64 + 576  # a prompt and the 24 x 24 codes (memory estimates)


def edit_guidance(cfg_scale: float, image_cfg: float, guided: bool = True) -> tuple[float, ...]:
    """Janus-4o editing's guidance as branch weights (`model.Session.guidance`) of its rows (full, part,
    uncond): its authors' c = (full + image_cfg part) / (1 + image_cfg), then u + cfg_scale (c - u).  Not
    `guided`: the uncond rows are left out (a CFG scale of 1 never reads them)."""
    full, part = cfg_scale / (1 + image_cfg), cfg_scale * image_cfg / (1 + image_cfg)
    return (full, part, 1 - cfg_scale) if guided else (full, part)


@dataclass(frozen=True)
class JanusPrompt:
    """Token ids of the cond and uncond prefixes, each starting with BOS and ending with begin-of-image, and the
    texts they were made of (for `add_image`)."""

    cond: tuple[int, ...]
    uncond: tuple[int, ...]
    text: str = ""
    negative: Optional[str] = None


@dataclass(frozen=True, eq=False)
class JanusEdit:
    """Janus-4o editing: the prompt of the full and part rows (`ids`: the source image's understanding features
    go at its image placeholders in both, its codes' generation embeddings at `codes_at` in the full row only),
    the uncond rows' ids, and the image's guidance weight."""

    ids: tuple[int, ...]
    uncond: tuple[int, ...]
    features: torch.Tensor  # (num_tokens, hidden) the understanding tower's, at the placeholders
    codes: torch.Tensor  # (num_tokens,) the source image's VQ codes
    codes_at: int  # where the codes' slots start in `ids`
    image_cfg: float


class RowBackbone:
    """A transformers Llama backbone run over a RowCache: each row's tokens after its own cached slots.

    Each row's left padding (`rows.pads`) is subtracted from the slot to give its
    position id.
    """

    def __init__(self, backbone: torch.nn.Module, rows: RowCache) -> None:
        self.backbone, self.rows = backbone, rows
        self._cache = row_cache_view()(rows)
        self._cache_keyword = cache_keyword()

    def __call__(self, embeds: torch.Tensor, branches: int = 1) -> torch.Tensor:
        """(rows, T, hidden) input embeddings (a tree with `branches` > 1) -> last hidden states, same shape."""
        slots, visible = self.rows.begin(embeds.shape[1], branches)
        positions = (slots - self.rows.pads).clamp(min=0)  # left padding takes no position
        # additive, in the model's dtype: what both sdpa and eager attention take as a 4-D mask
        mask = torch.zeros(visible.shape, dtype=embeds.dtype, device=embeds.device)
        mask = mask.masked_fill_(~visible, torch.finfo(embeds.dtype).min).unsqueeze(1)
        out = self.backbone(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, use_cache=True,
                            **{self._cache_keyword: self._cache})
        return out.last_hidden_state


class JanusModel(Compilable):
    """A loaded Janus-Pro: TokenModel for the engine, plus encode/decode for prompts and pixels."""

    layer_step = staticmethod(attention_layer)

    family = "janus"
    default_cfg_scale = 5.0  # transformers' and DeepSeek's default
    default_temperature = 1.0
    default_top_k = None  # the reference sampler draws from the full distribution

    def __init__(self, module: torch.nn.Module, tokenizer: TextTokenizer,
                 image_encoder: Optional[LazyImageEncoder] = None,
                 understanding: Optional[LazyImageEncoder] = None) -> None:
        """`image_encoder`: the VQ's encoder side, loaded on the first `encode_image` (None: no image input);
        `understanding`: the SigLIP tower and aligner of a checkpoint that edits (Janus-4o), loaded on its first
        edit."""
        self.module = module
        self.image_encoder, self.understanding = image_encoder, understanding
        self.image_tasks = (EDIT,) if understanding is not None else ()
        self._tokenizer = tokenizer
        self._bos = tokenizer.special_id("bos_token", BOS_TOKEN)
        self._pad = tokenizer.token_id(CFG_PAD_TOKEN)
        self._boi = tokenizer.token_id(BEGIN_OF_IMAGE)
        vq_config = module.config.vq_config
        side = module.config.vision_config.image_size // module.config.vision_config.patch_size
        self.grid = (side, side)
        self.num_tokens = side * side
        self.image_pixels = side * 2 ** (len(vq_config.channel_multiplier) - 1)  # the VQ's square side
        self.vocab_size = vq_config.num_embeddings

    @property
    def device(self) -> torch.device:
        return compute_device(self, next(self.module.parameters()))

    def encode(self, prompt: str, negative_prompt: Optional[str] = None) -> JanusPrompt:
        """Prefix ids; a None or blank negative prompt gives Janus's own pad-token uncond rows."""
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
        if negative_prompt is not None and not isinstance(negative_prompt, str):
            raise ValueError(f"negative_prompt must be a string or None, got {type(negative_prompt).__name__}")
        cond = self._prefix_ids(prompt)
        if negative_prompt is None or not negative_prompt.strip():
            return JanusPrompt(cond=cond, uncond=(cond[0],) + (self._pad,) * (len(cond) - 2) + (cond[-1],),
                               text=prompt)
        return JanusPrompt(cond=cond, uncond=self._prefix_ids(negative_prompt), text=prompt, negative=negative_prompt)

    def _prefix_ids(self, text: str) -> tuple[int, ...]:
        body = self._tokenizer.encode(PROMPT_TEMPLATE.format(text=text.strip()))
        return (self._bos, *body, self._boi)

    def add_image(self, cond: JanusPrompt, images: Any, task: str, image_cfg: Optional[float] = None) -> JanusEdit:
        """Janus-4o's text + image -> image (task "edit") as its authors build it (docs/models.md): `cond`'s text
        after the source image (a ComfyUI IMAGE of one picture), fitted to the VQ's square as Janus's processor
        does.  `image_cfg`: the image's guidance weight (their cfg_weight2; None: theirs, 5); the sampler's
        CFG scale is their cfg_weight."""
        if task not in self.image_tasks:
            trained = (f"it takes {', '.join(self.image_tasks)}" if self.image_tasks else
                       "image editing needs Janus-4o (a folder whose name holds 'Janus-4o', docs/models.md)")
            raise ValueError(f"task {task!r} is not one this Janus checkpoint was trained for: {trained}")
        check_start(cond, JanusPrompt, "JanusModel.encode()", 1)
        image_cfg = DEFAULT_IMAGE_CFG if image_cfg is None else float(image_cfg)
        if not 0 <= image_cfg <= 100:
            raise ValueError(f"image_cfg must be a number in 0..100, got {image_cfg}")
        images = check_images(images)
        if images.shape[0] != 1:
            raise ValueError(f"Janus-4o edits one image per prompt, got a batch of {images.shape[0]}: pick one "
                             "(e.g. with an Image From Batch node)")
        side = self.image_pixels
        features = self.understanding.codes(images, (side, side), self.device)[0]
        codes = self.encode_image(images)[0]
        n = self.num_tokens
        image = (BEGIN_OF_IMAGE + IMAGE_PLACEHOLDER * n + END_OF_IMAGE + BEGIN_OF_IMAGE + CFG_PAD_TOKEN * n
                 + END_OF_IMAGE)
        # their template with an empty system prompt, the text unstripped, then begin-of-image
        ids = (self._bos, *self._tokenizer.encode(PROMPT_TEMPLATE.format(text=image + cond.text)), self._boi)
        codes_at = ids.index(self._tokenizer.token_id(END_OF_IMAGE)) + 2
        if ids.count(self.module.config.image_token_id) != n or ids[codes_at:codes_at + n] != (self._pad,) * n:
            raise ValueError("the tokenizer split Janus-4o's image tokens: is this the right model folder?")
        uncond = cond.uncond if cond.negative else (  # their uncond rows: BOS, pad, begin-of-image
            (ids[0],) + (self._pad,) * (len(ids) - 2) + (ids[-1],))
        return JanusEdit(ids=ids, uncond=uncond, features=features, codes=codes, codes_at=codes_at,
                         image_cfg=image_cfg)

    def start(self, cond: Union[JanusPrompt, JanusEdit], batch_size: int, guided: bool = True) -> CFGSession:
        """A session of `batch_size` samples; `guided` False leaves the uncond rows out (a CFG scale of 1)."""
        if isinstance(cond, JanusEdit):
            check_start(cond, JanusEdit, "JanusModel.add_image()", batch_size)
            prefix, mask = self._edit_prefix(cond, batch_size)
            copies, guidance = 3, partial(edit_guidance, image_cfg=cond.image_cfg, guided=guided)
        else:
            check_start(cond, JanusPrompt, "JanusModel.encode()", batch_size)
            prefix, mask = cfg_prefix(cond.cond, cond.uncond, self._pad, batch_size, self.device)
            copies, guidance = 2, None
        net = self.module
        language_model = net.model.language_model
        # compiled: our own attention over the cache, one graph for every layer (transformers' layers each
        # carry their index, which a compiled region would specialise on)
        backbone = ((lambda cache: RowAttentionBackbone(language_model, cache, self.compiled_layer)) if self.compiled
                    else (lambda cache: RowBackbone(language_model, cache)))
        return CFGSession(prefix, mask, self.num_tokens, backbone=backbone, static_shapes=self.compiled,
                          embed_prefix=net.get_input_embeddings() if guidance is None else _embedded,
                          embed_image=net.prepare_embeddings_for_image_generation,  # image ids have their own table
                          head=net.model.generation_head, guided=guided, copies=copies, guidance=guidance)

    @torch.no_grad()
    def _edit_prefix(self, cond: JanusEdit, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The (3 x batch, width) input embeddings of an edit's full, part and uncond rows (left-padded to one
        width where a negative prompt makes the uncond rows another length) and the mask of what is real."""
        net, device = self.module, self.device
        embed = net.get_input_embeddings()
        ids = torch.tensor(cond.ids, device=device)
        part = embed(ids)
        part[ids == net.config.image_token_id] = cond.features.to(device, part.dtype)
        full = part.clone()
        codes = net.prepare_embeddings_for_image_generation(cond.codes.to(device))
        full[cond.codes_at:cond.codes_at + codes.shape[0]] = codes.to(full.dtype)
        rows = [full, part, embed(torch.tensor(cond.uncond, device=device))]
        width = max(row.shape[0] for row in rows)
        prefix = torch.stack([torch.nn.functional.pad(row, (0, 0, width - row.shape[0], 0)) for row in rows])
        mask = torch.stack([torch.arange(width, device=device) >= width - row.shape[0] for row in rows]).long()
        return prefix.repeat_interleave(batch_size, dim=0), mask.repeat_interleave(batch_size, dim=0)

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image ids (batch, num_tokens) to float32 CPU images (batch, H, W, 3) in 0..1."""
        check_tokens(tokens, self.num_tokens, self.vocab_size, "image token ids")
        images = self.module.decode_image_tokens(tokens.to(self.device, torch.long))
        return ((images.float() + 1) / 2).clamp(0, 1).cpu()

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """ComfyUI IMAGE (batch, H, W, 3) in 0..1 -> codes (batch, num_tokens) as `decode` takes them; an image
        of another size is scaled to fit the VQ's square and padded in grey, as Janus's image processor does."""
        if self.image_encoder is None:
            raise no_image_encoder(self)
        side = self.image_pixels
        return self.image_encoder.codes(images, (side, side), self.device).flatten(1)


def _embedded(context: torch.Tensor) -> torch.Tensor:
    """An edit session's prompt is embedded already (`JanusModel._edit_prefix`)."""
    return context


class JanusImageCodes(torch.nn.Module):
    """Janus's VQ encoder side (transformers' modules) with the authors' quantiser: the nearest code once latent
    and codebook rows are L2-normalised (`codebook_l2_norm`).  transformers' JanusVQVAEVectorQuantizer compares
    them unnormalised, which picks other codes wherever the codebook rows are not of unit length."""

    def __init__(self, vq: torch.nn.Module) -> None:
        super().__init__()
        self.vq = vq

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels (batch, 3, H, W) in -1..1 -> codes (batch, H/16, W/16)."""
        return cosine_nearest(encode_latent(self.vq, pixels), self.vq.quantize.embedding.weight)


def image_encoder(folder: Path, config: Any, dtype: torch.dtype) -> LazyImageEncoder:
    """The VQ encoder of the Janus folder `folder` (its JanusConfig `config`), read on first use at `dtype`."""
    from transformers import JanusVQVAE

    files = sorted(folder.glob("*.safetensors"))
    return LazyImageEncoder(
        FAMILY.label, files, IMAGE_ENCODER_WEIGHTS,
        lambda vq_dtype: JanusImageCodes(hf_vq_encoder(JanusVQVAE, config.vq_config, files,
                                                       (("model.vqmodel.", ""),), vq_dtype, HF_FORMAT_HINT)),
        dtype, fit="pad", fill=PAD_GREY)


class JanusUnderstanding(torch.nn.Module):
    """Janus's understanding tower: SigLIP features of an image through the aligner, what fills the image
    placeholders of a prompt (transformers' `get_image_features`)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        from transformers import JanusVisionModel
        from transformers.models.janus.modeling_janus import JanusVisionAlignerMLP

        self.vision_model = JanusVisionModel(config.vision_config)
        self.aligner = JanusVisionAlignerMLP(config.vision_config)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels (batch, 3, H, W) in -1..1 (SigLIP's mean and std of 0.5) -> (batch, tokens, hidden)."""
        return self.aligner(self.vision_model(pixels).last_hidden_state)


def understanding_encoder(folder: Path, config: Any, dtype: torch.dtype) -> LazyImageEncoder:
    """The understanding tower of the Janus folder `folder`, read on the first edit at `dtype`."""
    files = sorted(folder.glob("*.safetensors"))

    def build(tower_dtype: torch.dtype) -> JanusUnderstanding:
        with parameters_on_meta():
            tower = JanusUnderstanding(config)
        fill_from_safetensors(tower, files, "", "none", tower_dtype, HF_FORMAT_HINT, (("model.", ""),))
        return tower

    return LazyImageEncoder(FAMILY.label, files, UNDERSTANDING_WEIGHTS, build, dtype, fit="pad", fill=PAD_GREY,
                            part="understanding encoder (SigLIP)")


def detect(folder: Path) -> bool:
    """A Janus folder: config.json of model_type "janus" (or the original layout, to explain it)."""
    return config_model_type(folder) in (MODEL_TYPE, ORIGINAL_MODEL_TYPE)


def _check_config(folder: Path) -> None:
    path = folder / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{folder} has no config.json; expected a Janus-Pro folder in the transformers "
                             f"format (config.json, *.safetensors, tokenizer.json): {HF_FORMAT_HINT}")
    model_type = read_json(path).get("model_type")
    if model_type == ORIGINAL_MODEL_TYPE:
        raise ModelLoadError(f"{folder} holds the original deepseek-ai Janus layout, which needs a conversion; "
                             f"{HF_FORMAT_HINT}")
    if model_type != MODEL_TYPE:
        raise ModelLoadError(f"{path} has model_type {model_type!r}, not {MODEL_TYPE!r}: not a Janus-Pro folder")


def load(folder: Path, device: torch.device, dtype: torch.dtype, quantize: str = "none") -> JanusModel:
    """Load a transformers-format Janus-Pro folder onto `device`, computing in `dtype`, the backbone's linear
    layers at `quantize` precision (quantize.PRECISIONS); the parts only understanding uses are dropped."""
    folder = Path(folder)
    if dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        raise ValueError(f"dtype must be float32, bfloat16, float16 (or float64 for tests), got {dtype}")
    _check_config(folder)
    tokenizer = TextTokenizer(folder)
    check_safetensors_weights(folder, HF_FORMAT_HINT)
    from transformers import JanusConfig, JanusForConditionalGeneration

    # the checkpoint names are the module names; the backbone is quantised as it is read
    net = read_hf_network(folder, HFNetwork(JanusConfig, JanusForConditionalGeneration, UNUSED_MODULES,
                                            "model.language_model", "Janus-Pro", HF_FORMAT_HINT), dtype, quantize)
    quantize_then_move(net, net.model.language_model, "none", dtype, device)
    edits = EDIT_CHECKPOINT in folder.name.lower()
    return JanusModel(net, tokenizer, image_encoder(folder, net.config, dtype),
                      understanding_encoder(folder, net.config, dtype) if edits else None)
