"""Benchmarks on real model folders and on Janus-Pro-shaped random networks.

`model_benchmark` runs AR, SJD and SCD on anything `load_model` accepts and
reports NFE and where the time went.  `shape_benchmark` needs no weights: it
builds the backbone and image head of Janus-Pro-1B or -7B (or Lumina-mGPT-7B's
Chameleon backbone and image-code head) with random weights and measures what
one L-token window costs after a cached prompt,
relative to one token -- the number that turns an NFE saving into a speed-up.
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from typing import Any, Iterable, Optional, Union

import torch

from ..decoding.config import SamplerConfig
from ..decoding.engine import generate
from ..models.loading import load_model, pick_device, pick_dtype
from ..models.weights.memory import release_memory
from ..models.weights.quantize import module_bytes, normalize_precision, quantize_linears

DEFAULT_PROMPT = "A portrait of young girl. masterpiece, film grained, best quality."

# Language backbones of the published checkpoints (DeepSeek-LLM 1.5B / 7B; full multi-head attention).
JANUS_SHAPES = {
    "1B": dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=16, intermediate_size=5632),
    "7B": dict(hidden_size=4096, num_hidden_layers=30, num_attention_heads=32, intermediate_size=11008),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128),  # tests
}
IMAGE_CODES = 16384
# Lumina-mGPT-7B: Chameleon-7B (q/k norms); its image head is the 8192 image-code rows of lm_head.
LUMINA_SHAPES = {
    "lumina-7b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                      intermediate_size=11008),
}
LUMINA_CODES = 8192
# Cached tokens before the timed window: a Janus prompt plus part of the image, or Lumina-mGPT's 768 px
# sequence (~70 prompt tokens + 2356 image tokens) near its end, where a call costs most.
DEFAULT_PREFIX = {"1B": 600, "7B": 600, "tiny": 16, "lumina-7b": 2300}
SHAPE_NAMES = {"1B": "Janus-Pro-1B", "7B": "Janus-Pro-7B", "tiny": "tiny Janus-Pro", "lumina-7b": "Lumina-mGPT-7B"}
MEMORY_SHARE = 0.5  # a shape benchmark may use at most this share of the free memory


def peak_memory_mb(device: torch.device) -> float:
    """Peak allocated accelerator memory since the last reset, or the process's peak RSS on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run_row(model: Any, cond: Any, label: str, config: SamplerConfig, batch_size: int) -> dict[str, Any]:
    device = model.device
    _reset_peak(device)
    result = generate(model, cond, config, batch_size=batch_size, sync_timing=True)
    started = time.perf_counter()
    model.decode(result.tokens)
    _sync(device)
    decode_s = time.perf_counter() - started
    return dict(method=label, coupler=config.coupler, window=config.window, seed=config.seed, nfe=result.nfe,
                tokens_per_call=result.tokens.shape[1] / result.nfe, prefill_s=result.prefill_s,
                forward_s=result.forward_s, sample_s=result.sample_s, decode_s=decode_s,
                total_s=result.total_s + decode_s, peak_mem_mb=peak_memory_mb(device))


def model_benchmark(path: str, couplers: Iterable[str] = ("independent", "maximal", "gumbel"),
                    windows: Iterable[int] = (16, 32), seeds: Iterable[int] = (0,), *,
                    prompt: str = DEFAULT_PROMPT, cfg_scale: Optional[float] = None, top_k: Optional[int] = None,
                    batch_size: int = 1, device: Union[str, torch.device, None] = None,
                    dtype: Union[str, torch.dtype, None] = None) -> list[dict[str, Any]]:
    """One row per (method, window, seed): AR (window 1) first, then each coupler at each window."""
    model = load_model(path, device=device, dtype=dtype)
    cond = model.encode(prompt)
    rows = []
    for seed in seeds:
        runs = [("AR", "independent", 1)] + [("SJD" if c == "independent" else f"SCD-{c}", c, w)
                                             for c in couplers for w in windows]
        for label, coupler, window in runs:
            config = SamplerConfig(coupler=coupler, window=window, seed=seed, cfg_scale=cfg_scale, top_k=top_k)
            rows.append(_run_row(model, cond, label, config, batch_size))
    return rows


