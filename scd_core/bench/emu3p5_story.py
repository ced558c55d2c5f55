"""Model calls of an Emu3.5 story (the base model's interleaved task): text, three images of 720^2 area, text.

The authors' story samples images of `image_area` 518400 = 720^2 px: 45 rows of 45 codes (2070 positions with the
row ends and the image end), the first image's size written by the model, the later ones forced to it
(force_same_image_size).  Each image is sampled by the engine on the Emu3.5-shaped stand-in of `bench emu3p5`
(its layout, codebook and top-k), one seed per image; AR's image calls are one per position (the engine at
window 1, the forced cells too, as the authors' loop makes them), counted, not run.

The text is plain AR in every method (emu3p5_story: one call per text token on the cond row, whatever the window):
a segment of `text_tokens` (before the first image, between the images, after the last),
each <|image start|> one text call, and the first image's written size 5 more (its <|image token|> is forced and
rides with the image's first call).  With the cache kept across segments no switch costs a call of its own: the
image's first call feeds its header, the first text call after it the image end.
"""

from __future__ import annotations

from typing import Sequence

from ..decoding.config import SamplerConfig
from ..models.families.emu3p5_header import HEADER_STEPS
from .emu3p5 import BENCH_CODES, Emu3p5ShapedModel
from .nfe import measure
from .tables import markdown

SIDE = 45  # codes a side: 720 px / 16
IMAGES = 3
TEXT_TOKENS = 128  # per segment: a short paragraph


def text_calls(text_tokens: int, images: int = IMAGES) -> int:
    """The plain AR calls of a story of `images` images: its text (a segment of `text_tokens` before, between and
    after them), each image start, the first image's written size digits."""
    return (images + 1) * text_tokens + images + HEADER_STEPS - 1


def story_rows(model: Emu3p5ShapedModel, windows: Sequence[int], text_tokens: int) -> list[dict]:
    """Per method: the images' calls (image k at seed k), the text's, and the whole story's."""
    text = text_calls(text_tokens)
    rows = [dict(method="AR", window=1, image_calls=IMAGES * model.num_tokens)]
    for label, coupler in (("SCD-maximal", "maximal"), ("faithful", "faithful")):
        for window in windows:
            calls = sum(measure(model, None, SamplerConfig(coupler=coupler, window=window), [seed])["nfe"]
                        for seed in range(IMAGES))
            rows.append(dict(method=label, window=window, image_calls=calls))
    for row in rows:
        row["text_calls"], row["story_calls"] = text, row["image_calls"] + text
        row["speedup"] = rows[0]["story_calls"] / row["story_calls"]
        row["images_speedup"] = rows[0]["image_calls"] / row["image_calls"]
    return rows


def story_tables(windows: Sequence[int], codes: int = BENCH_CODES, text_tokens: int = TEXT_TOKENS) -> str:
    """The calls of AR, SCD and faithful for the whole story."""
    model = Emu3p5ShapedModel(SIDE, SIDE, codes)
    table = story_rows(model, windows, text_tokens)
    return (f"{IMAGES} images of {SIDE} x {SIDE} codes ({model.num_tokens} positions each), {codes} codes, top-k "
            f"{model.default_top_k}; {IMAGES + 1} text segments of {text_tokens} tokens ({text_calls(text_tokens)} "
            f"plain AR calls with the image starts and the first size)\n\n"
            + markdown(table, ("method", "window", "image_calls", "text_calls", "story_calls", "speedup",
                               "images_speedup")))
