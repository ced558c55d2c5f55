"""Markdown tables, and writing them between a README's bench markers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence


def markdown(rows: list[dict], columns: Sequence[str]) -> str:
    def cell(value: Any) -> str:
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def write_readme(readme: Path, section: str, text: str) -> None:
    """Replace the text between <!-- bench:SECTION --> and <!-- /bench:SECTION -->."""
    source = readme.read_text()
    pattern = re.compile(rf"(<!-- bench:{section} -->\n).*?(<!-- /bench:{section} -->)", re.S)
    if not pattern.search(source):
        raise SystemExit(f"{readme} has no <!-- bench:{section} --> ... <!-- /bench:{section} --> markers")
    readme.write_text(pattern.sub(lambda m: m.group(1) + text + "\n" + m.group(2), source))
