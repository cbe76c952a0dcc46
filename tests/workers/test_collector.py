"""Worker processes run the cyclic garbage collector less often (see
``usp_workers.celery_app.WORKER_GC_THRESHOLDS`` for why and the measurement); nothing else that
imports the Celery app does."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest
from celery.signals import worker_init, worker_process_init

from usp_workers.celery_app import WORKER_GC_THRESHOLDS, app


@pytest.fixture
def restored_thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


@pytest.mark.parametrize("signal", [worker_init, worker_process_init])
def test_a_starting_worker_tunes_the_collector(restored_thresholds: None, signal: object) -> None:
    gc.set_threshold(700, 10, 10)
    signal.send(sender=app)  # type: ignore[attr-defined]
    assert gc.get_threshold() == WORKER_GC_THRESHOLDS
    assert WORKER_GC_THRESHOLDS[0] > 700


def test_importing_the_app_leaves_the_defaults() -> None:
    """The API and the scheduler import the Celery app as well; they keep Python's defaults."""
    code = "import gc; t = gc.get_threshold(); import usp_workers.celery_app; print(gc.get_threshold() == t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "True"
