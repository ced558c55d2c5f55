"""The README's 'Bring your own model' example runs as printed and beats AR in calls."""

from __future__ import annotations

import ast
import re
from pathlib import Path

README = Path(__file__).parent.parent / "README.md"


def test_bring_your_own_model_example_runs():
    section = README.read_text().split("### Bring your own model", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README example", "exec"), namespace)
    result = namespace["result"]
    assert result.tokens.shape == (2, 64)
    assert sum(result.committed) == 64 and result.nfe < 64


def test_readme_commands_point_at_existing_entry_points():
    text = README.read_text()
    assert "bash tests/run.sh" in text
    assert "python -m scd_core generate --model demo" in text
    assert (README.parent / "tests" / "run.sh").is_file()
    ci = (README.parent / ".ci" / "run").read_text()
    assert "bash tests/run.sh" in ci


def test_the_first_comparison_is_the_one_the_readme_picture_shows():
    """The quick start's --compare command, its picture's generator and the table printed under it agree."""
    text = README.read_text()
    command = re.search(r"python -m scd_core generate (--model demo [^\n]*--compare[^\n]*) -o \S+\.png", text)
    assert command, "the quick start's comparison command"
    source = (README.parent / "tests" / "readme_images.py").read_text()
    args = re.search(r"COMPARE_ARGS = (\[.*?\])", source).group(1)
    assert command.group(1).split() == ast.literal_eval(args)
    assert "--seeds 8" in command.group(1)
    table = text.split(command.group(0), 1)[1].split("```")[2]  # the block after the command's
    assert table.split("\n")[1].split() == ["mode", "window", "calls", "sd", "range", "speedup", "acceptance",
                                             "wall", "s"]