def _free_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _layer_bytes(shape: dict[str, int], dtype: torch.dtype) -> int:
    hidden, inner = shape["hidden_size"], shape["intermediate_size"]
    return (4 * hidden * hidden + 3 * hidden * inner) * torch.finfo(dtype).bits // 8


def _build_backbone(shape: dict[str, int], layers: int, device: torch.device, dtype: torch.dtype):
    """A random Llama backbone plus Janus's image head, with the published layer sizes."""
    from transformers import LlamaConfig, LlamaModel
    from transformers.models.janus.modeling_janus import JanusVQVAEConfig, JanusVQVAEHead

    from ..models.weights.hf_folders import dtype_keyword

    config = LlamaConfig(**dict(shape, num_hidden_layers=layers), vocab_size=16, max_position_embeddings=16384)
    with torch.device(device):
        backbone = LlamaModel._from_config(config, **{dtype_keyword(): dtype}).eval()
        head_config = JanusVQVAEConfig(image_token_embed_dim=shape["hidden_size"],
                                       projection_dim=shape["hidden_size"], num_embeddings=IMAGE_CODES)
        head = JanusVQVAEHead(head_config).to(dtype).eval()
    return backbone, head


def _build_chameleon(shape: dict[str, int], layers: int, device: torch.device, dtype: torch.dtype):
    """A random Chameleon backbone plus a head over Lumina-mGPT's image codes, with the published layer sizes."""
    from transformers import ChameleonConfig, ChameleonModel

    from ..models.weights.hf_folders import dtype_keyword

    # the image encoder inside ChameleonModel is never run here: keep it tiny
    vq = dict(embed_dim=4, num_embeddings=16, latent_channels=4, base_channels=32, channel_multiplier=[1],
              num_res_blocks=1)
    config = ChameleonConfig(**dict(shape, num_hidden_layers=layers), vocab_size=16, max_position_embeddings=16384,
                             vq_config=vq, vocabulary_map={})
    with torch.device(device):
        backbone = ChameleonModel._from_config(config, **{dtype_keyword(): dtype}).eval()
        head = torch.nn.Linear(shape["hidden_size"], LUMINA_CODES, bias=False).to(dtype).eval()
    return backbone, head


def _window_timings(backbone: Any, head: Any, embeds: torch.Tensor, prefix: int, windows: list[int], repeats: int,
                    device: torch.device) -> dict[int, float]:
    """Median seconds of one window call (backbone and head) of each width after `prefix` cached embeddings,
    run as the families run it (scd_core.models.families.janus.RowBackbone over the engine's RowCache), each call
    rewound from the cache again."""
    from ..models.families.janus import RowBackbone
    from ..models.sessions.row_cache import RowCache

    rows = RowCache(embeds.shape[0], prefix + max(windows), prefix, device)
    run = RowBackbone(backbone, rows)
    timings: dict[int, float] = {}
    with torch.no_grad():
        run(embeds[:, :prefix])
        for window in windows:
            samples = []
            for attempt in range(repeats + 1):  # the first call warms up kernels and allocator
                _sync(device)
                started = time.perf_counter()
                head(run(embeds[:, prefix:prefix + window]))
                _sync(device)
                if attempt:
                    samples.append(time.perf_counter() - started)
                rows.rewind(window)
            timings[window] = statistics.median(samples)
    return timings


