"""The module map of docs/architecture.md, generated from the module docstrings.

``uv run python -m tests.architecture --write`` rewrites it; ``tests/test_docs.py`` fails when
the page and the code differ (a module added, moved or described anew).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
PACKAGES = (
    ("schemas", "usp_schemas"),
    ("receiver", "usp_receiver"),
    ("workers", "usp_workers"),
    ("dispatcher", "usp_dispatcher"),
)
BEGIN, END = "<!-- module map: begin -->", "<!-- module map: end -->"


def summary(path: Path) -> str:
    """The docstring's first sentence (or its first paragraph, when that is shorter)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    sentence, dot, _ = paragraph.partition(". ")
    text = sentence + "." if dot else paragraph
    # reStructuredText to Markdown: ``code`` and :role:`target` become `code`.
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    return text.replace("|", "\\|")


def module_map() -> str:
    """One table per package: every module (migration versions left out) and what it is for."""
    parts: list[str] = []
    for folder, package in PACKAGES:
        parts += [f"### `{package}` ({folder}/)", "", "| module | what it is for |", "|---|---|"]
        base = ROOT / folder / package
        for path in sorted(base.rglob("*.py")):
            relative = path.relative_to(base)
            if "versions" in relative.parts or path.name == "__main__.py":
                continue
            name = ".".join((package, *relative.with_suffix("").parts)).removesuffix(".__init__")
            parts.append(f"| `{name}` | {summary(path) or '—'} |")
        parts.append("")
    return "\n".join(parts)


def rendered(page: str) -> str:
    """``page`` with its module map replaced by the current one."""
    head, _, rest = page.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{module_map()}{END}{tail}"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.architecture --write")
    PAGE.write_text(rendered(PAGE.read_text()))
