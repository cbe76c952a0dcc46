"""The fork-server children the pipeline tests start behave as ``python -c`` children would."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests import forked


def test_a_child_gets_its_folder_environment_session_output_and_exit_code(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    code = (
        "import os, sys\n"
        "env = os.environ.get\n"
        "print(os.getcwd(), env('PROBE'), env('PATH'), os.getpgid(0) == os.getpid())\n"
        "sys.stderr.write('to stderr\\n')\n"
        "raise SystemExit(3)\n"
    )
    assert os.environ.get("PATH"), "ours has PATH; the child's environment is only what it is given"
    child = forked.start(code, cwd=tmp_path, env={"PROBE": "given"}, log=log)
    assert child.wait(30) == 3
    assert child.poll() == child.returncode == 3
    assert log.read_text() == f"{tmp_path} given None True\nto stderr\n"


def test_output_is_unbuffered_and_killpg_ends_the_child(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    log.write_text("")  # as ServiceProcess opens it before the child starts
    code = "import time\nprint('started')\ntime.sleep(60)\n"
    child = forked.start(code, cwd=tmp_path, env={}, log=log)
    deadline = time.monotonic() + 30
    while "started" not in log.read_text():  # printed, not held in a buffer until exit
        assert child.poll() is None
        assert time.monotonic() < deadline, "the child's first line never reached the file"
        time.sleep(0.01)
    os.killpg(child.pid, signal.SIGKILL)
    assert child.wait(30) == -signal.SIGKILL
