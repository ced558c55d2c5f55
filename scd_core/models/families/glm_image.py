"""GLM-Image (zai-org/GLM-Image) in its published diffusers layout: the AR stage through transformers'
GlmImageForConditionalGeneration, the pixels through diffusers' GlmImagePipeline.

Folder layout (model_index.json names GlmImagePipeline)::

    vision_language_encoder/   the 9B AR model (config.json model_type "glm_image", safetensors)
    processor/                 GLM-Image's processor: tokenizer, chat template, image processor
    transformer/ vae/          the 7B DiT and its VAE (decoding only)
    text_encoder/ tokenizer/   the glyph encoder (T5) and its ByT5 tokenizer (decoding only)
    scheduler/

Text-to-image samples a preview grid (about 16 x 16) then the large grid (H/32 x W/32), one image code per cell,
no row-end tokens.  The prompt is the processor's (chat template, then the grid sizes, then the image start
token).  Every fed token takes the 3-D M-RoPE position transformers gives it: prompt tokens the same index on
all three axes, cell (r, c) of a grid (t, t + r, t + c) where t is where the grid starts; each grid starts
max(rows, cols) after the previous one.  The decoder gets the large grid upsampled 2x, as the pipeline does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from ..sessions.cfg_session import CFGSession, cfg_prefix, check_positions
from ..weights.checkpoints import ModelLoadError
from ..family import Family
from ..decoder_settings import DecoderSettings
from ..generate_defaults import generate_sampling
from ..weights.generation_only import code_rows_head
from ..weights.hf_folders import check_safetensors_weights, config_model_type
from ..sessions.hf_cache import cache_keyword, row_cache_view
from ..weights.memory import (MemoryEstimate, checkpoint_shapes, estimate_from_shapes, kl_vae_decode_bytes,
                              weight_files)
from ..weights.quantize import quantize_then_move
from ..sessions.row_cache import RowCache
from ..weights.streaming import HFNetwork, read_hf_network
from ..weights.tokenizer_files import read_json
from ...model import check_start, check_tokens, compute_device
from ...decoding.sampling import Sampling

FAMILY = Family(
    label="GLM-Image",
    holds="a GLM-Image folder (zai-org/GLM-Image as published: model_index.json naming GlmImagePipeline, "
          "vision_language_encoder/ with model_type 'glm_image')",
    downloads=(("glm", "the Hugging Face repository zai-org/GLM-Image (all of its subfolders)"),),
    repos=("zai-org/GLM-Image",),
    roots=("GLM-Image",), top_k="GLM-Image its generation_config.json's (as published: none, so generate's 50)",
    top_p="GLM-Image its generation_config.json's (0.75 as published)",
    temperature="GLM-Image its generation_config.json's (0.9 as published)",
    sizes=("GLM-Image (multiples of 32)",), decoder="GLM-Image 50 steps, guidance 1.5")
MODEL_TYPE = "glm_image"
PIPELINE_CLASS = "GlmImagePipeline"
AR_FOLDER, PROCESSOR_FOLDER = "vision_language_encoder", "processor"
DECODER_PARTS = ("transformer", "vae", "text_encoder")  # the decoding stage: DiT, VAE, glyph encoder (subfolders)
DECODER_FOLDERS = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")
HINT = "download the Hugging Face repository zai-org/GLM-Image (all of its subfolders)"
TRANSFORMERS_NEEDED = "5.0"  # GLM-Image arrived in transformers 5
DIFFUSERS_NEEDED = "0.37"
# Generation never runs the source-image tower (image-to-image) on a text-to-image run: dropped at load.
UNUSED_MODULES = ("model.visual", "model.vqmodel")
UNUSED_WEIGHTS = tuple(f"{name}." for name in UNUSED_MODULES)
CACHE_TOKENS = 256 + 256 + 1024  # a prompt, the preview and a 1024 px grid (memory estimates)
PIXELS_PER_TOKEN = 32
DEFAULT_SIZE = (1024, 1024)  # (height, width)
DECODE_STEPS, DECODE_GUIDANCE = 50, 1.5  # the pipeline's defaults for the DiT
PREVIEW_PIXELS, PENDING_GRAY = 512, 0.5  # progress previews: a token map about this wide, pending cells gray


def require_transformers() -> None:
    """transformers with GLM-Image, or a ModelLoadError saying which version is needed."""
    try:
        from transformers import GlmImageForConditionalGeneration  # noqa: F401
    except ImportError:
        import transformers

        raise ModelLoadError(f"GLM-Image needs transformers {TRANSFORMERS_NEEDED} or newer (this environment has "
                             f"{transformers.__version__}): pip install -U 'transformers>={TRANSFORMERS_NEEDED}'"
                             ) from None


def require_diffusers() -> Any:
    """The diffusers module with GlmImagePipeline, or a clear error: decoding needs it, sampling does not."""
    try:
        import diffusers
        from diffusers import GlmImagePipeline  # noqa: F401
    except ImportError:
        raise ModelLoadError(f"decoding GLM-Image tokens needs diffusers {DIFFUSERS_NEEDED} or newer with "
                             f"GlmImagePipeline: pip install -U 'diffusers>={DIFFUSERS_NEEDED}' (the pack's "
                             "'glm' extra)") from None
    return diffusers


def grid_sizes(height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(preview rows, cols), (large rows, cols) for a height x width pixel image, as GLM-Image's processor
    computes them (`_get_target_shape`)."""
    rows, cols = height // PIXELS_PER_TOKEN, width // PIXELS_PER_TOKEN
    ratio = rows / cols
    preview = (int(ratio ** 0.5 * PIXELS_PER_TOKEN // 2), int((1 / ratio) ** 0.5 * PIXELS_PER_TOKEN // 2))
    return preview, (rows, cols)


def decode_offsets(grids: Sequence[tuple[int, int]]) -> torch.Tensor:
    """(3, cells + 1) M-RoPE positions of the generated tokens relative to the position after the prompt:
    grids in generation order, cell (r, c) at (t, t + r, t + c), then the end marker (transformers'
    `get_rope_index` decode positions)."""
    parts, start = [], 0
    for rows, cols in grids:
        r = torch.arange(rows).repeat_interleave(cols)
        c = torch.arange(cols).repeat(rows)
        parts.append(torch.stack([torch.zeros_like(r), r, c]) + start)
        start += max(rows, cols)
    parts.append(torch.full((3, 1), start))
    return torch.cat(parts, dim=1)


@dataclass(frozen=True)
class SourceImage:
    """Image-to-image: the source picture, its codes and their grid (rows, cols), and the M-RoPE positions
    of the cond and uncond prompts, which hold those codes ((3, length) each, as get_rope_index gives them)."""

    image: Any  # PIL image, as the processor and the decoder's VAE take it
    codes: tuple[int, ...]
    grid: tuple[int, int]
    positions: tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]


@dataclass(frozen=True)
class GlmImagePrompt:
    """Token ids of the cond and uncond prompts (each ending with the image start token), the text (the
    decoder's glyph encoder reads its quoted parts), the pixel size they ask for, for image-to-image the
    source image, and the negative prompt's text."""

    cond: tuple[int, ...]
    uncond: tuple[int, ...]
    text: str
    size: tuple[int, int]  # (height, width)
    source: Optional[SourceImage] = None
    negative: str = ""  # the uncond rows' text (`add_image` builds both prompts again around the image)


class GlmRowBackbone:
    """GLM-Image's text decoder over a RowCache, each row at its own pace, fed 3-D M-RoPE positions.

    Text-to-image prompt slots take their index (after the row's left padding) on all three axes; with
    `prompt` ((3, rows, prefix) positions, image-to-image) they take those.  Generated token j of a row whose
    prompt positions end at P - 1 takes P + `offsets[:, j]`."""

    def __init__(self, backbone: torch.nn.Module, rows: RowCache, offsets: torch.Tensor,
                 prompt: Optional[torch.Tensor] = None) -> None:
        self.backbone, self.rows, self.offsets, self.prompt = backbone, rows, offsets, prompt
        self._cache = row_cache_view()(rows)
        self._cache_keyword = cache_keyword()

    def positions(self, slots: torch.Tensor) -> torch.Tensor:
        """(3, rows, T) positions of the tokens at `slots` (rows, T)."""
        rows = self.rows
        if self.prompt is None:
            text = (slots - rows.pads).clamp(min=0).unsqueeze(0)
            after = (rows.prefix - rows.pads).unsqueeze(0)  # (1, rows, 1)
        else:
            index = slots.clamp(max=rows.prefix - 1).unsqueeze(0).expand(3, -1, -1)
            text = self.prompt.gather(2, index)
            after = self.prompt.amax(dim=(0, 2)).view(1, -1, 1) + 1
        cell = (slots - rows.prefix).clamp(0, self.offsets.shape[1] - 1)
        return torch.where(slots >= rows.prefix, after + self.offsets[:, cell], text)

    def __call__(self, embeds: torch.Tensor, branches: int = 1) -> torch.Tensor:
        slots, visible = self.rows.begin(embeds.shape[1], branches)
        mask = torch.zeros(visible.shape, dtype=embeds.dtype, device=embeds.device)
        mask = mask.masked_fill_(~visible, torch.finfo(embeds.dtype).min).unsqueeze(1)
        out = self.backbone(inputs_embeds=embeds, attention_mask=mask, position_ids=self.positions(slots),
                            use_cache=True, **{self._cache_keyword: self._cache})
        return out.last_hidden_state


class GlmImageModel:
    """A loaded GLM-Image: TokenModel for the engine (the AR stage), plus encode and decode."""

    family = "glm_image"
    default_cfg_scale = 1.0  # the published pipeline samples the AR stage without guidance
    default_decoding = DecoderSettings(DECODE_STEPS, DECODE_GUIDANCE)  # `decoding`: what the next decode runs
    image_tasks = ("edit",)  # image-to-image: the source image in the prompt (`add_image`)

    def __init__(self, module: torch.nn.Module, processor: Any, folder: Path,
                 sampling: Sampling) -> None:
        """`sampling`: the temperature, top-k and top-p by default (`sampling_defaults`)."""
        self.module, self.processor, self.folder = module, processor, folder
        codes = module.config.vq_config.num_embeddings
        self.code_ids = torch.arange(codes)
        self.vocab_size = codes
        module.lm_head = code_rows_head(module.lm_head, self.code_ids)  # image codes only
        self.default_temperature, self.default_top_k, self.default_top_p = (
            sampling.temperature, sampling.top_k, sampling.top_p)
        self.pad = processor.tokenizer.pad_token_id or 0  # left padding is masked: any id will do
        self.decoding = self.default_decoding
        self._pipeline: Optional[Any] = None
        self._image_tokenizer: Optional[torch.nn.Module] = None
        self._decoding = GlmImagePrompt(cond=(), uncond=(), text="", size=DEFAULT_SIZE)
        self.set_image_size(DEFAULT_SIZE[1], DEFAULT_SIZE[0])

    @property
    def device(self) -> torch.device:
        return compute_device(self, next(self.module.parameters()))

    def set_image_size(self, width: int, height: int) -> None:
        """width x height pixels (multiples of 32) from the next encode on."""
        for name, side in (("width", width), ("height", height)):
            if not isinstance(side, int) or side < PIXELS_PER_TOKEN or side % PIXELS_PER_TOKEN:
                raise ValueError(f"GLM-Image {name} must be a multiple of {PIXELS_PER_TOKEN} px, got {side!r}")
        if max(width, height) > 4 * min(width, height):
            raise ValueError(f"GLM-Image takes aspect ratios up to 4:1, got {width} x {height}")
        self.size = self.image_shape = (height, width)
        self._use_grids(grid_sizes(height, width))

    def _use_grids(self, grids: tuple[tuple[int, int], ...]) -> None:
        """Sample `grids` (rows, cols) in this order: preview and large (text-to-image) or large only."""
        self.grids = grids
        self.grid = grids[-1]  # `above` drafts copy from one large-grid row back
        self.num_tokens = sum(rows * cols for rows, cols in grids)

    def encode(self, prompt: str, negative_prompt: Optional[str] = None, image: Any = None) -> GlmImagePrompt:
        """The processor's prompt for the current size; the uncond rows hold the negative prompt ("" if None).
        With `image` (a PIL image, or (H, W, 3) / (1, H, W, 3) floats in 0..1) it is image-to-image: the source
        image's codes are in both prompts and only the large grid is sampled."""
        for name, text in (("prompt", prompt), ("negative_prompt", negative_prompt)):
            if text is not None and not isinstance(text, str):
                raise ValueError(f"{name} must be a string, got {type(text).__name__}")
        negative = negative_prompt or ""
        if image is None:
            return GlmImagePrompt(cond=self._prompt(prompt)["input_ids"][0], size=self.size, text=prompt,
                                  uncond=self._prompt(negative)["input_ids"][0], negative=negative)
        picture = pil_image(image)
        (cond, cond_positions, codes, grid), (uncond, uncond_positions, _, _) = (
            self._source_prompt(text, picture) for text in (prompt, negative))
        source = SourceImage(picture, codes, grid, (cond_positions, uncond_positions))
        return GlmImagePrompt(cond=cond, uncond=uncond, text=prompt, size=self.size, source=source,
                              negative=negative)

    def add_image(self, cond: GlmImagePrompt, images: Any, task: str) -> GlmImagePrompt:
        """Image-to-image (task "edit"): `cond`'s prompts again, at its size, with the source image (a ComfyUI
        IMAGE of one picture, (1, H, W, 3) in 0..1, or a PIL image) before the text, as the processor builds
        them: `encode(..., image=images)`.  Only the large grid is then sampled."""
        if task not in self.image_tasks:
            raise ValueError(f"task {task!r} is not one the GLM-Image checkpoint ({self.folder.name}) was trained "
                             f"for: it takes {', '.join(self.image_tasks)}")
        check_start(cond, GlmImagePrompt, "GlmImageModel.encode()", 1)
        if cond.source is not None:
            raise ValueError("this conditioning already holds a source image; GLM-Image edits one image per "
                             "prompt: add the image to the prompt's own conditioning")
        if cond.size != self.size:  # the size the prompt was encoded for wins
            self.set_image_size(cond.size[1], cond.size[0])
        return self.encode(cond.text, cond.negative, image=images)

    def _prompt(self, text: str, image: Any = None) -> dict:
        """The processor's inputs for `text` (after the source image, if any) at the current size, as the
        pipeline builds them; input_ids as a tuple."""
        content = ([] if image is None else [{"type": "image", "image": image}]) + [{"type": "text", "text": text}]
        height, width = self.size
        inputs = self.processor.apply_chat_template([[{"role": "user", "content": content}]], tokenize=True,
                                                    target_h=height, target_w=width, return_dict=True,
                                                    return_tensors="pt")
        return dict(inputs, input_ids=(tuple(inputs["input_ids"][0].tolist()),))

    @torch.no_grad()
    def _source_prompt(self, text: str, image: Any) -> tuple:
        """(ids with the source codes in place of the image placeholders, their M-RoPE positions as
        get_rope_index gives them, the codes, their grid (rows, cols))."""
        inputs = self._prompt(text, image)
        grids = inputs["image_grid_thw"]
        tokenizer = self.image_tokenizer()
        features = tokenizer.get_image_features(inputs["pixel_values"].to(self.device), grids[:-1].to(self.device))
        codes = tokenizer.get_image_tokens(features.pooler_output, grids[:-1]).cpu()  # as the model's forward
        ids = torch.tensor([inputs["input_ids"][0]])
        ids[ids == self.module.config.image_token_id] = codes
        positions, _ = self.module.model.get_rope_index(ids, grids, inputs["images_per_sample"],
                                                        inputs["attention_mask"])
        return (tuple(ids[0].tolist()), tuple(tuple(axis) for axis in positions[:, 0].tolist()),
                tuple(codes.tolist()), tuple(grids[0, 1:].tolist()))

    def image_tokenizer(self) -> torch.nn.Module:
        """The AR model's vision tower and VQ (image-to-image only), read from the folder on first use."""
        if self._image_tokenizer is None:
            self._image_tokenizer = load_image_tokenizer(self.folder / AR_FOLDER, next(self.module.parameters()).dtype,
                                                         self.device)
        return self._image_tokenizer

    def start(self, cond: GlmImagePrompt, batch_size: int, guided: bool = True) -> CFGSession:
        """The session of `batch_size` images; `guided` False runs the cond rows only, one per image (at CFG
        scale 1, the published pipeline's, the uncond logits are never read)."""
        check_start(cond, GlmImagePrompt, "GlmImageModel.encode()", batch_size)
        if cond.size != self.size:  # the size the prompt was encoded for wins
            self.set_image_size(cond.size[1], cond.size[0])
        grids = grid_sizes(*cond.size)
        self._use_grids(grids if cond.source is None else grids[1:])
        self._decoding = cond
        offsets = decode_offsets(self.grids).to(self.device)
        check_positions(cond.cond, cond.uncond, int(offsets.max()) + 1,
                        self.module.config.text_config.max_position_embeddings, "use a shorter prompt")
        prefix, mask = cfg_prefix(cond.cond, cond.uncond, self.pad, batch_size, self.device)
        net = self.module
        parts = dict(embed_prefix=net.get_input_embeddings(), embed_image=net.get_input_embeddings(),
                     head=net.lm_head, guided=guided)
        if cond.source is None:
            return CFGSession(prefix, mask, self.num_tokens, **parts,
                              backbone=lambda cache: GlmRowBackbone(net.model.language_model, cache, offsets))
        width = prefix.shape[1]
        table = torch.stack([torch.nn.functional.pad(torch.tensor(positions), (width - len(positions[0]), 0))
                             for positions in cond.source.positions]).repeat_interleave(batch_size, dim=0)
        table = table.permute(1, 0, 2).to(self.device)  # (3, rows, width), cond rows then uncond rows
        table = table if guided else table[:, :batch_size]
        return SourceSession(prefix, mask, self.num_tokens, **parts,
                             backbone=lambda cache: GlmRowBackbone(net.model.language_model, cache, offsets, table))

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, cond: Optional[GlmImagePrompt] = None) -> torch.Tensor:
        """Tokens (batch, num_tokens) to float32 CPU images (batch, H, W, 3) in 0..1 through the DiT and VAE
        (loaded on the first call); `cond` gives the prompt whose quoted text the glyph encoder reads and the
        source image of image-to-image (default: the last generation's)."""
        check_tokens(tokens, self.num_tokens, self.vocab_size, "image token ids")
        pipeline = self.decoder()
        # the decoding stage runs where its modules are (a host may move them apart from the AR stage's)
        device = next(pipeline.transformer.parameters()).device
        cond = self._decoding if cond is None else cond
        prior = upsampled(tokens[:, -self.grid[0] * self.grid[1]:], self.grid).to(device)
        source = {}
        if cond.source is not None:  # the DiT sees the source image (its VAE latents) and its codes
            rows, cols = cond.source.grid
            codes = upsampled(torch.tensor([cond.source.codes]), cond.source.grid)[0].to(device)
            picture = decoder_source(cond.source.image, cond.source.grid,
                                     pipeline.vae_scale_factor * pipeline.transformer.config.patch_size)
            source = dict(image=[picture], prior_token_image_ids=[codes],
                          source_image_grid_thw=[torch.tensor([[1, 2 * rows, 2 * cols]], device=device)])
        images = []
        for row in prior:
            generator = torch.Generator(device).manual_seed(self.decoding.seed)
            out = pipeline(prompt=cond.text, prior_token_ids=row[None], height=self.size[0], width=self.size[1],
                           num_inference_steps=self.decoding.steps, guidance_scale=self.decoding.guidance,
                           generator=generator, output_type="pt", **source)
            images.append(out.images.float().cpu())
        return torch.cat(images).permute(0, 2, 3, 1).clamp(0, 1)

    def preview_frame(self, prefix: torch.Tensor) -> torch.Tensor:
        """A token map of the grid being sampled, from a row's committed codes (1, done): (H, W, 3), one fixed
        colour per code, pending cells gray.  Progress previews stay cheap: the DiT never runs for them."""
        done = min(prefix.shape[1], self.num_tokens - 1)
        (preview_rows, preview_cols), (rows, cols) = self.grids
        start = 0 if done < preview_rows * preview_cols else preview_rows * preview_cols
        if start:
            preview_rows, preview_cols = rows, cols
        cells = torch.full((preview_rows * preview_cols, 3), PENDING_GRAY)
        filled = prefix[0, start:prefix.shape[1]].cpu()[:cells.shape[0]]
        palette = torch.rand(self.vocab_size, 3, generator=torch.Generator().manual_seed(0))
        cells[:filled.numel()] = palette[filled]
        side = max(1, PREVIEW_PIXELS // max(preview_rows, preview_cols))
        return cells.view(preview_rows, preview_cols, 3).repeat_interleave(side, 0).repeat_interleave(side, 1)

    def decoder(self, device: Optional[torch.device] = None) -> Any:
        """diffusers' GlmImagePipeline over the folder's DiT, VAE and glyph encoder, built on first use on
        `device` (default: the AR stage's; a host that offloads one stage for the other builds it where it
        keeps it offloaded, so the two never meet in the compute device's memory)."""
        if self._pipeline is None:
            self._pipeline = load_decoder(self.folder, self.processor, device or self.device,
                                          next(self.module.parameters()).dtype)
        return self._pipeline

    def decoding_memory(self) -> int:
        """Bytes beyond the weights that decoding one image at the current size may take at once (its VAE's
        decode); images are decoded one at a time."""
        return kl_vae_decode_bytes(*self.size, next(self.module.parameters()).element_size())

    def decoding_weights(self) -> int:
        """How many weights the decoding stage holds (`decoder_weights`), for a host's memory notes."""
        return decoder_weights(self.folder)

    def decoding_modules(self, device: Optional[torch.device] = None) -> torch.nn.ModuleDict:
        """The decoding stage's networks (`DECODER_PARTS` of `decoder(device)`), for a host that moves them in
        and out of the compute device apart from the AR stage (ComfyUI's model management)."""
        pipeline = self.decoder(device)
        return torch.nn.ModuleDict({name: getattr(pipeline, name) for name in DECODER_PARTS})


class SourceSession(CFGSession):
    """Image-to-image: each row's prompt positions are its own table, so rows neither join a running session
    nor get regrouped (the engine and generate_many check for these methods)."""

    admit = None
    keep_rows = None


def upsampled(tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(batch, rows * cols) codes to (batch, 4 * rows * cols): each 32 px token covers 2 x 2 cells of the DiT's
    16 px patches, as the pipeline upsamples them."""
    rows, cols = grid
    cells = tokens.reshape(-1, rows, cols).repeat_interleave(2, dim=1).repeat_interleave(2, dim=2)
    return cells.reshape(tokens.shape[0], -1)


def decoder_source(picture: Any, grid: tuple[int, int], multiple_of: int) -> Any:
    """The source image as the pipeline's DiT is to see it: at the size its codes describe (grid rows x cols of
    32 px tokens), so that latents and codes cover the same cells.  The pipeline resizes a source itself (lanczos,
    to its size floored to `multiple_of` px): where that is the codes' size it is handed over as it is, so the
    pipeline's own resize applies; where not (the pipeline would fail, e.g. on a 150 x 150 source whose codes
    describe 160 x 160) it is resized here to the codes' size (Pillow's bicubic)."""
    rows, cols = grid
    size = (cols * PIXELS_PER_TOKEN, rows * PIXELS_PER_TOKEN)
    if tuple(side // multiple_of * multiple_of for side in picture.size) == size:
        return picture
    return picture.resize(size)


def pil_image(image: Any) -> Any:
    """A PIL image from a PIL image or (H, W, 3) / (1, H, W, 3) floats in 0..1 (a ComfyUI IMAGE)."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, torch.Tensor) and image.dim() == 4:
        if image.shape[0] != 1:
            raise ValueError(f"GLM-Image takes one source image per prompt, got a batch of {image.shape[0]}")
        image = image[0]
    if not isinstance(image, torch.Tensor) or image.dim() != 3 or image.shape[-1] != 3:
        raise ValueError("image must be a PIL image or an (H, W, 3) tensor of floats in 0..1")
    return Image.fromarray((image.clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy())


def load_image_tokenizer(folder: Path, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """The AR model of `folder` without its language model and head: the vision tower and VQ that turn a source
    image into codes (transformers' own get_image_features / get_image_tokens)."""
    from transformers import GlmImageConfig, GlmImageForConditionalGeneration

    spec = HFNetwork(GlmImageConfig, GlmImageForConditionalGeneration, ("model.language_model", "lm_head"),
                     "model.visual", "GLM-Image", HINT)
    return read_hf_network(folder, spec, dtype, "none").to(device)


def load_decoder(folder: Path, processor: Any, device: torch.device, dtype: torch.dtype) -> Any:
    """The pipeline's decoding parts from `folder`; the AR model is not loaded again (never run there)."""
    diffusers = require_diffusers()
    from transformers import AutoTokenizer, T5EncoderModel

    parts = dict(tokenizer=AutoTokenizer.from_pretrained(str(folder / "tokenizer")),
                 text_encoder=T5EncoderModel.from_pretrained(str(folder / "text_encoder"), dtype=dtype),
                 vae=diffusers.AutoencoderKL.from_pretrained(str(folder / "vae"), torch_dtype=dtype),
                 transformer=diffusers.GlmImageTransformer2DModel.from_pretrained(str(folder / "transformer"),
                                                                                   torch_dtype=dtype),
                 scheduler=diffusers.FlowMatchEulerDiscreteScheduler.from_pretrained(str(folder / "scheduler")))
    pipeline = diffusers.GlmImagePipeline(processor=processor, vision_language_encoder=None, **parts)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline.to(device)


def detect(folder: Path) -> bool:
    """A GLM-Image folder: model_index.json naming GlmImagePipeline, or its AR subfolder's config."""
    folder = Path(folder)
    try:
        index = folder / "model_index.json"
        if index.is_file():
            return read_json(index).get("_class_name") == PIPELINE_CLASS
        return config_model_type(folder / AR_FOLDER) == MODEL_TYPE
    except ModelLoadError:
        return False


def check_layout(folder: Path) -> None:
    """Every published part present: the AR model, the processor and the decoder's subfolders."""
    missing = [name for name in (AR_FOLDER, PROCESSOR_FOLDER, *DECODER_FOLDERS) if not (folder / name).is_dir()]
    if missing:
        raise ModelLoadError(f"{folder} lacks the GLM-Image subfolder(s) {', '.join(missing)}; {HINT}")
    config = folder / AR_FOLDER / "config.json"
    if not config.is_file():
        raise ModelLoadError(f"{folder / AR_FOLDER} has no config.json; {HINT}")
    model_type = read_json(config).get("model_type")
    if model_type != MODEL_TYPE:
        raise ModelLoadError(f"{config} has model_type {model_type!r}, not {MODEL_TYPE!r}: not GLM-Image's AR model")


def memory_estimate(folder: Path) -> MemoryEstimate:
    """The AR stage, from the weight files' headers (its decoder layers quantisable, its KV cache): what sampling
    holds; the decoding stage loads only to decode (decoder_weights), so a host may offload one for the other."""
    folder = Path(folder)
    return estimate_from_shapes(checkpoint_shapes(weight_files(folder / AR_FOLDER)), UNUSED_WEIGHTS, CACHE_TOKENS)


def decoder_weights(folder: Path) -> int:
    """How many weights the DiT, VAE and glyph encoder hold (loaded at the compute dtype by the first decode)."""
    return sum(math.prod(shape) for name in DECODER_PARTS
               for shape in checkpoint_shapes(weight_files(Path(folder) / name)).values())


def sampling_defaults(folder: Path) -> Sampling:
    """The temperature, top-k and top-p the pipeline samples the AR model in `folder` with: its `generate(...,
    do_sample=True)` over the folder's generation_config.json and transformers' global defaults (the published
    file sets temperature 0.9 and top_p 0.75, and leaves top_k to the global 50)."""
    return generate_sampling(folder, {"do_sample": True})


def load(folder: Path, device: torch.device, dtype: torch.dtype, quantize: str = "none") -> GlmImageModel:
    """Load the AR stage of a GLM-Image folder onto `device`, computing in `dtype`, its decoder layers' linear
    layers at `quantize` precision (quantize.PRECISIONS); the DiT and VAE load on the first decode."""
    folder = Path(folder)
    if dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        raise ValueError(f"dtype must be float32, bfloat16, float16 (or float64 for tests), got {dtype}")
    check_layout(folder)
    require_transformers()
    ar = folder / AR_FOLDER
    check_safetensors_weights(ar, HINT)
    from transformers import GlmImageConfig, GlmImageForConditionalGeneration, GlmImageProcessor

    try:
        processor = GlmImageProcessor.from_pretrained(str(folder / PROCESSOR_FOLDER))
    except Exception as err:  # transformers raises many types for incomplete tokenizer folders
        raise ModelLoadError(f"{folder / PROCESSOR_FOLDER} is not a readable GLM-Image processor "
                             f"({type(err).__name__}: {err}); {HINT}") from err
    net = read_hf_network(ar, HFNetwork(GlmImageConfig, GlmImageForConditionalGeneration, UNUSED_MODULES,
                                        "model.language_model", "GLM-Image", HINT), dtype, quantize)
    model = GlmImageModel(net, processor, folder, sampling_defaults(ar))  # slices lm_head to the image codes
    quantize_then_move(net, net.model.language_model, "none", dtype, device)
    return model
