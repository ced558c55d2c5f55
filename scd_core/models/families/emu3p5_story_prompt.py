"""The prompts of an Emu3.5 interleaved run (story, howto, explore), with or without reference images, and the
size of its images that the references decide.

From the authors' code (github.com/baaivision/Emu3.5 at 8fcf1da: configs/example_config_visual_guidance.py and
configs/config.py build_unc_and_template, inference.py, src/utils/input_utils.py, src/utils/logits_processor.py):
- with images, the cond template is "...for {task} task.{extra} USER: {question}<|IMAGE|> ASSISTANT: <|extra_100|>"
  and the uncond one "<|extra_203|>You are a helpful assistant. USER: <|IMAGE|> ASSISTANT: <|extra_100|>";
  inference.py puts the references' strings, joined, where <|IMAGE|> stands in both.  Without images their
  templates are these with <|IMAGE|> dropped (two spaces after "USER:" in the uncond one);
- each string is build_image's: smart_resize to about `image_area` px (518400 in their interleaved configs), the
  IBQ codes, format_image_string (emu3p5.Emu3p5Model.reference_ids does the same);
- the processor's __init__ runs parse_hw on uncond ids that hold an <|image token|>: the last reference's grid,
  unless a target size is set and force_same_image_size is on (it returns at once).  inference.py keeps that flag
  on for one reference and turns it off for two or more, so a target size wins with one reference only;
- once a size is set, every image header is forced to it (the header step checks the size before the flag), and
  parse_hw never runs again (it runs only while none is set): every image takes that grid.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ...images.image_input import check_images
from .emu3p5 import BOS, X2I_UNCOND, Emu3p5Model

# each template split where the references go (<|IMAGE|>, which inference.py replaces in both)
TEMPLATE = ("<|extra_203|>You are a helpful assistant for {task} task.{extra} USER: {question}",
            " ASSISTANT: <|extra_100|>")
UNCOND = X2I_UNCOND  # the same uncond template as X2I's
EXTRA = {"howto": " Please generate a response with interleaved text and images."}  # example_config_visual_guidance
IMAGE_AREA = 518400  # configs/config.py image_area: the pixels a reference is resized to, about


def encode_references(model: Emu3p5Model, references: Sequence[torch.Tensor],
                      area: int) -> tuple[list[tuple[int, ...]], list[tuple[int, int]]]:
    """Each reference's ids (<|image start|> to <|image end|>) and grid (rows, cols); each reference is one
    picture, a ComfyUI IMAGE of (1, H, W, 3) or (H, W, 3)."""
    ids, grids = [], []
    for number, image in enumerate(references, 1):
        image = check_images(image)
        if image.shape[0] != 1:
            raise ValueError(f"reference image {number} is a batch of {image.shape[0]}: give each reference as "
                             "one picture")
        reference, grid = model.reference_ids(image, area)
        ids.append(reference)
        grids.append(grid)
    return ids, grids


def story_prompts(model: Emu3p5Model, question: str, task: str,
                  references: Sequence[tuple[int, ...]] = ()) -> tuple[list[int], list[int]]:
    """The cond and uncond ids of the authors' interleaved templates, the references' ids where <|IMAGE|> is."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError("an interleaved run needs a non-empty prompt")
    before = TEMPLATE[0].format(task=task, extra=EXTRA.get(task, ""), question=question)
    cond = spliced(model, (before, TEMPLATE[1]), references)
    if cond[0] != model._tokenizer.ids[BOS]:  # inference.py puts a BOS first when the template did not
        cond.insert(0, model._tokenizer.ids[BOS])
    return cond, spliced(model, UNCOND, references)


def spliced(model: Emu3p5Model, parts: tuple[str, str], references: Sequence[tuple[int, ...]]) -> list[int]:
    """The two parts tokenised with the references' ids between (each starts with a special token, where the
    tokenizer splits the text anyway); without references the parts joined, tokenised whole."""
    encode = model._tokenizer.encode
    if not references:
        return encode("".join(parts))
    return [*encode(parts[0]), *(token for reference in references for token in reference), *encode(parts[1])]


def story_size(size: Optional[tuple[int, int]], force_same_image_size: bool,
               grids: Sequence[tuple[int, int]]) -> Optional[tuple[int, int]]:
    """The grid every image of the run takes, None where the model writes the first one's: `size` without
    references or with one, else the last reference's (see the module's notes)."""
    if not grids:
        return size
    if not force_same_image_size:
        raise ValueError("with reference images every image takes one size (the last reference's, or the size "
                         "given with one reference): the model cannot write each image's size")
    if size is not None and len(grids) > 1:
        raise ValueError(f"with {len(grids)} reference images the authors' processor takes the last one's grid "
                         f"({grids[-1][0]} x {grids[-1][1]} codes) over any size given: give no size")
    return size or grids[-1]
