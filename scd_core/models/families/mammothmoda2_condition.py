"""What MammothModa2's DiT is conditioned on: a fresh, uncached forward of the language model over the prompt, the
sampled rows and <|image end|>, and one over the fixed negative prompt.

Each rule, with the authors' file (github.com/bytedance/mammothmoda: Preview on branch qwen25vl under mammothmoda2/,
Dev on main under mamoda2/mammothmoda2/):
- the sequence (utils/t2i_utils.py decode_diffusion_image): the prompt and generated ids, <|image end|> appended;
  the "answer" is its last 10 positions (answer_start_index = length - 10), the "question" the rest.
- the states (encode_full_prompts): Preview the last hidden state (after the final norm); Dev the mean of the
  hidden states config.json's gen_condition_layers names (transformers' hidden_states: the embeddings, each layer's
  output, the last one normed).
- which positions (encode_full_prompts): the text condition is every question position whose id is below
  gen_vocab_start_index (Dev: the whole sequence where gen_text_condition_with_answer), the image condition every
  answer position at or above it.  Preview reads config.json's gen_condition_mode (default "image") and passes the
  image condition through gen_image_condition_refiner, the text condition first; Dev's decode_diffusion_image takes
  gen_condition_mode "text_image" unless told otherwise, and its DiT condenses the image condition itself.
- the negative (model/processing_mammothmoda2.py DEFAULT_NEGATIVE_PROMPT, the chat template without a generation
  prompt): every position's states, no image condition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from .mammothmoda2_decode import DiTCondition
from .mammothmoda2_routing import routed_layer

NEGATIVE_PROMPT = ("deformed, blurry, over saturation, bad anatomy, disfigured, poorly drawn face, mutation, mutated, "
                   "extra_limb, ugly, poorly drawn hands, fused fingers, messy drawing, broken legs censor, censored, "
                   "censor_bar Create an image from the instruction.")
NEGATIVE_TEMPLATE = ("<|im_start|>system\nYou are a helpful image generator.<|im_end|>\n<|im_start|>user\n{prompt}"
                     "<|im_end|>\n")
ANSWER_TAIL = 10  # decode_diffusion_image: answer_start_index = input_ids.shape[1] - 10


@dataclass(frozen=True)
class ConditionRule:
    """What the condition is made of, from config.json."""

    layers: Optional[tuple[int, ...]]  # Dev's gen_condition_layers; None: the last hidden state (Preview)
    text: bool
    image: bool
    text_with_answer: bool = False


def condition_rule(config: dict, dev: bool) -> ConditionRule:
    """Preview: config.json's gen_condition_mode over the last hidden state; Dev: "text_image" over the mean of
    gen_condition_layers (a missing list is one ValueError)."""
    if not dev:
        mode = str(config.get("gen_condition_mode") or "image")
        return ConditionRule(None, "text" in mode, "image" in mode)
    layers = config.get("gen_condition_layers")
    if not isinstance(layers, list) or not layers or not all(isinstance(i, int) for i in layers):
        raise ValueError(f"config.json's gen_condition_layers must list hidden-state indices, got {layers!r}")
    return ConditionRule(tuple(layers), True, True, bool(config.get("gen_text_condition_with_answer", False)))


class FreshSlots:
    """attention_block's cache for one uncached forward: a call's keys and values are all there is."""

    @staticmethod
    def write(keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return keys, values


def hidden_states(net: Any, ids: torch.Tensor) -> list[torch.Tensor]:
    """(1, L) ids through MammothNetwork causally at positions 0..L-1: transformers' hidden_states list (the
    embeddings, each layer's output but the last, then the last normed)."""
    model = net.model
    embedded = net.embed(ids)
    hidden, route = embedded[..., :-1], embedded[..., -1:] > 0.5
    length = ids.shape[1]
    cos, sin = model.rotary_emb(hidden, torch.arange(length, device=ids.device)[None])
    groups = model.config.num_attention_heads // model.config.num_key_value_heads
    causal = torch.ones(length, length, dtype=torch.bool, device=ids.device).tril()
    mask = causal.repeat(groups, 1)[None, None]  # query rows grouped per key/value head, as attention_block folds
    states = [hidden]
    for layer in model.layers:
        hidden = routed_layer(layer, hidden, cos[:, None], sin[:, None], mask, FreshSlots(), groups, route=route)
        states.append(hidden)
    states[-1] = model.norm(hidden)
    return states


def condition_states(net: Any, ids: torch.Tensor, rule: ConditionRule) -> torch.Tensor:
    """(1, L, width): the last hidden state, or the mean of the rule's layers."""
    states = hidden_states(net, ids)
    if rule.layers is None:
        return states[-1]
    return torch.stack([states[index] for index in rule.layers]).mean(dim=0)


def positive_condition(net: Any, ids: torch.Tensor, rule: ConditionRule) -> DiTCondition:
    """The LLM's part of the DiT's condition from (1, L) ids (prompt, sampled rows and <|image end|>): the text
    states and the raw image states (`for_dit` finishes it on the decoder's side)."""
    states = condition_states(net, ids, rule)
    generation = ids[0] >= net.gen_start
    answer = torch.arange(ids.shape[1], device=ids.device) >= ids.shape[1] - ANSWER_TAIL
    text_positions = ~generation if rule.text_with_answer else ~generation & ~answer
    text = states[:, text_positions] if rule.text else states[:, :0]
    return DiTCondition(text, states[:, generation & answer] if rule.image else None)


def for_dit(condition: DiTCondition, rule: ConditionRule, refiner: Optional[torch.nn.Module]) -> DiTCondition:
    """What the DiT reads: Dev's as it is (its DiT's Q-Former condenses the image part); Preview's image part
    through its refiner (a decoder-stage module), after the text."""
    if rule.layers is not None or condition.image is None:
        return condition
    image = condition.image if refiner is None else refiner(condition.image)
    return DiTCondition(torch.cat([condition.text, image], dim=1))


def negative_condition(net: Any, ids: torch.Tensor, rule: ConditionRule) -> DiTCondition:
    """The negative prompt's states at every position, no image condition."""
    return DiTCondition(condition_states(net, ids, rule))
