"""``usp-webhooks up``, the whole service as three real processes, with no settings at all.

The command runs in an empty folder with no ``USP_*`` variable but one (loopback targets allowed,
because the test's receiver is on 127.0.0.1): SQLite database and embedded broker appear there.
A subscription and an event go in through the HTTP API with the admin token ``up`` printed, and
the event must reach a receiver that verifies it against the JWKS the API publishes. SIGTERM
then stops every child: no process is left running in the folder.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from tests.dispatcher.conftest import Serve
from tests.dispatcher.support import event
from tests.readme_blocks import block_after
from tests.servers import free_port
from usp_dispatcher.cli.config import Settings
from usp_dispatcher.cli.supervisor import child_environment, display_host
from usp_receiver import JWKS, ReceivedWebhook, Verifier, WebhookReceiver
from usp_receiver.asgi import WebhookApp

UP_TIMEOUT = 90.0
TOKEN_LINE = re.compile(r"admin token \(this session only\): (\S+)")


def _processes_in(folder: Path) -> list[int]:
    """Pids of processes whose working directory is ``folder`` (``up`` and its children)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if Path(os.readlink(entry / "cwd")) == folder:
                pids.append(int(entry.name))
        except OSError:
            continue  # gone, or not ours to inspect
    return pids


class Up:
    """``up`` started in ``folder`` (by default ``python -m usp_dispatcher.cli up``; ``command``
    replaces the part before ``up``), its output in a file. The environment is ours without any
    ``USP_*`` variable, plus loopback targets allowed and ``extra_env`` (``None`` removes)."""

    def __init__(
        self,
        folder: Path,
        port: int,
        command: Sequence[str] = (sys.executable, "-m", "usp_dispatcher.cli"),
        extra_env: Mapping[str, str | None] | None = None,
        up_args: Sequence[str] = (),
    ) -> None:
        self.folder = folder
        self.log_path = folder.parent / f"{folder.name}-up.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("USP_")}
        env["USP_ALLOW_PRIVATE_TARGETS"] = "true"
        env["PYTHONUNBUFFERED"] = "1"
        for name, value in (extra_env or {}).items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [*command, "up", "--port", str(port), *up_args],
            cwd=folder,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = UP_TIMEOUT) -> str:
        deadline = time.monotonic() + timeout
        while text not in (output := self.output()):
            if self.process.poll() is not None:
                pytest.fail(f"`up` exited with {self.process.returncode}:\n{output}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {text!r} from `up` within {timeout} s:\n{output}")
            time.sleep(0.1)
        return output

    def close(self) -> None:
        """Stop ``up`` if it still runs, then anything left in its folder (by pid)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(40)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        for pid in _processes_in(self.folder):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._log.close()


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    folder = tmp_path / "service"
    folder.mkdir()
    process = Up(folder, free_port())
    try:
        yield process
    finally:
        process.close()
        print(f"----- up's output -----\n{process.output()}")


def test_up_runs_the_whole_service_with_no_settings(up: Up, serve: Serve) -> None:
    assert_up_delivers_and_stops(up, serve)


def assert_up_delivers_and_stops(up: Up, serve: Serve, timeout: float = UP_TIMEOUT) -> None:
    """What ``up`` promises, end to end: it announces the API and an admin token; the JWKS is
    served; a subscription and an event posted with that token bring the event to a receiver
    that verifies it against that JWKS; SIGTERM stops everything; the token is printed once."""
    output = up.wait_for("Ctrl-C stops everything.", timeout)
    base = re.search(r"API\s+(http://\S+)", output)
    token_match = TOKEN_LINE.search(output)
    assert base is not None, output
    assert token_match is not None, output
    api, token = base.group(1), token_match.group(1)
    admin = {"Authorization": f"Bearer {token}"}
    assert {p.name for p in up.folder.iterdir()} >= {"usp-webhooks.sqlite3", "usp-webhooks-broker.sqlite3"}

    jwks = JWKS.from_dict(httpx.get(f"{api}/.well-known/usp/jwks.json", timeout=10).json())
    handled: list[str] = []
    arrived = threading.Event()

    def handle(hook: ReceivedWebhook) -> None:
        handled.append(hook.event.event_id)
        arrived.set()

    receiver = serve(WebhookApp(WebhookReceiver(Verifier(jwks), handle)))
    with httpx.Client(base_url=api, timeout=10) as client:
        assert client.post("/events", json=event("booking.confirmed")).status_code == 401
        created = client.post(
            "/services/feed/subscriptions", json={"url": receiver + "/hooks"}, headers=admin
        )
        assert created.status_code == 201, created.text
        body = event("booking.confirmed")
        posted = client.post("/events", json=body, headers=admin)
        assert posted.status_code == 202, posted.text

    assert arrived.wait(30), f"the event never arrived:\n{up.output()}"
    assert handled == [body["event_id"]]

    up.process.send_signal(signal.SIGTERM)
    assert up.process.wait(40) == 0, up.output()
    deadline = time.monotonic() + 10
    while _processes_in(up.folder):
        assert time.monotonic() < deadline, f"left running: {_processes_in(up.folder)}"
        time.sleep(0.1)
    assert up.output().count(token) == 1, "the session's admin token is printed once, and only once"


# -- the children's environment ------------------------------------------------------------------------


def test_a_token_is_generated_only_when_none_is_configured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # up's secrets key is a file in the working folder
    unset = Settings(_env_file=None)
    env, token = child_environment(unset, {"PATH": "/bin"}, host="127.0.0.1", port=9000)
    assert token is not None
    assert len(token) >= 40
    assert env["USP_ADMIN_TOKEN"] == token
    assert env["USP_PUBLIC_BASE_URL"] == "http://127.0.0.1:9000"
    assert env["PATH"] == "/bin"

    configured = Settings(
        _env_file=None, admin_token=SecretStr("s3cret"), public_base_url="https://x.example"
    )
    env, token = child_environment(configured, {"USP_ADMIN_TOKEN": "s3cret"}, host="0.0.0.0", port=9000)
    assert token is None
    assert env["USP_ADMIN_TOKEN"] == "s3cret"
    assert "USP_PUBLIC_BASE_URL" not in env, "a configured public URL is left alone"
    assert "USP_ALLOW_PRIVATE_TARGETS" not in env, "production-safe unless --dev"

    key = tmp_path / "usp-webhooks-secrets.key"
    assert env["USP_SECRETS_KEY"] == key.read_text().strip(), "made once, kept for the next start"
    assert key.stat().st_mode & 0o777 == 0o600
    assert (
        child_environment(configured, {}, host="127.0.0.1", port=9000)[0]["USP_SECRETS_KEY"]
        == (env["USP_SECRETS_KEY"])
    )
    sealed = Settings(_env_file=None, secrets_key=SecretStr("configured"))
    assert "USP_SECRETS_KEY" not in child_environment(sealed, {}, host="127.0.0.1", port=9000)[0]

    env, _ = child_environment(configured, {}, host="127.0.0.1", port=9000, dev=True)
    assert env["USP_ALLOW_PRIVATE_TARGETS"] == "true"


@pytest.mark.parametrize(
    ("host", "shown"),
    [("0.0.0.0", "127.0.0.1"), ("::", "127.0.0.1"), ("10.0.0.5", "10.0.0.5"), ("::1", "[::1]")],
)
def test_display_host(host: str, shown: str) -> None:
    assert display_host(host) == shown


def test_the_readmes_first_delivery_works_as_written(tmp_path: Path) -> None:
    """README, "Your first delivery", its commands read out of the README: `up --dev`, then
    `listen` and `trigger` with the printed token; `listen` prints the triggered event, verified.
    No USP_ALLOW_PRIVATE_TARGETS is set: --dev lets the local receiver subscribe (the banner says
    so)."""
    steps = readme_first_delivery()
    assert [step[0] for step in steps] == ["up", "listen", "trigger"], steps
    (_, *up_args), listen_args, trigger_args = steps
    folder = tmp_path / "service"
    folder.mkdir()
    up = Up(folder, free_port(), extra_env={"USP_ALLOW_PRIVATE_TARGETS": None}, up_args=up_args)
    listener: subprocess.Popen[str] | None = None
    try:
        output = up.wait_for("Ctrl-C stops everything.")
        assert "development mode" in output
        base, token = re.search(r"API\s+(http://\S+)", output), TOKEN_LINE.search(output)
        assert base is not None
        assert token is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("USP_")}
        env |= {"USP_ADMIN_TOKEN": token.group(1), "USP_ADMIN_URL": base.group(1), "PYTHONUNBUFFERED": "1"}
        cli = [sys.executable, "-m", "usp_dispatcher.cli"]
        listener = subprocess.Popen(
            [*cli, *listen_args, "--max-events", "1"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert listener.stdout is not None
        first = listener.stdout.readline()
        assert "listening on http://127.0.0.1:" in first, first
        triggered = subprocess.run(
            [*cli, *trigger_args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        event_id = re.search(r"(evt_\w+) accepted: 1 deliveries", triggered.stdout)
        assert event_id is not None, triggered.stdout
        rest, _ = listener.communicate(timeout=60)
        assert listener.returncode == 0, rest
        assert f"verified booking.confirmed {event_id.group(1)}" in rest
        assert "removed" in rest, "listen unsubscribes when it stops"
    finally:
        if listener is not None and listener.poll() is None:
            listener.kill()
        up.close()
        print(f"----- up's output -----\n{up.output()}")


def readme_first_delivery() -> list[list[str]]:
    """The ``usp-webhooks`` commands of the README's "Your first delivery" block, as arguments."""
    block = block_after("**Your first delivery.**", "sh")
    prefix = "uv run usp-webhooks "
    return [
        line.split("#")[0].removeprefix(prefix).split()
        for line in block.splitlines()
        if line.startswith(prefix)
    ]
