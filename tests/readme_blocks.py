"""The README's code blocks, for the tests that run them as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def block_after(marker: str, language: str) -> str:
    """The first ``language`` code block of the README after the line holding ``marker``."""
    _, found, rest = README.read_text(encoding="utf-8").partition(marker)
    assert found, f"the README has no {marker!r}"
    block = re.search(rf"^```{language}\n(.*?)^```", rest, flags=re.MULTILINE | re.DOTALL)
    assert block is not None, f"no {language} block after {marker!r} in the README"
    return block.group(1)
