from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from ..conftest import MakeSettings, Serve
from .live import Live, running_service


@pytest.fixture
def live(make_settings: MakeSettings, serve: Serve, engine: Engine, tmp_path: Path) -> Iterator[Live]:
    with running_service(make_settings, serve, engine, tmp_path) as service:
        yield service
