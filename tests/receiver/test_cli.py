"""``usp-receiver`` keygen / sign / verify, and the raw-request parser under them.

Most cases drive the Typer app in process (``CliRunner``); the console script itself runs as a
subprocess once, through a real pipe, and once without Typer installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from tests.receiver.vectors import case, vectors
from usp_receiver._rawhttp import RawRequestError, parse_request
from usp_receiver.cli import NEEDS_EXTRA, build_app

CREATED = 1_700_000_000
REQUEST = (
    b"POST /webhooks/usp?attempt=1 HTTP/1.1\r\n"
    b"Host: platform.example\r\n"
    b"Content-Type: application/json\r\n"
    b"User-Agent: usp-webhooks/1\r\n"
    b"\r\n"
    b'{"event": "booking.confirmed", "event_id": "evt_019a2b3c4d5e7000800000000000000a"}'
)

APP = build_app()


def run(*args: str, stdin: bytes | None = None) -> Result:
    result = CliRunner().invoke(APP, list(args), input=stdin)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    """A fresh key pair made by ``keygen``: (private JWK file, public JWKS file)."""
    private, public = tmp_path / "key.jwk", tmp_path / "jwks.json"
    result = run("keygen", "--out", str(private), "--jwks", str(public))
    assert result.exit_code == 0, result.output
    return private, public


def sign(private: Path, request: bytes = REQUEST, *extra: str) -> bytes:
    result = run("sign", "--key", str(private), *extra, "-", stdin=request)
    assert result.exit_code == 0, result.output
    return result.stdout_bytes


# -- keygen, sign, verify ---------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ["ed25519", "ecdsa-p256-sha256"])
def test_keygen_sign_verify_round_trip(tmp_path: Path, alg: str) -> None:
    private, public = tmp_path / "key.jwk", tmp_path / "jwks.json"
    made = run("keygen", "--alg", alg, "--out", str(private), "--jwks", str(public))
    assert made.exit_code == 0, made.output
    secret = json.loads(private.read_text())["d"]
    assert secret not in made.output
    assert private.stat().st_mode & 0o777 == 0o600
    (kid,) = (key["kid"] for key in json.loads(public.read_text())["keys"])
    signed = tmp_path / "signed.http"
    signed.write_bytes(sign(private))

    result = run("verify", "--jwks", str(public), str(signed))

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "valid"
    assert f"keyid    {kid}" in result.stdout
    assert f"alg      {alg}" in result.stdout
    assert "label    sig1" in result.stdout
    assert "tag      usp-webhook" in result.stdout


def test_keygen_prints_the_public_jwks_and_never_the_private_key(tmp_path: Path) -> None:
    private = tmp_path / "key.jwk"

    result = run("keygen", "--out", str(private))

    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    (published,) = document["keys"]
    assert "d" not in published
    assert json.loads(private.read_text())["d"] not in result.output
    again = run("keygen", "--out", str(private))
    assert again.exit_code == 2
    assert "exists" in again.stderr


def test_signed_request_keeps_the_request_and_uses_crlf(keys: tuple[Path, Path]) -> None:
    private, _ = keys

    signed = sign(private, REQUEST.replace(b"\r\n", b"\n"), "--created", str(CREATED))

    head, _, body = signed.partition(b"\r\n\r\n")
    assert body == REQUEST.partition(b"\r\n\r\n")[2]
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /webhooks/usp?attempt=1 HTTP/1.1"
    assert b"User-Agent: usp-webhooks/1" in lines
    assert any(line.startswith(b"Content-Digest: sha-256=:") for line in lines)
    assert any(b";created=1700000000;" in line for line in lines if line.startswith(b"Signature-Input:"))
    assert b"\n" not in head.replace(b"\r\n", b"")


def test_signing_again_replaces_the_signature_fields(keys: tuple[Path, Path]) -> None:
    private, public = keys

    twice = sign(private, sign(private))

    names = [line.split(b":")[0].lower() for line in twice.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]]
    assert names.count(b"signature") == names.count(b"signature-input") == names.count(b"content-digest") == 1
    assert run("verify", "--jwks", str(public), "-", stdin=twice).exit_code == 0


def test_two_keys_sign_for_rotation_and_the_old_one_alone_verifies(tmp_path: Path) -> None:
    new, old = tmp_path / "new.jwk", tmp_path / "old.jwk"
    old_jwks = tmp_path / "old.json"
    assert run("keygen", "--out", str(new)).exit_code == 0
    assert run("keygen", "--out", str(old), "--jwks", str(old_jwks)).exit_code == 0

    result = run("sign", "--key", str(new), "--key", str(old), "-", stdin=REQUEST)
    verdict = run("verify", "--jwks", str(old_jwks), "-", stdin=result.stdout_bytes)

    assert result.exit_code == 0, result.output
    assert verdict.exit_code == 0, verdict.output
    assert "label    sig2" in verdict.stdout


def test_tampered_body_is_invalid_with_its_reason(keys: tuple[Path, Path], tmp_path: Path) -> None:
    private, public = keys
    tampered = tmp_path / "tampered.http"
    tampered.write_bytes(sign(private).replace(b"booking.confirmed", b"booking.cancelled"))

    result = run("verify", "--jwks", str(public), str(tampered))

    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines() == [
        "invalid: digest_mismatch",
        "Content-Digest does not match the message body",
    ], "each thing said once"


def test_a_key_outside_the_jwks_is_unknown(keys: tuple[Path, Path], tmp_path: Path) -> None:
    _, public = keys
    stranger = tmp_path / "stranger.jwk"
    assert run("keygen", "--out", str(stranger)).exit_code == 0

    result = run("verify", "--jwks", str(public), "-", stdin=sign(stranger))

    assert result.exit_code == 1
    assert result.stdout.startswith("invalid: unknown_key")


@pytest.mark.parametrize(
    ("at", "verdict"),
    [(CREATED + 10, "valid"), (CREATED + 301, "invalid: stale"), (CREATED - 61, "invalid: future")],
)
def test_at_moves_the_replay_window(keys: tuple[Path, Path], at: int, verdict: str) -> None:
    private, public = keys
    signed = sign(private, REQUEST, "--created", str(CREATED))

    result = run("verify", "--jwks", str(public), "--at", str(at), "-", stdin=signed)

    assert result.stdout.splitlines()[0] == verdict
    assert result.exit_code == (0 if verdict == "valid" else 1)


def test_tag_must_match_the_expected_one(keys: tuple[Path, Path]) -> None:
    private, public = keys
    signed = sign(private, REQUEST, "--tag", "other-app")

    default = run("verify", "--jwks", str(public), "-", stdin=signed)
    expected = run("verify", "--jwks", str(public), "--tag", "other-app", "-", stdin=signed)

    assert default.exit_code == 1
    assert default.stdout.startswith("invalid: tag_mismatch")
    assert expected.exit_code == 0, expected.output
    assert "tag      other-app" in expected.stdout


def test_lf_only_file_with_content_length_and_a_trailing_newline_verifies(
    keys: tuple[Path, Path], tmp_path: Path
) -> None:
    private, public = keys
    body = REQUEST.partition(b"\r\n\r\n")[2]
    with_length = REQUEST.replace(b"\r\n\r\n", f"\r\nContent-Length: {len(body)}\r\n\r\n".encode())
    head, _, signed_body = sign(private, with_length).partition(b"\r\n\r\n")
    edited = tmp_path / "edited.http"
    edited.write_bytes(head.replace(b"\r\n", b"\n") + b"\n\n" + signed_body + b"\n")  # as an editor saves it

    result = run("verify", "--jwks", str(public), str(edited))

    assert result.exit_code == 0, result.output


# -- usage errors: exit 2 -------------------------------------------------------------------------


def test_missing_request_file_is_exit_2(keys: tuple[Path, Path], tmp_path: Path) -> None:
    _, public = keys

    result = run("verify", "--jwks", str(public), str(tmp_path / "nope.http"))

    assert result.exit_code == 2
    assert "cannot read" in result.stderr
    assert "nope.http" in result.stderr


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["--jwks", "{missing}"], REQUEST, "cannot read the JWKS"),
        (["--jwks", "{private}"], b"not http at all\n\n", "not a raw HTTP request"),
        (["--jwks", "{private}"], REQUEST.replace(b"Host: platform.example\r\n", b""), "no Host header"),
        (["--jwks", "http://127.0.0.1:9/jwks.json"], REQUEST, "add --allow-insecure-http"),
    ],
)
def test_unusable_input_is_exit_2(
    keys: tuple[Path, Path], tmp_path: Path, args: list[str], stdin: bytes, message: str
) -> None:
    private, _ = keys
    paths = {"missing": str(tmp_path / "missing.json"), "private": str(private)}

    result = run("verify", *(arg.format(**paths) for arg in args), "-", stdin=stdin)

    assert result.exit_code == 2, result.output
    assert message in result.stderr


def test_sign_needs_a_private_key_and_a_content_type(keys: tuple[Path, Path]) -> None:
    private, public = keys
    no_type = REQUEST.replace(b"Content-Type: application/json\r\n", b"")

    with_public = run("sign", "--key", str(public), "-", stdin=REQUEST)
    without_type = run("sign", "--key", str(private), "-", stdin=no_type)

    assert with_public.exit_code == 2
    assert "not a private JWK" in with_public.stderr
    assert without_type.exit_code == 2
    assert "content-type" in without_type.stderr


# -- remote JWKS ------------------------------------------------------------------------------------


@pytest.fixture
def jwks_server(keys: tuple[Path, Path]) -> Iterator[str]:
    """Serve the fixture's public JWKS at http://127.0.0.1:PORT/jwks.json."""
    document = keys[1].read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path == "/jwks.json"
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/jwk-set+json")
            self.send_header("Content-Length", str(len(document) if found else 0))
            self.end_headers()
            if found:
                self.wfile.write(document)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_jwks_url_over_local_http_with_allow_insecure_http(keys: tuple[Path, Path], jwks_server: str) -> None:
    private, _ = keys
    signed = sign(private)

    allowed = run("verify", "--jwks", jwks_server, "--allow-insecure-http", "-", stdin=signed)
    refused = run("verify", "--jwks", jwks_server, "-", stdin=signed)
    missing = run("verify", "--jwks", jwks_server + ".old", "--allow-insecure-http", "-", stdin=signed)

    assert allowed.exit_code == 0, allowed.output
    assert allowed.stdout.startswith("valid")
    assert refused.exit_code == 2
    assert missing.exit_code == 2
    assert "cannot fetch the keys" in missing.stderr
    assert "HTTP 404" in missing.stderr


