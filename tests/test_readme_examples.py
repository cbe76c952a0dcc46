"""Every Python block of the README and the docs is run by a test, or named here as a fragment
with the test that covers what it shows: a new block must be classified, so an example cannot
quietly stop working."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.readme_blocks import block_after
from usp_receiver import SigningKey, sign_request

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

BROKER_TEST = "tests/dispatcher/admin/test_broker_destinations.py"
#: Blocks that cannot run alone (they continue an earlier one or need a live peer), by the first
#: line that identifies them, with where they are exercised.
FRAGMENTS = {
    # needs a running MCP server and keys: tests/receiver/test_mcp_binding.py runs the binding
    "from mcp import Client": "tests/receiver/test_mcp_binding.py",
    # a 2026 listen stream needs a running server: tests/dispatcher/mcp_live/test_listen.py
    "# MCP 2026-07-28 (the SDK's default): a listen stream": "tests/dispatcher/mcp_live/test_listen.py",
    # the UCAP agent script: run verbatim by tests/dispatcher/ucap/test_readme.py
    "# ucap_agent.py": "tests/dispatcher/ucap/test_readme.py",
    # continues the FastAPI receiver (keys, on_event): tests/receiver/test_standard_webhooks.py
    # builds the same receiver, both schemes configured
    "from usp_receiver.standard_webhooks import": "tests/receiver/test_standard_webhooks.py",
    # a consumer of a broker destination: the test verifies every message it reads with
    # verify_message against the service's JWKS
    "from usp_receiver import RemoteJWKS, verify_message": BROKER_TEST,
}
RUN_HERE = ("from fastapi import FastAPI", "from usp_receiver import JWKS, Verifier, VerificationError")


def python_blocks() -> list[str]:
    blocks = []
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        blocks += re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    return blocks


def block(first_line: str) -> str:
    (found,) = [code for code in python_blocks() if code.startswith(first_line)]
    return found


def test_every_python_block_is_run_or_named_with_its_test() -> None:
    for code in python_blocks():
        first = code.splitlines()[0]
        known = [key for key in (*FRAGMENTS, *RUN_HERE) if first.startswith(key)]
        assert known, f"a python block nobody runs: {first!r}; run it here or name it in FRAGMENTS"
    for covering in FRAGMENTS.values():
        assert (REPO / covering).is_file()


def test_the_fastapi_receiver_example_serves_and_refuses_an_unsigned_post() -> None:
    namespace: dict[str, Any] = {}
    exec(compile(block(RUN_HERE[0]), "README.md (FastAPI)", "exec"), namespace)  # noqa: S102 - our README
    app = namespace["app"]
    assert isinstance(app, FastAPI)
    with TestClient(app) as client:
        response = client.post("/webhooks/usp", content=b"{}", headers={"Content-Type": "application/json"})
    assert response.status_code == 401
    assert response.json()["reason"] == "missing_signature"


def test_verifying_by_hand_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``business-jwks.json`` in the working folder and a signed request's ``headers`` and
    ``body`` (what a web framework hands over), the block verifies it."""
    key = SigningKey.generate()
    (tmp_path / "business-jwks.json").write_text(json.dumps({"keys": [key.public.jwk]}))
    monkeypatch.chdir(tmp_path)
    body = b'{"event": "booking.confirmed"}'
    headers = {"Content-Type": "application/json"}
    headers |= sign_request("POST", "https://platform.example/webhooks/usp", headers, body, [key])
    namespace: dict[str, Any] = {"headers": headers, "body": body}
    exec(compile(block(RUN_HERE[1]), "README.md (by hand)", "exec"), namespace)  # noqa: S102 - our README
    assert namespace["verified"].kid == key.kid


def test_the_receiver_cli_block_runs_as_written(tmp_path: Path) -> None:
    """The README's receiver CLI lines, run by a shell in a folder holding ``request.http``."""
    import subprocess
    import sys

    script = block_after("### CLI\n", "sh")
    assert script.count("usp-receiver ") == 3
    (tmp_path / "request.http").write_bytes(
        b"POST /webhooks/usp HTTP/1.1\r\nHost: platform.example\r\nContent-Type: application/json\r\n\r\n"
        b'{"event": "booking.confirmed"}'
    )
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    ran = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        env={"PATH": path},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "invalid" not in ran.stdout
    assert "keyid" in ran.stdout, ran.stdout  # the verdict's report of the verified signature
    assert (tmp_path / "signed.http").read_bytes().count(b"Signature") >= 2