def shape_benchmark(size: str = "1B", windows: Iterable[int] = (1, 2, 4, 8, 16, 32, 64),
                    device: Union[str, torch.device, None] = None, dtype: Union[str, torch.dtype, None] = None, *,
                    layers: Optional[int] = None, prefix: Optional[int] = None, batch_size: int = 1,
                    repeats: int = 5, quantize: str = "none") -> list[dict[str, Any]]:
    """cost(L) / cost(1) of one L-token window forward (cond + uncond rows) after `prefix` cached tokens,
    the backbone's linear layers at `quantize` precision (the head stays at `dtype`, as the loaders keep it).

    `layers` defaults to the full depth, reduced to what fits in half the free
    memory (a 7B in float32 needs ~24 GB); time per window scales linearly with
    depth, so rows also give the per-layer time and the full-depth estimate.
    """
    if size not in SHAPE_NAMES:
        raise ValueError(f"size must be one of {', '.join(SHAPE_NAMES)}, got {size!r}")
    windows = sorted(set(windows))
    if not windows or windows[0] < 1:
        raise ValueError(f"windows must be positive integers, got {windows}")
    shape = LUMINA_SHAPES[size] if size in LUMINA_SHAPES else JANUS_SHAPES[size]
    prefix = DEFAULT_PREFIX[size] if prefix is None else prefix
    device = pick_device(device)
    dtype = pick_dtype(dtype, device)
    full_depth = shape["num_hidden_layers"]
    fitting = int(_free_memory_bytes(device) * MEMORY_SHARE // _layer_bytes(shape, dtype))
    depth = min(layers or full_depth, full_depth, fitting)
    if depth < 1:
        raise ValueError(f"not even one {size} layer fits in the free memory of {device}")
    build = _build_chameleon if size in LUMINA_SHAPES else _build_backbone
    backbone, head = build(shape, depth, device, dtype)
    quantize_linears(backbone, normalize_precision(quantize), dtype)
    weight_bytes = module_bytes(backbone) + module_bytes(head)
    release_memory()  # the full-precision layers just replaced
    _reset_peak(device)  # the peak of the calls, not of building at full precision
    rows_in_batch = 2 * batch_size  # the CFG double batch
    generator = torch.Generator(device="cpu").manual_seed(0)
    embeds = torch.randn(rows_in_batch, prefix + max(windows), shape["hidden_size"], generator=generator)
    timings = _window_timings(backbone, head, (embeds * 0.02).to(device, dtype), prefix, windows, repeats, device)
    base = timings[windows[0]] if windows[0] == 1 else None
    peak_mb = peak_memory_mb(device)
    return [dict(size=size, window=window, seconds=seconds, ratio=None if base is None else seconds / base,
                 per_layer_ms=1000 * seconds / depth, full_depth_s=seconds * full_depth / depth,
                 layers=depth, full_layers=full_depth, prefix=prefix, batch_rows=rows_in_batch,
                 device=str(device), dtype=str(dtype).replace("torch.", ""), quantize=quantize,
                 weight_gb=weight_bytes / 2**30, peak_mem_gb=peak_mb / 1024)
            for window, seconds in timings.items()]


# ----------------------------------------------------------------------------- memory at the published shapes

CARDS_GIB = (8, 12, 16, 24, 48, 80)
MEMORY_MARGIN = 0.2  # activations and allocator slack, as the loader node's "auto" assumes


def _meta_shapes(module: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(p.shape) for name, p in module.state_dict().items()}


def _janus_shapes(size: str) -> dict[str, tuple[int, ...]]:
    from transformers import JanusConfig, JanusForConditionalGeneration

    text = dict(JANUS_SHAPES[size], vocab_size=102400, model_type="llama")
    hidden = text["hidden_size"]
    config = JanusConfig(text_config=text, vq_config=dict(projection_dim=hidden, image_token_embed_dim=hidden))
    with torch.device("meta"):
        return _meta_shapes(JanusForConditionalGeneration(config))


def _emu3_shapes() -> dict[str, tuple[int, ...]]:
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    with torch.device("meta"):  # transformers' defaults are Emu3-Gen's sizes
        return _meta_shapes(Emu3ForConditionalGeneration(Emu3Config(vocabulary_map={})))


# Emu3.5 / Emu3.5-Image: the paper's 34.1B = 31.2B in the layers + 2.9B of embeddings (input and untied head over
# 151854 text + 131072 visual ids) is Qwen3-32B's layer geometry; the published config.json is not read here.
EMU3P5_SHAPE = dict(hidden_size=5120, num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8,
                    head_dim=128, intermediate_size=25600, vocab_size=151854 + 131072)


def _emu3p5_shapes() -> dict[str, tuple[int, ...]]:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    with torch.device("meta"):  # the network as emu3p5.load builds it (the IBQ decoder is not counted)
        return _meta_shapes(Qwen3ForCausalLM(Qwen3Config(**EMU3P5_SHAPE, tie_word_embeddings=False)))


def _lumina_shapes() -> dict[str, tuple[int, ...]]:
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    from ..models.tokenizers.taming import DecoderSpec, VQDecoder

    with torch.device("meta"):  # transformers' defaults are Chameleon-7B's sizes; the VQGAN as chameleon_vqgan.py
        shapes = _meta_shapes(ChameleonForConditionalGeneration(ChameleonConfig(vocabulary_map={})))
        spec = DecoderSpec(codebook_size=8192, embed_dim=256, z_channels=256, widths=(128, 128, 256, 256, 512),
                           num_res_blocks=2, attn_levels=frozenset(), spatial_norm=False)
        shapes.update({f"vq.{k}": v for k, v in _meta_shapes(VQDecoder(spec)).items()})
    return shapes


def _cosmos_shapes(size: str) -> dict[str, tuple[int, ...]]:
    from ..models.families.cosmos import SIZES, CosmosTransformer

    with torch.device("meta"):
        return _meta_shapes(CosmosTransformer(SIZES[size]))  # plus the DV8x16x16 tokenizer (TorchScript), not counted


# The T5 encoders text-conditional models load (google-t5/t5-11b for Cosmos Video2World; transformers' classes)
T5_SHAPES = {"T5-11B": dict(d_model=1024, d_kv=128, d_ff=65536, num_layers=24, num_heads=128, vocab_size=32128,
                            feed_forward_proj="relu")}


def _t5_shapes(name: str) -> dict[str, tuple[int, ...]]:
    from transformers import T5Config, T5EncoderModel

    with torch.device("meta"):
        return _meta_shapes(T5EncoderModel(T5Config(**T5_SHAPES[name])))


# MammothModa2's LLMs: the text models of Qwen2.5-VL-7B (Preview) and Qwen3-VL-8B (Dev), a generation FFN beside
# `mlp` in the expert layers, gen_embed_tokens and gen_head over 32800 generation ids.  The published config.json
# was not read: Preview's experts in layers 14..27 (the older vLLM-Omni code's), Dev's in 20 of 36 layers (its
# "about 3B" of experts at 151M a layer); the vision tower (used for image input only) is not counted.
MAMMOTH_SHAPES = {
    "Preview": ("qwen2", dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                              intermediate_size=18944, vocab_size=152064), range(14, 28)),
    "Dev": ("qwen3", dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                          head_dim=128, intermediate_size=12288, vocab_size=151936), range(16, 36)),
}
# the DiT, VAE and Q-Former refiner: 5.49 GiB in bf16 (Preview, vLLM-Omni's load log); Dev's "2B DiT" taken alike
MAMMOTH_DECODER_WEIGHTS = int(5.49 * 2**30 / 2)