# -- RFC 9421 B.2.6 ---------------------------------------------------------------------------------


def _b26_request(tmp_path: Path) -> tuple[bytes, Path]:
    """The RFC's test request signed as in B.2.6, as raw bytes; and a JWKS file with its key."""
    b26 = case("b26")
    message = vectors()["messages"]["test-request"]
    lines = [message["request_line"]] + [f"{name}: {value}" for name, value in message["headers"]]
    lines += [
        f"Signature-Input: {b26['expected_signature_input']}",
        f"Signature: {b26['expected_signature']}",
    ]
    raw = ("\r\n".join(lines) + "\r\n\r\n" + message["body"]).encode()
    public = {k: v for k, v in vectors()["keys"]["test-key-ed25519"]["jwk"].items() if k != "d"}
    jwks = tmp_path / "rfc9421-jwks.json"
    jwks.write_text(json.dumps({"keys": [public]}))
    return raw, jwks


def test_rfc9421_b26_request_verifies_with_profile_any(tmp_path: Path) -> None:
    raw, jwks = _b26_request(tmp_path)
    common = ["verify", "--jwks", str(jwks), "--at", "1618884473"]

    relaxed = run(*common, "--profile", "any", "-", stdin=raw)
    usp = run(*common, "-", stdin=raw)
    later = run("verify", "--jwks", str(jwks), "--profile", "any", "-", stdin=raw)
    forged = run(*common, "--profile", "any", "-", stdin=raw.replace(b"Date: Tue", b"Date: Wed"))

    assert relaxed.exit_code == 0, relaxed.output
    assert "keyid    test-key-ed25519" in relaxed.stdout
    assert "label    sig-b26" in relaxed.stdout
    assert "created  1618884473 (2021-04-20T02:07:53Z)" in relaxed.stdout
    assert usp.stdout.startswith("invalid: missing_component")  # the USP profile wants more covered
    assert later.stdout.startswith("invalid: stale")
    assert forged.stdout.startswith("invalid: bad_signature")


