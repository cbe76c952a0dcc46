"""The parts of the docs generated from the code: the module map of docs/architecture.md (from the
module docstrings) and the README's settings tables (from the settings classes).

``uv run python -m tests.generated_docs --write`` rewrites them; ``tests/test_docs.py`` fails when
the docs and the code differ.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from pydantic_settings import BaseSettings

from usp_core.settings import CommonSettings
from usp_dispatcher.settings import ApiSettings
from usp_dispatcher.ucap.settings import UcapSettings
from usp_workers.settings import SchedulerSettings, WorkerSettings

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
README = ROOT / "README.md"
PACKAGES = (
    ("schemas", "usp_schemas"),
    ("receiver", "usp_receiver"),
    ("workers", "usp_core"),
    ("workers", "usp_workers"),
    ("dispatcher", "usp_dispatcher"),
)
BEGIN, END = "<!-- module map: begin -->", "<!-- module map: end -->"
#: The README's settings tables: one per process kind (each with the fields it adds to the ones
#: it builds on), and the content server's.
SETTINGS_TABLES: dict[str, type[BaseSettings]] = {
    "settings of every process": CommonSettings,
    "api settings": ApiSettings,
    "worker settings": WorkerSettings,
    "scheduler settings": SchedulerSettings,
    "content settings": UcapSettings,
}


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


def own_fields(settings: type[BaseSettings]) -> list[str]:
    """The fields ``settings`` declares itself, not inherited from another settings class."""
    bases = [
        base for base in settings.__bases__ if issubclass(base, BaseSettings) and base is not BaseSettings
    ]
    inherited = {name for base in bases for name in base.model_fields}
    return [name for name in settings.model_fields if name not in inherited]


def settings_table(settings: type[BaseSettings]) -> str:
    """The fields ``settings`` adds to its bases as ``| USP_NAME | default | description |``."""
    rows = ["| variable | default | what it does |", "|---|---|---|"]
    for name in own_fields(settings):
        field = settings.model_fields[name]
        default = _spelled(field.default)
        cells = (f"`USP_{name.upper()}`", f"`{default}`" if default else "", field.description or "")
        rows.append("|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|")
    return "\n".join(rows) + "\n"


def _spelled(value: object) -> str:
    """A default as its environment variable would spell it."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, tuple):
        return ",".join(_spelled(item) for item in value)
    return str(value)


def _between(text: str, begin: str, end: str, content: str) -> str:
    head, found, rest = text.partition(begin)
    if not found:
        raise ValueError(f"no {begin} marker")
    _, found, tail = rest.partition(end)
    if not found:
        raise ValueError(f"no {end} marker")
    return f"{head}{begin}\n{content}{end}{tail}"


def rendered(page: str) -> str:
    """docs/architecture.md's text ``page`` with its module map replaced by the current one."""
    return _between(page, BEGIN, END, module_map())


def rendered_readme(readme: str) -> str:
    """The README's text with its settings tables replaced by the current ones."""
    for name, settings in SETTINGS_TABLES.items():
        begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
        readme = _between(readme, begin, end, settings_table(settings))
    return readme


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.generated_docs --write")
    PAGE.write_text(rendered(PAGE.read_text()))
    README.write_text(rendered_readme(README.read_text()))