def _mammoth_shapes(variant: str) -> dict[str, tuple[int, ...]]:
    from transformers import Qwen2Config, Qwen3Config

    from ..models.families.mammothmoda2 import MammothNetwork

    layers, text, experts = MAMMOTH_SHAPES[variant]
    config = (Qwen2Config if layers == "qwen2" else Qwen3Config)(**text, tie_word_embeddings=False)
    config.gen_vocab_size, config.gen_vocab_start_index, config.expert_layers = 32800, 152064, tuple(experts)
    with torch.device("meta"):
        shapes = _meta_shapes(MammothNetwork(config))
    # the text head (never loaded) and the decoder, counted by its published size
    return dict(shapes, **{"llm_model.lm_head.weight": (text["vocab_size"], text["hidden_size"]),
                           "gen_transformer.published": (MAMMOTH_DECODER_WEIGHTS,)})


def _sliced(shapes: dict[str, tuple[int, ...]], head: str, rows: int) -> dict[str, tuple[int, ...]]:
    """The shapes after generation-only loading keeps `rows` rows of `head`."""
    return dict(shapes, **{head: (rows, *shapes[head][1:])})


def _memory_row(name: str, published: Any, loaded: Any, cfg_rows: int) -> dict[str, Any]:
    """One row of the memory table: the weights per precision, the cache, the decoder and each card's choice."""
    from ..models.weights.memory import fitting_precision

    bf16, gib = torch.bfloat16, 2**30
    row = dict(model=name, published_bf16_gib=published.weight_bytes("none", bf16) / gib,
               bf16_gib=loaded.weight_bytes("none", bf16) / gib, int8_gib=loaded.weight_bytes("int8", bf16) / gib,
               nf4_gib=loaded.weight_bytes("nf4", bf16) / gib, tokens=loaded.tokens,
               kv_cache_gib=loaded.cache_bytes(loaded.tokens, cfg_rows, bf16) / gib,
               decoder_gib=loaded.decoder_weights * 2 / gib if loaded.decoder_weights else "")
    for card in CARDS_GIB:
        fitting = fitting_precision(loaded, bf16, card * gib, cfg_rows, ("none", "int8", "nf4"), MEMORY_MARGIN)
        row[f"{card}_gib"] = {None: "-", "none": "bf16"}.get(fitting, fitting)
    return row


