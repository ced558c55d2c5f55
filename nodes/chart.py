"""The SCD Stats chart, drawn with PIL: tokens committed per model call (bars) and draft acceptance (line).

A bar's forced tokens (given cells of an image in the prompt, row-ends) sit on top of its sampled ones in a
colour of their own: the model never sampled them, so they say nothing about how well drafts were accepted.

Drawn for the ~250-300 px a node gives an image preview: a small canvas with large type, so the text
stays readable when the frontend scales it down (about 0.6x at 280 px wide).  Its colours are the sampler's
live chart's (web/js/scd_widget.js): grey for a call that sampled one token, green for more, purple for
forced tokens, a gold line at one token per call.
"""

from __future__ import annotations

from typing import Sequence

from PIL import Image, ImageDraw, ImageFont

WIDTH, HEIGHT = 480, 300
TITLE_SIZE, LABEL_SIZE = 26, 20  # pixels; about 15 and 12 px on screen at a 280 px wide node
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 44, 60, 84, 34
BAR_FILL = 0.8  # share of an iteration's slot its bar covers, so neighbouring bars stay apart
BACKGROUND, AXIS, TEXT = "#1b1b1b", "#9a9a9a", "#e0e0e0"
AR_BAR, SCD_BAR, BASELINE = "#7a7a7a", "#4caf50", "#d0a040"  # one token in a call, several, the one-token line
FORCED_BAR = "#9575cd"  # tokens a call committed without sampling them
LINE = "#4c9be8"  # acceptance
DASH = 6  # pixels of the one-token line's dashes and gaps


def _font(size: int) -> ImageFont.ImageFont:
    # Pillow >= 10.1 ships a scalable default font; older Pillow has only the small bitmap one
    try:
        return ImageFont.load_default(size=size)
    except TypeError:
        return ImageFont.load_default()


def committed_chart(committed: list[int], acceptance: list[float], title: str,
                    forced: Sequence[int] = ()) -> Image.Image:
    """Bars: tokens committed per iteration (left axis), `forced` of them (per iteration; none if empty) on top
    in their own colour; line: mean draft acceptance 0..1 (right axis)."""
    image = Image.new("RGB", (WIDTH, HEIGHT), BACKGROUND)
    draw = ImageDraw.Draw(image)
    title_font, label_font = _font(TITLE_SIZE), _font(LABEL_SIZE)
    left, top = MARGIN_LEFT, MARGIN_TOP
    right, bottom = WIDTH - MARGIN_RIGHT, HEIGHT - MARGIN_BOTTOM
    plot_w, plot_h = right - left, bottom - top
    iterations = max(len(committed), 1)
    peak = max(committed, default=1)
    tallest = max(peak, 2)  # room above the one-token line even when no call beat it

    step = plot_w / iterations
    forced = list(forced) or [0] * len(committed)
    for i, (count, given) in enumerate(zip(committed, forced)):
        x0, x1 = left + i * step, left + i * step + max(step * BAR_FILL - 1, 0)
        sampled_top = bottom - plot_h * (count - given) / tallest
        if count > given:
            draw.rectangle([x0, sampled_top, x1, bottom], fill=SCD_BAR if count - given > 1 else AR_BAR)
        if given:
            draw.rectangle([x0, bottom - plot_h * count / tallest, x1, sampled_top], fill=FORCED_BAR)
    one_token_y = bottom - plot_h / tallest
    for x in range(left, right, 2 * DASH):
        draw.line([(x, one_token_y), (min(x + DASH, right), one_token_y)], fill=BASELINE, width=2)
    if len(acceptance) > 1:
        points = [(left + (i + 0.5) * step, bottom - plot_h * min(max(a, 0.0), 1.0))
                  for i, a in enumerate(acceptance)]
        draw.line(points, fill=LINE, width=3)

    draw.line([(left, top), (left, bottom), (right, bottom), (right, top)], fill=AXIS, width=2)
    draw.text((left - 6, top), str(tallest), fill=AXIS, font=label_font, anchor="ra")
    draw.text((left - 6, one_token_y), "1", fill=BASELINE, font=label_font, anchor="rm")
    draw.text((right + 6, top), "100%", fill=LINE, font=label_font, anchor="la")
    draw.text((right + 6, bottom), "0%", fill=LINE, font=label_font, anchor="ls")
    draw.text((left, bottom + 6), f"model call 1 .. {len(committed)}", fill=AXIS, font=label_font)

    draw.text((12, 10), title, fill=TEXT, font=title_font)
    legend_y = 48
    draw.rectangle([12, legend_y + 3, 28, legend_y + 19], fill=SCD_BAR)
    draw.text((34, legend_y), "tokens per call", fill=SCD_BAR, font=label_font)
    line_x = 34 + draw.textlength("tokens per call", font=label_font) + 24
    draw.line([(line_x, legend_y + 11), (line_x + 18, legend_y + 11)], fill=LINE, width=3)
    draw.text((line_x + 24, legend_y), "acceptance", fill=LINE, font=label_font)
    if any(forced):
        box_x = line_x + 24 + draw.textlength("acceptance", font=label_font) + 20
        draw.rectangle([box_x, legend_y + 3, box_x + 16, legend_y + 19], fill=FORCED_BAR)
        draw.text((box_x + 22, legend_y), "forced", fill=FORCED_BAR, font=label_font)
    return image
