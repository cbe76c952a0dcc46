"""The docs keep up with the code: every setting in the README, every module on the architecture
page, every path the prose names."""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path

import pytest

from tests import generated_docs


def test_the_architecture_page_maps_every_module() -> None:
    page = generated_docs.PAGE.read_text()
    assert page == generated_docs.rendered(page), (
        "docs/architecture.md's module map is stale: run `uv run python -m tests.generated_docs --write`"
    )


def test_the_readme_settings_tables_are_the_settings_classes() -> None:
    readme = generated_docs.README.read_text()
    assert readme == generated_docs.rendered_readme(readme), (
        "the README's settings tables differ from the settings classes: run "
        "`uv run python -m tests.generated_docs --write`"
    )


def test_a_missing_marker_is_an_error_not_a_silent_pass() -> None:
    with pytest.raises(ValueError, match="marker"):
        generated_docs.rendered("a page without its markers")


_SKIPPED = {
    ".git",
    ".venv",
    "node_modules",
    "dist",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
}
#: A word of path characters with a slash in it, or a Python file's name.
_TOKEN = re.compile(r"(?<![\w/.:-])([\w.-]+(?:/[\w.-]+)+/?|[\w-]+\.py)(?![\w/-])")
_EXTENSION = re.compile(r"\.(py|md|toml|ya?ml|json|mjs|ts|sh|html|css|js|lock)$")


@cache
def _tree() -> tuple[set[str], set[str]]:
    """The repository's files and folders, as paths relative to its root."""
    files: set[str] = set()
    folders: set[str] = set()
    for top, subfolders, names in os.walk(generated_docs.ROOT):
        subfolders[:] = [name for name in subfolders if name not in _SKIPPED]
        here = Path(top).relative_to(generated_docs.ROOT)
        folders.update((here / name).as_posix() for name in subfolders)
        files.update((here / name).as_posix() for name in names)
    return files, folders


def named_paths(text: str, folders: set[str]) -> list[tuple[int, str]]:
    """The paths a page names: a file name with its extension, or a slashed word that starts
    with one of the repository's folder names (``tools/call`` is a method, not a path)."""
    folder_names = {Path(folder).name for folder in folders}
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in _TOKEN.finditer(line):
            token = match.group(1).rstrip("/.")
            if _EXTENSION.search(token) or token.split("/")[0] in folder_names:
                found.append((number, token))
    return found


@pytest.mark.parametrize("page", ["README.md", "docs/architecture.md", "docs/scaling.md", "docs/protocol.md"])
def test_every_path_the_prose_names_exists(page: str) -> None:
    """A path counts as named if it is the repository's, or the end of one of its paths
    (``mcp/tools.py`` in a paragraph about the dispatcher)."""
    files, folders = _tree()
    known = files | folders
    missing = [
        f"{page}:{number}: {path}"
        for number, path in named_paths((generated_docs.ROOT / page).read_text(), folders)
        if path not in known and not any(k.endswith("/" + path) for k in known)
    ]
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_a_path_that_moved_is_caught() -> None:
    _, folders = _tree()
    text = (
        "The handlers, in `routes/scheduling.py`, are reached by `tools/call`; tables in workers/models.py."
    )
    assert [path for _, path in named_paths(text, folders)] == ["routes/scheduling.py", "workers/models.py"]
