from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser
from sqlalchemy.engine import Engine

from tests.dispatcher.admin.browser import launched_chromium
from tests.dispatcher.admin.live import Live, running_service
from tests.dispatcher.conftest import MakeSettings, Serve


@pytest.fixture
def live(make_settings: MakeSettings, serve: Serve, engine: Engine, tmp_path: Path) -> Iterator[Live]:
    with running_service(make_settings, serve, engine, tmp_path) as service:
        yield service


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Per module, not per session: Playwright's sync API keeps an event loop running in this
    thread while it lives, and every async test after it would fail to start its own."""
    yield from launched_chromium()
