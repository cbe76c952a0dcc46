"""The docs keep up with the code: every setting in the README, every module on the architecture page."""

from __future__ import annotations

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