def test_profile_any_still_checks_a_content_digest_that_is_present(tmp_path: Path) -> None:
    raw, jwks = _b26_request(tmp_path)
    # The B.2.6 signature covers content-length but not the body: only the digest protects it.
    tampered = raw.replace(b'{"hello": "world"}', b'{"hello": "earth"}')

    result = run("verify", "--jwks", str(jwks), "--at", "1618884473", "--profile", "any", "-", stdin=tampered)

    assert result.exit_code == 1
    assert result.stdout.startswith("invalid: digest_mismatch")


# -- the console script ---------------------------------------------------------------------------


def _script() -> str:
    script = Path(sys.executable).with_name("usp-receiver")
    if not script.exists():
        pytest.fail(f"console script {script} is missing: run `uv sync` so the entry point is installed")
    return str(script)


def test_console_script_round_trip_through_a_pipe(tmp_path: Path) -> None:
    private, public = tmp_path / "key.jwk", tmp_path / "jwks.json"
    request = tmp_path / "request.http"
    request.write_bytes(REQUEST)
    script = _script()
    subprocess.run([script, "keygen", "--out", private, "--jwks", public], check=True, capture_output=True)

    signer = subprocess.Popen([script, "sign", "--key", private, request], stdout=subprocess.PIPE)
    verifier = subprocess.run(
        [script, "verify", "--jwks", public, "-"], stdin=signer.stdout, capture_output=True, timeout=60
    )
    assert signer.stdout is not None
    signer.stdout.close()
    assert signer.wait(timeout=60) == 0

    assert verifier.returncode == 0, verifier.stderr
    assert verifier.stdout.decode().startswith("valid")