def _mammoth_rows() -> list[dict[str, Any]]:
    """MammothModa2 Preview and Dev with the DiT beside the LLM, and with the LLM offloaded after the re-encode."""
    from ..models.families import mammothmoda2
    from ..models.families.mammothmoda2_memory import staged_estimate
    from ..models.weights.memory import estimate_from_shapes

    rows = []
    for variant in MAMMOTH_SHAPES:
        shapes = _mammoth_shapes(variant)
        published = estimate_from_shapes(shapes, tokens=mammothmoda2.CACHE_TOKENS)
        for offload in (False, True):
            loaded = staged_estimate(shapes, mammothmoda2.UNUSED_WEIGHTS, mammothmoda2.CACHE_TOKENS, offload)
            name = f"MammothModa2-{variant} + DiT" + (", LLM offloaded after the re-encode" if offload else "")
            rows.append(_memory_row(name, published, loaded, 2))
    return rows


def published_memory_rows() -> list[dict[str, Any]]:
    """Weights (bf16 / int8 / nf4) and KV cache with CFG at each family's published shape and default image,
    after generation-only loading, and the most precise weights that fit each card (weights + cache, 20% more)."""
    from ..models.families import cosmos, emu3, emu3p5, janus, lumina
    from ..models.weights.memory import estimate_from_shapes, t5_encoder_estimate

    families = [  # name, shapes as published, shapes loaded, dropped prefixes, cached tokens, CFG rows, T5
        ("Janus-Pro-1B", _janus_shapes("1B"), None, janus.UNUSED_WEIGHTS, janus.CACHE_TOKENS, 2, None),
        ("Janus-Pro-7B", _janus_shapes("7B"), None, janus.UNUSED_WEIGHTS, janus.CACHE_TOKENS, 2, None),
        ("Lumina-mGPT-7B (768 px)", _lumina_shapes(), "lm_head.weight:8192", lumina.UNUSED_WEIGHTS,
         lumina.CACHE_TOKENS, 2, None),
        ("Emu3-Gen (720 px)", _emu3_shapes(), "lm_head.weight:32768", emu3.UNUSED_WEIGHTS, emu3.CACHE_TOKENS, 2,
         None),
        ("Emu3.5-Image 34B (1024 px)", _emu3p5_shapes(), "lm_head.weight:131072", (), emu3p5.CACHE_TOKENS, 2,
         None),
        ("Cosmos-1.0-4B", _cosmos_shapes("4B"), None, (), cosmos.CACHE_TOKENS, 1, None),
        ("Cosmos-1.0-12B", _cosmos_shapes("12B"), None, (), cosmos.CACHE_TOKENS, 1, None),
        ("Cosmos-1.0-5B-Video2World + T5-11B", _cosmos_shapes("5B-Video2World"), None, (), cosmos.CACHE_TOKENS, 1,
         "T5-11B"),
        ("Cosmos-1.0-13B-Video2World + T5-11B", _cosmos_shapes("13B-Video2World"), None, (), cosmos.CACHE_TOKENS, 1,
         "T5-11B"),
    ]
    rows = []
    for name, shapes, head, unused, tokens, cfg_rows, text_encoder in families:
        published = estimate_from_shapes(shapes, tokens=tokens)
        if head is not None:
            head_name, head_rows = head.split(":")
            shapes = _sliced(shapes, head_name, int(head_rows))
        loaded = estimate_from_shapes(shapes, unused, tokens)
        if text_encoder is not None:  # loaded too, at the model's precision
            text = t5_encoder_estimate(_t5_shapes(text_encoder))
            published, loaded = published.plus(text), loaded.plus(text)
        rows.append(_memory_row(name, published, loaded, cfg_rows))
    return rows + _mammoth_rows()


