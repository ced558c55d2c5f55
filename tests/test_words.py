"""The words a user reads about a setting say the same thing wherever they are: the sampler node's help page
(web/docs/SCDSampler.md), its tooltips, `python -m scd_core generate --help` and the README.  Checked here:
with the faithful coupler any window reproduces a seed (no page tells a user to pin the window for that alone),
candidates are refused with the default coupler, and each paper the README cites has its year and arXiv id."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from test_nodes import comfy, inputs_of, node_classes, pack  # noqa: F401  (fixtures and a helper)

from scd_core.decoding import couplers
from scd_core.decoding.config import DEFAULT_COUPLER
from scd_core.frontends.cli import main

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
HELP_PAGE = REPO / "web" / "docs" / "SCDSampler.md"
REFUSED = couplers.names_where("candidates", False)  # the couplers that refuse candidates


def flat(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def help_row(name: str) -> str:
    """The help page's table row of input `name`."""
    return flat(re.search(rf"^\| `{name}` \|(.*)$", HELP_PAGE.read_text(), re.M).group(1))


def readme_setting(name: str) -> str:
    """The README's "Choosing settings" line of `name`."""
    return flat(re.search(rf"^- `{name}`(.*)$", README.read_text(), re.M).group(1))


def cli_option(capsys: pytest.CaptureFixture, option: str) -> str:
    """`generate --help`'s entry of `option`, its wrapped lines joined."""
    assert main(["generate", "--help"]) == 0
    entries = re.split(r"\n  (?=-)", capsys.readouterr().out.split("\noptions:", 1)[1])
    return next(flat(entry) for entry in entries if entry.startswith(option + " "))


@pytest.fixture(scope="module")
def tooltips(node_classes: dict[str, Any]) -> dict[str, str]:  # noqa: F811  (the imported fixture)
    return {name: flat(spec[1].get("tooltip", "")) for name, spec in inputs_of(node_classes["SCDSampler"]).items()}


def says_any_window_reproduces(text: str) -> bool:
    return DEFAULT_COUPLER in text and any(words in text for words in ("any window", "never the image"))


def test_faithful_reproduces_at_any_window_wherever_the_window_or_seed_is_explained(tooltips, capsys):
    assert DEFAULT_COUPLER == "faithful"  # the words below are the default coupler's
    texts = {"help page: window": help_row("window"), "help page: seed": help_row("seed"),
             "tooltip: window": tooltips["window"], "tooltip: seed": tooltips["seed"],
             "README: window": readme_setting("window"), "--window": cli_option(capsys, "--window")}
    assert [where for where, text in texts.items() if not says_any_window_reproduces(text)] == []
    pinning = [where for where, text in texts.items() if re.search(r"\b[Pp]in", text) or "pinned" in text]
    # where pinning is advised, it is for the other couplers only
    assert all(re.search(r"(with the other couplers|with the others)[^.;]*\bpin", texts[where]) for where in pinning)


def test_candidates_are_refused_with_the_default_coupler_in_every_place_that_offers_them(tooltips, capsys):
    assert DEFAULT_COUPLER in REFUSED
    texts = {"help page": help_row("candidates"), "tooltip": tooltips["candidates"],
             "README": readme_setting("candidates"), "--candidates": cli_option(capsys, "--candidates")}
    for where, text in texts.items():
        assert re.search(rf"[Rr]efused with {DEFAULT_COUPLER}, the default coupler", text), where
        assert all(name in text for name in REFUSED), where
    assert "(default: 1)" in texts["--candidates"]  # the word "default" did not hide the option's own default


def test_every_paper_the_readme_cites_has_its_year_and_arxiv_id():
    section = README.read_text().split("## Papers", 1)[1].split("\n## ", 1)[0]
    entries = [flat(entry) for entry in re.split(r"\n- ", "\n" + section.strip())[1:]]
    assert len(entries) >= 4
    missing = [entry[:40] for entry in entries
               if not re.search(r"arXiv \d{4}\.\d{4,5}, (19|20)\d\d\b", entry)]
    assert missing == []


def test_a_newcomer_reads_what_it_is_a_picture_install_and_a_first_image_before_the_internals():
    text = README.read_text()
    order = [text.index(marker) for marker in ("Autoregressive (AR) image", "![The SCD Sampler node",
                                               "## Install into ComfyUI", "## Quick start", "pause_malloc_graph")]
    assert order == sorted(order)
    assert "### ComfyUI versions" not in text.split("## Quick start", 1)[0]
