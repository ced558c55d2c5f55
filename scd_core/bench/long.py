"""Cost per model call along an 8k-token image: is the per-call overhead flat in position?

A random-weight Emu3-Gen-shaped model (the real vocabulary and id layout, 32768
image codes, the 720 px 90 x 91 + 3 = 8193-token layout with CFG rows; a narrow,
shallow backbone so that a CPU finishes) is run through the real adapter and
engine.  Every call's forward and sampling time is recorded with the position it
started at; the table averages the calls starting near ~100, ~2000 and ~8000.
The attention over the cache is the only work that should grow with position.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence, Union

import torch

from ..decoding.config import SamplerConfig
from ..decoding.engine import IterationStats, generate
from ..models.loading import pick_device, pick_dtype

# Emu3-Gen's text vocabulary and special ids; the image codes are the last 32768 ids.
VOCAB, FIRST_CODE, CODES = 184622, 151854, 32768
SPECIAL_IDS = {"<|endoftext|>": 151643, "<|extra_200|>": 151846, "<|extra_201|>": 151847,
               "<|extra_203|>": 151849, "<|extra_204|>": 151850, "<|image start|>": 151851,
               "<|image end|>": 151852, "<|image token|>": 151853}
# The published Emu3-Gen 8B backbone, for the memory estimate.
EMU3_8B = dict(layers=32, kv_heads=8, head_dim=128)
POSITIONS = (100, 2000, 8000)
BUCKET = 128  # calls starting within this many positions after a target are averaged
PROMPT_TOKENS = 40


class _SpecialIds:
    """The two tokenizer look-ups Emu3Model makes, over Emu3's real special ids (no text is encoded here)."""

    def token_id(self, token: str) -> int:
        return SPECIAL_IDS[token]

    def special_id(self, role: str, default: str) -> int:
        return SPECIAL_IDS[default]


def small_emu3(device: torch.device, dtype: torch.dtype, hidden: int = 128, layers: int = 2) -> Any:
    """A random Emu3Model with the real vocabulary layout and a small backbone."""
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    from ..models.families.emu3 import Emu3Model

    text = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=9216,
                attention_dropout=0.0, initializer_range=0.5)
    vocabulary = {f"<|visual token {code:06d}|>": FIRST_CODE + code for code in range(CODES)}
    vq = dict(codebook_size=CODES, base_channels=32, channel_multiplier=[1, 1, 1, 1], num_res_blocks=1,
              attn_resolutions=[], hidden_size=32, num_attention_heads=1)  # never decoded here: kept tiny
    config = Emu3Config(text_config=text, vq_config=vq, vocabulary_map=vocabulary)
    torch.manual_seed(0)
    module = Emu3ForConditionalGeneration(config).to(device, dtype).eval().requires_grad_(False)
    return Emu3Model(module, _SpecialIds(), torch.arange(FIRST_CODE, FIRST_CODE + CODES))


def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, positions: int, rows: int, dtype_bytes: int) -> int:
    """Keys + values of a pre-allocated cache: fixed for the whole generation."""
    return 2 * layers * rows * kv_heads * positions * head_dim * dtype_bytes


def _run(model: Any, cond: Any, config: SamplerConfig) -> tuple[list[tuple[int, float, float]], Any]:
    calls: list[tuple[int, float, float]] = []
    start = [0]

    def record(stats: IterationStats) -> None:
        calls.append((start[0], stats.forward_s, stats.sample_s))
        start[0] = stats.total

    return calls, generate(model, cond, config, callback=record, sync_timing=True)


def long_benchmark(device: Union[str, torch.device, None] = None, dtype: Union[str, torch.dtype, None] = None,
                   window: int = 32, positions: Sequence[int] = POSITIONS, hidden: int = 128, layers: int = 2,
                   seed: int = 0, image_area: int = 720 * 720) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows (method, position, calls, forward_ms, sample_ms, call_ms) and a memory summary for one square image."""
    from .shapes import _reset_peak, peak_memory_mb
    from ..models.families.emu3 import Emu3Prompt

    device = pick_device(device)
    dtype = pick_dtype(dtype, device)
    model = small_emu3(device, dtype, hidden, layers)
    model.set_resolution("1:1", image_area)
    prompt = tuple(range(1000, 1000 + PROMPT_TOKENS))
    cond = Emu3Prompt(cond=prompt, uncond=prompt[: PROMPT_TOKENS // 2], size=model.size)
    rows = []
    for method, coupler, width in (("AR", "independent", 1), ("SCD-maximal", "maximal", window)):
        _reset_peak(device)
        started = time.perf_counter()
        calls, result = _run(model, cond, SamplerConfig(coupler=coupler, window=width, seed=seed))
        wall = time.perf_counter() - started
        for target in positions:
            near = [(f, s) for start, f, s in calls[1:] if target <= start < target + BUCKET]
            if not near:
                continue
            forward = 1000 * sum(f for f, _ in near) / len(near)
            sample = 1000 * sum(s for _, s in near) / len(near)
            rows.append(dict(method=method, window=width, position=target, calls=len(near), forward_ms=forward,
                             sample_ms=sample, call_ms=forward + sample, nfe=result.nfe, wall_s=wall,
                             peak_mem_mb=peak_memory_mb(device)))
    text = model.module.config.text_config
    positions_held = model.start(cond, 1).cache.capacity
    small_cache = kv_cache_bytes(text.num_hidden_layers, text.num_key_value_heads,
                                 text.hidden_size // text.num_attention_heads, positions_held, rows=2,
                                 dtype_bytes=torch.finfo(dtype).bits // 8)
    memory = dict(tokens=model.num_tokens, positions=positions_held, device=str(device),
                  dtype=str(dtype).replace("torch.", ""), hidden=text.hidden_size, layers=text.num_hidden_layers,
                  small_cache_mb=small_cache / 2**20,
                  emu3_8b_cache_gib=kv_cache_bytes(**EMU3_8B, positions=positions_held, rows=2, dtype_bytes=2) / 2**30,
                  window=window, logits_mb=2 * window * CODES * 4 / 2**20)
    return rows, memory


def long_table(device: Optional[str] = None, dtype: Optional[str] = None) -> str:
    from .tables import markdown

    rows, memory = long_benchmark(device, dtype)
    header = (f"Random-weight Emu3-Gen-shaped model (vocabulary {VOCAB}, {CODES} codes, {memory['layers']} layers "
              f"of width {memory['hidden']}), one {memory['tokens']}-token image (720 px) with CFG (2 rows), "
              f"{memory['device']} {memory['dtype']}; mean over the calls starting within {BUCKET} positions "
              "after each position")
    footer = (f"Memory for one {memory['tokens']}-token image with CFG: the KV cache is allocated once for "
              f"{memory['positions']} positions ({memory['small_cache_mb']:.1f} MB for this model; "
              f"{memory['emu3_8b_cache_gib']:.2f} GiB for Emu3-Gen 8B in bfloat16: 32 layers x 8 KV heads x 128 x "
              f"2 rows), plus {memory['logits_mb']:.0f} MB of float32 code logits per {memory['window']}-token "
              "window call.")
    return header + "\n\n" + markdown(rows, ("method", "window", "position", "calls", "forward_ms", "sample_ms",
                                             "call_ms", "nfe", "wall_s", "peak_mem_mb")) + "\n\n" + footer
