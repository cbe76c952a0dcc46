"""The README's promise, from a fresh clone: its two commands are what it says, and the one that
runs the service works in an empty folder with no settings.

The working tree can hide what a newcomer would hit (an uncommitted file, a virtual environment
that happens to hold a package the lock file lacks), so this clones the repository's committed
``HEAD`` into a temporary folder and runs ``uv run usp-webhooks up`` from there, the way the
README says, with ``--project`` pointing at the clone and the working directory an empty folder
(so its SQLite files land there). ``UV_FROZEN=1``: the committed ``uv.lock`` is used as is, and
the shared uv cache makes the clone's environment quick to build. The other command
(``uv run pytest``) is CI's job; here it is only checked to be the one the README shows.

Only loopback targets are allowed (the test's receiver is on 127.0.0.1), and a free port is
used instead of 8000; otherwise no ``USP_*`` setting reaches the service.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.dispatcher.cli.test_up import Up, assert_up_delivers_and_stops
from tests.servers import free_port, running

REPO = Path(__file__).resolve().parents[1]
SECTION = "## The two commands"
#: The first ``up`` also builds the clone's virtual environment (from the uv cache).
FIRST_START_TIMEOUT = 300.0
GIT_TIMEOUT = 120.0


def readme_commands(readme: str) -> list[str]:
    """The commands of the first code block under :data:`SECTION`, comments stripped.

    >>> readme_commands("## The two commands\\n\\n```sh\\nuv run pytest   # all\\n```\\n")
    ['uv run pytest']
    """
    _, found, rest = readme.partition(SECTION + "\n")
    assert found, f"the README has no {SECTION!r} section"
    section = re.split(r"^## ", rest, maxsplit=1, flags=re.MULTILINE)[0]
    block = re.search(r"^```[a-z]*\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    assert block is not None, f"no code block under {SECTION!r}"
    lines = (line.split("#", 1)[0].strip() for line in block.group(1).splitlines())
    return [line for line in lines if line]


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's committed ``HEAD``, cloned into a temporary folder."""
    git = shutil.which("git")
    if git is None or not (REPO / ".git").exists():
        pytest.fail(f"the README test clones the repository: needs git and a checkout at {REPO}")
    target = tmp_path_factory.mktemp("readme") / "usp-webhooks"
    subprocess.run(
        [git, "clone", "--quiet", "--no-local", str(REPO), str(target)],
        check=True,
        timeout=GIT_TIMEOUT,
        capture_output=True,
    )
    return target


def test_the_readme_shows_the_two_commands(clone: Path) -> None:
    commands = readme_commands((clone / "README.md").read_text())
    assert commands == ["uv run usp-webhooks up", "uv run pytest"]


@pytest.fixture
def up_from_clone(clone: Path, tmp_path: Path) -> Iterator[Up]:
    """``uv run usp-webhooks up`` from the clone, in an empty folder, on a free port."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("uv is not on PATH: the README's commands need it (pip install uv)")
    folder = tmp_path / "service"
    folder.mkdir()
    extra: dict[str, str | None] = {
        "UV_FROZEN": "1",
        # Ours (`uv run pytest`) point at the working tree's environment, not the clone's.
        "VIRTUAL_ENV": None,
        "UV_PROJECT_ENVIRONMENT": None,
        # A newcomer's Python caches the bytecode it compiles (CI's machines are told not to):
        # the clone's modules are then compiled once for up's four processes, not by each.
        "PYTHONDONTWRITEBYTECODE": None,
    }
    command = [uv, "run", "--project", str(clone), "usp-webhooks"]
    process = Up(folder, free_port(), command=command, extra_env=extra)
    try:
        yield process
    finally:
        process.close()
        print(f"----- up's output -----\n{process.output()}")


@pytest.mark.slow
def test_the_run_command_works_from_a_fresh_clone(up_from_clone: Up, clone: Path) -> None:
    assert "uv run usp-webhooks up" in readme_commands((clone / "README.md").read_text())
    with ExitStack() as stack:

        def serve(app: Any) -> str:
            return stack.enter_context(running(app))

        assert_up_delivers_and_stops(up_from_clone, serve, timeout=FIRST_START_TIMEOUT)
    assert (clone / ".venv").is_dir(), "uv ran the clone's own environment"


def test_the_readme_names_the_test_environment_variables_and_their_defaults() -> None:
    from tests.conftest import DEFAULT_POSTGRES_URL, DEFAULT_REDIS_URL, POSTGRES_URL_ENV, REDIS_URL_ENV

    readme = (REPO / "README.md").read_text()
    for variable, default in ((REDIS_URL_ENV, DEFAULT_REDIS_URL), (POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL)):
        assert f"| `{variable}` | `{default}` |" in readme
    assert (REPO / "tests" / "fixtures" / "rfc9421.json").is_file()
