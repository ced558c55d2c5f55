"""`python -m scd_core story`: an interleaved Emu3.5 run (story, howto, explore) into a folder.

    python -m scd_core story --model models/scd/Emu3.5 --prompt "a hedgehog afraid of the dark" --out story/

writes story/image_01.png, image_02.png, ... and story/story.md (the text with its images in order), and prints
the calls it took.  The text is drawn as the authors draw it; the images by the sampler the flags choose.
`--image PATH` (repeatable) puts reference images into the prompts, as the authors' inference.py does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..models.families.emu3p5 import grid_for
from ..models.families.emu3p5_story import TASKS, StoryEvent, StoryOptions, StoryResult, decode_images, \
    generate_story
from .cli_shared import DEFAULTS, add_model_arguments, add_sampler_arguments, check_device, check_image_size, \
    decoder_settings, open_model, positive_int, sampler_config, to_pil

STORY_FILE = "story.md"
OPTIONS = StoryOptions()


def add_story_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model (the base Emu3.5; --width / --height force every image's size, "
                                      "else the model writes the first one's)")
    add_model_arguments(model)
    model.add_argument("--prompt", required=True, help="what the story or how-to is about")
    model.add_argument("--task", choices=TASKS, default=OPTIONS.task, help="the authors' interleaved task")
    sampler = add_sampler_arguments(parser)
    sampler.add_argument("--seed", type=int, default=DEFAULTS.seed, help=f"random seed (default: {DEFAULTS.seed})")
    text = parser.add_argument_group("text and sequence (default: the authors' configs/config.py)")
    text.add_argument("--max-new-tokens", type=positive_int, default=OPTIONS.max_new_tokens,
                      help=f"the sequence's new tokens at most (default: {OPTIONS.max_new_tokens})")
    text.add_argument("--text-temperature", type=float, default=OPTIONS.text_temperature)
    text.add_argument("--text-top-k", type=int, default=OPTIONS.text_top_k)
    text.add_argument("--text-top-p", type=float, default=OPTIONS.text_top_p)
    text.add_argument("--each-size", action="store_true",
                      help="let the model write every image's size (the authors keep the first one's)")
    images = parser.add_argument_group("reference images (the authors' inference.py: in both prompts; every image "
                                       "takes the last one's grid, or --width / --height with one reference)")
    images.add_argument("--image", type=Path, action="append", default=[], metavar="PATH",
                        help="a reference image file (repeat for several, in order)")
    images.add_argument("--image-area", type=positive_int, default=OPTIONS.image_area,
                        help=f"pixels each reference is resized to, about (default: {OPTIONS.image_area})")
    out = parser.add_argument_group("output")
    out.add_argument("--out", required=True, type=Path, help=f"folder for the images and {STORY_FILE} (created)")


def check_out(folder: Path) -> None:
    if (folder / STORY_FILE).exists():
        raise ValueError(f"--out {str(folder)!r} already holds {STORY_FILE}: choose another folder")
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--out {str(folder)!r} is not a folder")


def story_options(args: argparse.Namespace) -> StoryOptions:
    size = grid_for(args.width, args.height) if args.width else None
    options = StoryOptions(task=args.task, max_new_tokens=args.max_new_tokens, size=size,
                           force_same_image_size=not args.each_size, text_temperature=args.text_temperature,
                           text_top_k=args.text_top_k, text_top_p=args.text_top_p, image_area=args.image_area)
    options.check()
    return options


def read_reference(path: Path) -> torch.Tensor:
    """An image file as a ComfyUI IMAGE of one picture, (1, H, W, 3) levels / 255 (as Load Image gives it)."""
    try:
        with Image.open(path) as picture:
            pixels = np.array(picture.convert("RGB"))
    except (OSError, ValueError) as err:  # PIL's UnidentifiedImageError is an OSError
        raise ValueError(f"--image {str(path)!r} cannot be read as an image: {err}") from None
    return torch.from_numpy(pixels)[None].float() / 255


def report(event: StoryEvent) -> None:
    """One stderr line per finished image."""
    if event.finished is not None:
        print(f"image {event.image + 1} done ({event.new_tokens} tokens so far)", file=sys.stderr, flush=True)


def write_story(folder: Path, result: StoryResult, images: list) -> Path:
    """The images as PNGs and the Markdown file that shows them in order between the text."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for part in result.parts:
        if isinstance(part, str):
            lines.append(part.strip())
        else:
            name = f"image_{part + 1:02d}.png"
            to_pil(images[part][None]).save(folder / name, format="PNG")
            lines.append(f"![image {part + 1}]({name})")
    path = folder / STORY_FILE
    path.write_text("\n\n".join(line for line in lines if line) + "\n", encoding="utf-8")
    return path


def run_story(args: argparse.Namespace) -> int:
    config = sampler_config(args, seed=args.seed)  # every setting is checked before the weights are read
    check_image_size(args.width, args.height)
    options = story_options(args)
    check_device(args.device)
    check_out(args.out)
    references = [read_reference(path) for path in args.image]
    decoding = decoder_settings(args)
    model = open_model(args.model, args.device, args.dtype, args.quantize, 0, 0, args.compile, decoding,
                       args.offload_stages)
    result = generate_story(model, args.prompt, config, options, references=references, callback=report)
    path = write_story(args.out, result, decode_images(model, result))
    print(f"{len(result.images)} images, {len(result.tokens)} new tokens (stopped at {result.stop}); calls: "
          f"{result.text_calls} for the text and sizes, {result.image_calls} for the images")
    print(f"wrote {path}")
    return 0
