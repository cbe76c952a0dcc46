"""The docs keep up with the code: every setting in the README, every module on the architecture page."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import architecture
from usp_dispatcher.ucap.settings import UcapSettings
from usp_workers.settings import Settings

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_every_setting_is_in_the_readme_table(name: str) -> None:
    assert f"| `USP_{name.upper()}` |" in README, f"README's settings table lacks USP_{name.upper()}"


@pytest.mark.parametrize("name", sorted(UcapSettings.model_fields))
def test_every_content_setting_is_in_the_readme_table(name: str) -> None:
    assert f"| `USP_{name.upper()}` |" in README, f"README's settings table lacks USP_{name.upper()}"


def test_the_architecture_page_maps_every_module() -> None:
    page = architecture.PAGE.read_text()
    assert architecture.BEGIN in page
    assert architecture.END in page
    assert page == architecture.rendered(page), (
        "docs/architecture.md's module map is stale: run `uv run python -m tests.architecture --write`"
    )
