"""scd_core.images.image_prompt, without ComfyUI: which cells a mask regenerates, and that a continuation is encoded at
the size its conditioning was made for (the nodes' side is in test_nodes.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from emu3_fixture import tiny_emu3_dir  # noqa: F401  (fixture)

from scd_core import SamplerConfig, generate, load_model
from scd_core.decoding.given import GivenCells
from scd_core.images.image_prompt import add_image, fitted_mask, regenerated_cells


def test_a_cell_is_regenerated_where_any_of_its_pixels_is_masked() -> None:
    mask = torch.zeros(1, 10, 10)
    mask[0, 4, 4] = 1.0  # one pixel: cell (1, 1) of a 4 x 4 grid at 2.5 px a cell (and the cells its bin shares)
    mask[0, 0, 9] = 0.49  # below half: not masked
    mask[0, 9, 0] = 0.5  # half: masked
    cells = regenerated_cells(mask, 4, 4)[0]
    assert cells[1, 1] and cells[3, 0] and not cells[0, 3]
    assert int(cells.sum()) <= 3  # a pixel on a bin's edge may count for its neighbour too, never further
    exact = torch.zeros(1, 8, 8)
    exact[0, 2:4, 4:6] = 1.0
    expected = torch.zeros(4, 4, dtype=torch.bool)
    expected[1, 2] = True
    assert torch.equal(regenerated_cells(exact, 4, 4)[0], expected)


def test_a_continuation_is_encoded_at_its_conditioning_s_size(tiny_emu3_dir: Path) -> None:
    """Emu3 carries the size in its prompt: a cond made at 3 x 4 cells gets 3 x 4 cells of tokens even after the
    model was asked for another size, and the kept rows (row-ends included) come back from the engine."""
    model = load_model(tiny_emu3_dir, "cpu", torch.float32)
    model.set_image_size(32, 24)
    cond = model.encode("a red square")
    model.set_image_size(64, 64)  # another node asked for another size since
    image = torch.rand(1, 24, 32, 3, generator=torch.Generator().manual_seed(0))
    prompt = add_image(model, cond, image, keep_top=0.67)  # 2 of 3 rows
    given = prompt.cond
    assert isinstance(given, GivenCells) and prompt.note == "kept the top 2 of 3 token rows, sampling the 1 below"
    assert given.tokens.shape == (1, 3 * 5 + 3) and int(given.keep.sum()) == 2 * 5
    result = generate(model, given, SamplerConfig(window=4, seed=1))
    assert torch.equal(result.tokens[:, :10], given.tokens[:, :10])
    with pytest.raises(ValueError, match=r"keep_top must be a share of the image's rows in 0..1, got 1.5"):
        add_image(model, cond, image, keep_top=1.5)


@pytest.mark.parametrize("fit,rows", [("crop", [0]), ("pad", [0, 1])])
def test_a_mask_of_another_aspect_is_fitted_to_the_grid_as_the_image_is(fit: str, rows: list[int]) -> None:
    """The top quarter of a landscape image's rows: a centre crop keeps the rows as they are (grid row 0 of 4); a
    fit inside the square (padded above and below) moves them into the middle, over grid rows 0 and 1."""
    mask = torch.zeros(1, 48, 64)
    mask[:, :12] = 1.0
    model = SimpleNamespace(image_encoder=SimpleNamespace(fit=fit))
    cells = regenerated_cells(fitted_mask(model, mask, 4, 4), 4, 4)[0]
    assert cells.any(1).nonzero().flatten().tolist() == rows and bool(cells[rows].all())
