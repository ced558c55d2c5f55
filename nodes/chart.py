"""The SCD Stats chart, drawn with PIL: tokens committed per model call (bars) and draft acceptance (line)."""

from __future__ import annotations

from PIL import Image, ImageDraw, ImageFont

WIDTH, HEIGHT = 768, 384
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 48, 56, 36, 36
BAR_FILL = 0.8  # share of an iteration's slot its bar covers, so neighbouring bars stay apart
BACKGROUND, AXIS, BAR, LINE, TEXT = "#1e1e1e", "#9a9a9a", "#4c9be8", "#f2a541", "#e6e6e6"


def committed_chart(committed: list[int], acceptance: list[float], title: str) -> Image.Image:
    """Bars: tokens committed per iteration (left axis); line: mean draft acceptance 0..1 (right axis)."""
    image = Image.new("RGB", (WIDTH, HEIGHT), BACKGROUND)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    left, top = MARGIN_LEFT, MARGIN_TOP
    right, bottom = WIDTH - MARGIN_RIGHT, HEIGHT - MARGIN_BOTTOM
    plot_w, plot_h = right - left, bottom - top
    iterations = max(len(committed), 1)
    peak = max(committed, default=1)

    step = plot_w / iterations
    for i, count in enumerate(committed):
        x0 = left + i * step
        bar_top = bottom - plot_h * count / peak
        draw.rectangle([x0, bar_top, x0 + max(step * BAR_FILL - 1, 0), bottom], fill=BAR)
    if len(acceptance) > 1:
        points = [(left + (i + 0.5) * step, bottom - plot_h * min(max(a, 0.0), 1.0))
                  for i, a in enumerate(acceptance)]
        draw.line(points, fill=LINE, width=2)

    draw.line([(left, top), (left, bottom), (right, bottom), (right, top)], fill=AXIS)
    draw.text((left - 6, top), str(peak), fill=BAR, font=font, anchor="ra")
    draw.text((left - 6, bottom), "0", fill=BAR, font=font, anchor="rs")
    draw.text((right + 6, top), "100%", fill=LINE, font=font, anchor="la")
    draw.text((right + 6, bottom), "0%", fill=LINE, font=font, anchor="ls")
    draw.text((left, bottom + 8), f"model call 1 .. {len(committed)}", fill=AXIS, font=font)
    draw.text((left, 10), title, fill=TEXT, font=font)
    draw.text((right, 10), "tokens/call", fill=BAR, font=font, anchor="ra")
    draw.text((right, 22), "acceptance", fill=LINE, font=font, anchor="ra")
    return image
