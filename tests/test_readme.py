"""The README: its example runs as printed, its commands exist, install comes first, links resolve."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

README = Path(__file__).parent.parent / "README.md"


def test_bring_your_own_model_example_runs():
    section = README.read_text().split("### Bring your own model", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README example", "exec"), namespace)
    result = namespace["result"]
    assert result.tokens.shape == (2, 64)
    assert sum(result.committed) == 64 and result.nfe < 64


def test_the_library_example_prints_one_short_line_per_call(capsys):
    """`callback=print` shows each call's pace in a line, not the tensors it carries (about 110 KB once)."""
    section = README.read_text().split("## Library", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "callback=print" in code
    namespace: dict = {}
    exec(compile(code, "README library example", "exec"), namespace)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == namespace["result"].nfe + 1  # a line per call, then the example's own print
    assert max(map(len, lines)) <= 100 and lines[0].startswith("call 1: committed ")


def test_readme_commands_point_at_existing_entry_points():
    text = README.read_text()
    assert "bash tests/run.sh" in text
    assert "python -m scd_core generate --model demo" in text
    assert (README.parent / "tests" / "run.sh").is_file()
    ci = (README.parent / ".ci" / "run").read_text()
    assert "bash tests/run.sh" in ci


def pinned(name: str) -> str:
    """A version the test command pins: tests/run.sh's `NAME=VERSION` line."""
    return re.search(rf"^{name}=(\S+)", (README.parent / "tests" / "run.sh").read_text(), re.M).group(1)


def declared(package: str) -> str:
    """The range requirements.txt allows `package`, checked equal to pyproject.toml's."""
    lines = (README.parent / "requirements.txt").read_text().splitlines()
    (ranged,) = [Requirement(line.split("#")[0]) for line in lines if re.match(rf"{package}\b", line)]
    project = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]["dependencies"]
    assert [Requirement(line) for line in project if Requirement(line).name == package] == [ranged]
    return ranged.specifier


def test_the_versions_stated_as_tested_are_the_ones_the_test_command_installs():
    """The README's ranges are the project's, and its "tested on" versions the oldest and newest that tests/run.sh
    pins; this suite runs in the newest tier (run.sh's first venv), so the installed versions are the newest."""
    text = " ".join(README.read_text().split())
    for package in ("torch", "transformers"):
        stated = re.search(rf"{package} (>= [\d.]+(?:, < [\d.]+)?) \(tested on ([\d.]+) and ([\d.]+)[,;)]", text)
        assert stated, f"the README's {package} requirement"
        oldest, newest = pinned(f"OLDEST_{package.upper()}"), pinned(f"NEWEST_{package.upper()}")
        assert stated.group(2, 3) == (oldest, newest)
        assert Requirement(package + stated.group(1).replace(" ", "")).specifier == declared(package)
        assert Version(oldest) in declared(package) and Version(newest) in declared(package)
        assert Version(importlib.metadata.version(package)).base_version == newest


def test_the_first_comparison_is_the_one_the_readme_picture_shows():
    """The quick start's --compare command, its picture's generator and the table printed under it agree."""
    text = README.read_text()
    command = re.search(r"python -m scd_core generate (--model demo [^\n]*--compare[^\n]*) -o \S+\.png", text)
    assert command, "the quick start's comparison command"
    source = (README.parent / "tests" / "readme_images.py").read_text()
    args = re.search(r"COMPARE_ARGS = (\[.*?\])", source).group(1)
    assert command.group(1).split() == ast.literal_eval(args)
    assert "--seeds 0-7" in command.group(1)
    table = text.split(command.group(0), 1)[1].split("```")[2]  # the block after the command's
    assert table.split("\n")[1].split() == ["mode", "window", "calls", "sd", "range", "speedup", "acceptance",
                                             "wall", "s"]


DOCS = [README, README.parent / "scd_core" / "bench" / "README.md", *sorted((README.parent / "docs").glob("*.md"))]


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens (code blocks skipped)."""
    found, in_code = set(), False
    for line in page.read_text().splitlines():
        in_code ^= line.startswith("```")
        if not in_code and re.match(r"#{1,6} ", line):
            found.add(re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-"))
    return found


def test_install_comes_first_and_table_cells_stay_short():
    lines = README.read_text().splitlines()
    assert "## Install into ComfyUI" in lines[:40], "ComfyUI users look for the install section first"
    long_cells = [f"{page.name}:{number}" for page in DOCS
                  for number, line in enumerate(page.read_text().splitlines(), 1) if line.startswith("|")
                  for cell in line.strip().strip("|").split(" | ") if len(cell) > 400]
    assert not long_cells, f"table cells over 400 characters (details belong in docs/): {long_cells}"


def test_relative_links_and_anchors_resolve():
    broken = []
    for page in DOCS:
        for link in re.findall(r"\]\(([^)\s]+)\)|src=\"([^\"]+)\"", page.read_text()):
            target, _, anchor = (link[0] or link[1]).partition("#")
            if target.startswith("http"):
                continue
            path = (page.parent / target).resolve() if target else page
            if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
                broken.append(f"{page.relative_to(README.parent)}: {link[0] or link[1]}")
    assert not broken, broken


def test_the_opening_and_what_has_been_run_name_every_family():
    from scd_core.models.family import families

    paragraphs = README.read_text().split("\n\n")
    opening = next(text for text in paragraphs if text.startswith("Autoregressive (AR)"))
    has_run = next(text for text in paragraphs if text.startswith("**What has been run:**"))
    for text in (opening, has_run):
        flat = " ".join(text.split())
        assert [family.label for family in families() if family.label not in flat] == [], flat
