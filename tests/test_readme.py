"""The README's 'Bring your own model' example runs as printed and beats AR in calls."""

from __future__ import annotations

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
