"""Worker processes run the cyclic garbage collector less often and switch threads more often
(see ``usp_workers.runtime.celery_app.WORKER_GC_THRESHOLDS`` and ``WORKER_SWITCH_INTERVAL`` for why and
the measurements); nothing else that imports the Celery app does."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest
from celery.signals import worker_init, worker_process_init

from usp_workers.runtime.celery_app import WORKER_GC_THRESHOLDS, WORKER_SWITCH_INTERVAL, app


@pytest.fixture
def restored_interpreter() -> Iterator[None]:
    thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
    yield
    gc.set_threshold(*thresholds)
    sys.setswitchinterval(interval)


@pytest.mark.parametrize("signal", [worker_init, worker_process_init])
def test_a_starting_worker_tunes_the_interpreter(restored_interpreter: None, signal: object) -> None:
    gc.set_threshold(700, 10, 10)
    sys.setswitchinterval(0.005)
    signal.send(sender=app)  # type: ignore[attr-defined]
    assert gc.get_threshold() == WORKER_GC_THRESHOLDS
    assert WORKER_GC_THRESHOLDS[0] > 700
    assert sys.getswitchinterval() == pytest.approx(WORKER_SWITCH_INTERVAL)
    assert WORKER_SWITCH_INTERVAL < 0.005


def test_importing_the_app_leaves_the_defaults() -> None:
    """The API and the scheduler import the Celery app as well; they keep Python's defaults."""
    code = (
        "import gc, sys; t, i = gc.get_threshold(), sys.getswitchinterval(); "
        "import usp_workers.runtime.celery_app; "
        "print(gc.get_threshold() == t and sys.getswitchinterval() == i)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "True"
