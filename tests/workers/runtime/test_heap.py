"""Service processes freeze their start-up heap once they are up, so that full collections skip
it (see ``usp_workers.runtime.heap`` for why and the measurements). Each case runs in a fresh
interpreter: freezing is once per process, and the test process's own heap is not the subject."""

from __future__ import annotations

import subprocess
import sys


def run_python(code: str) -> list[str]:
    argv = [sys.executable, "-c", code]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout.split()


def test_the_first_call_freezes_what_is_alive_and_later_calls_do_nothing() -> None:
    code = (
        "import gc; from usp_workers.runtime.heap import freeze_startup_heap\n"
        "before = [[] for _ in range(1000)]\n"
        "first = freeze_startup_heap(); frozen = gc.get_freeze_count()\n"
        "after = [[] for _ in range(1000)]\n"
        "second = freeze_startup_heap()\n"
        "scanned = {id(o) for o in gc.get_objects()}\n"
        "print(first, second, frozen >= 1000, gc.get_freeze_count() == frozen,"
        " any(id(o) in scanned for o in before), all(id(o) in scanned for o in after))"
    )
    first, second, froze_them, froze_nothing_more, before_scanned, after_scanned = run_python(code)
    assert (first, second) == ("True", "False")
    assert froze_them == "True"
    assert froze_nothing_more == "True"
    assert before_scanned == "False"  # frozen: no longer in any generation the collector scans
    assert after_scanned == "True"


def test_a_forked_child_freezes_its_own_heap_once() -> None:
    """A prefork pool's child inherits the parent's 'already frozen' mark with its memory; it
    must still freeze what its own start-up made."""
    code = (
        "import os; from usp_workers.runtime.heap import freeze_startup_heap\n"
        "freeze_startup_heap()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(0 if (freeze_startup_heap(), freeze_startup_heap()) == (True, False) else 1)\n"
        "print(os.waitpid(pid, 0)[1] == 0)"
    )
    assert run_python(code) == ["True"]


def test_a_worker_freezes_once_ready_and_importing_the_app_does_not() -> None:
    code = (
        "import gc; from celery.signals import worker_ready, worker_process_init\n"
        "from usp_workers.runtime.celery_app import app\n"
        "imported = gc.get_freeze_count()\n"
        "worker_ready.send(sender=app)\n"
        "print(imported, gc.get_freeze_count() > 0)"
    )
    assert run_python(code) == ["0", "True"]


def test_a_prefork_child_freezes_once_initialised() -> None:
    code = (
        "import gc; from celery.signals import worker_process_init\n"
        "from usp_workers.runtime.celery_app import app\n"
        "worker_process_init.send(sender=app)\n"
        "print(gc.get_freeze_count() > 0)"
    )
    assert run_python(code) == ["True"]
