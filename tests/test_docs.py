"""The README documents every setting: a variable nobody can find is a variable nobody sets right."""

from __future__ import annotations

from pathlib import Path

import pytest

from usp_dispatcher.ucap.settings import UcapSettings
from usp_workers.settings import Settings

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_every_setting_is_in_the_readme_table(name: str) -> None:
    assert f"| `USP_{name.upper()}` |" in README, f"README's settings table lacks USP_{name.upper()}"


@pytest.mark.parametrize("name", sorted(UcapSettings.model_fields))
def test_every_content_setting_is_in_the_readme_table(name: str) -> None:
    assert f"| `USP_{name.upper()}` |" in README, f"README's settings table lacks USP_{name.upper()}"