def test_main_without_typer_says_which_extra_to_install() -> None:
    code = "import sys; sys.modules['typer'] = None; from usp_receiver.cli import main; main()"
    env = {**os.environ, "PYTHONWARNINGS": "error"}

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)

    assert result.returncode == 2
    assert result.stderr.strip() == NEEDS_EXTRA


# -- the raw-request parser -------------------------------------------------------------------------


def test_parser_reads_crlf_and_lf_alike() -> None:
    crlf = parse_request(REQUEST)
    lf = parse_request(REQUEST.replace(b"\r\n", b"\n"))

    assert crlf == lf
    assert crlf.method == "POST"
    assert crlf.target == "/webhooks/usp?attempt=1"
    assert crlf.header("content-type") == "application/json"
    assert crlf.url("https") == "https://platform.example/webhooks/usp?attempt=1"
    assert crlf.body.endswith(b'0000a"}')


def test_parser_takes_exactly_content_length_bytes() -> None:
    raw = b"POST / HTTP/1.1\nHost: a.example\nContent-Length: 2\n\n{}\n\n"

    assert parse_request(raw).body == b"{}"
    assert parse_request(raw.replace(b"Content-Length: 2\n", b"")).body == b"{}\n\n"
    with pytest.raises(RawRequestError, match="Content-Length says 9"):
        parse_request(raw.replace(b"Length: 2", b"Length: 9"))


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\r\n\r\n",
        b"POST /\r\nHost: a\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost a.example\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a.example\r\n folded\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ],
)
def test_parser_refuses_what_it_cannot_frame(raw: bytes) -> None:
    with pytest.raises(RawRequestError):
        parse_request(raw)


def test_with_headers_replaces_every_line_and_serializes_with_crlf() -> None:
    request = parse_request(
        b"POST /x HTTP/1.1\nHost: a.example\nSignature: old1\nsignature: old2\nX: y\n\nbody"
    )

    updated = request.with_headers({"Signature": "new", "Content-Digest": "d"})

    assert updated.headers == (
        ("Host", "a.example"),
        ("Signature", "new"),
        ("X", "y"),
        ("Content-Digest", "d"),
    )
    assert updated.serialize() == (
        b"POST /x HTTP/1.1\r\nHost: a.example\r\nSignature: new\r\nX: y\r\nContent-Digest: d\r\n\r\nbody"
    )
    assert parse_request(updated.serialize()) == updated