def memory_table() -> str:
    from .tables import markdown

    return ("Bytes at the published shapes (transformers' classes and ours built on the meta device, counted "
            "by `scd_core.models.weights.memory`, the loader's own estimate), compute dtype bf16. `published`: every "
            "weight of the checkpoint; the others: what generation-only loading keeps, the backbone's linear "
            "layers at bf16 / int8 / nf4. KV cache: keys + values of every layer for `tokens` positions (prompt "
            "and image) and both CFG rows (Cosmos: one row), batch 1. A card column names the most precise "
            "weights whose weights + cache, 20% more, fit in that many GiB (\"-\": none does). A T5 text encoder "
            "is loaded at the model's precision and counted (Video2World: T5-11B's encoder, `published` too); "
            "LlamaGen (FLAN-T5-XL for t2i) is not in the table; the Cosmos video tokenizer (TorchScript) "
            "and Emu3.5's IBQ decoder (float32; the whole IBQ tokenizer has 455M parameters) are not counted, "
            "and Emu3.5's layer sizes are Qwen3-32B's, which its published 31.2B + 2.9B parameters match. "
            "MammothModa2 (derived, its config.json not read: `MAMMOTH_SHAPES`): the text model of Qwen2.5-VL-7B "
            "(Preview) / Qwen3-VL-8B (Dev) with a generation FFN in its expert layers, the vision tower not "
            "counted, a 64 x 64 grid's cache; `decoder_gib`: its DiT, VAE and refiner at the compute dtype (5.49 "
            "GiB in bf16, vLLM-Omni's Preview load log; Dev's taken alike), beside the LLM, or alone once the LLM "
            "is offloaded after the re-encode (the card columns then count the larger stage).\n\n"
            + markdown(published_memory_rows(), ("model", "published_bf16_gib", "bf16_gib", "int8_gib", "nf4_gib",
                                                 "tokens", "kv_cache_gib", "decoder_gib",
                                                 *(f"{c}_gib" for c in CARDS_GIB))))


def quantized_cost_rows(size: str = "1B", precisions: Iterable[str] = ("none", "int8", "nf4"),
                        windows: Iterable[int] = (1, 16, 64), device: Union[str, torch.device, None] = None,
                        dtype: Union[str, torch.dtype, None] = None, layers: Optional[int] = None,
                        repeats: int = 9, prefix: Optional[int] = None) -> list[dict[str, Any]]:
    """`shape_benchmark` rows per precision (weights, peak memory of the calls, cost per call), each with
    `vs_full_w1`: its cost relative to full precision at the narrowest window on the same machine."""
    windows = tuple(windows)
    rows = [row for precision in precisions
            for row in shape_benchmark(size, windows, device, dtype, layers=layers, repeats=repeats,
                                       quantize=precision, prefix=prefix)]
    base = next(row["seconds"] for row in rows if row["quantize"] == "none" and row["window"] == min(windows)) \
        if any(row["quantize"] == "none" for row in rows) else rows[0]["seconds"]
    for row in rows:
        row["vs_full_w1"] = row["seconds"] / base
    return rows


def quantized_cost_table(size: str = "1B", precisions: Iterable[str] = ("none", "int8", "nf4"),
                         windows: Iterable[int] = (1, 16, 64), device: Union[str, torch.device, None] = None,
                         dtype: Union[str, torch.dtype, None] = None, layers: Optional[int] = None,
                         repeats: int = 9) -> str:
    """Cost of one window forward per precision, relative to full precision at window 1 on the same machine
    (medians of `repeats` calls: the ratios between precisions are what a shared CPU can tell)."""
    from .tables import markdown

    rows = quantized_cost_rows(size, precisions, windows, device, dtype, layers, repeats)
    first = rows[0]
    return (f"{SHAPE_NAMES[size]}-shaped backbone with random weights, one window after a {first['prefix']}-token "
            f"prefix, CFG double batch, {first['device']} {first['dtype']}, {first['layers']} of "
            f"{first['full_layers']} layers; `ratio`: against window 1 at the same precision, `vs_full_w1`: "
            f"against full precision at window 1\n\n"
            + markdown(rows, ("quantize", "window", "seconds", "ratio", "vs_full_w1", "per_layer_ms")))
