"""Endpoint authentication with the real worker against real local servers: OAuth 2.0 client
credentials (a token endpoint that counts its fetches: the token cached until it expires, fetched
again once on a 401 and the request sent again; a failed fetch an attempt outcome with its reason)
and mutual TLS (a TLS server that requires a client certificate from a CA the test makes: the
subscription's certificate is presented, a delivery without one is refused); the secrets sealed
at rest and masked in every view."""

from __future__ import annotations

import base64
import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from sqlmodel import Session

from tests.dispatcher.admin.live import Live, deliveries, event_id_in, wait_until
from tests.dispatcher.conftest import ADMIN
from tests.servers import serving
from tests.workers.endpoints import Answer, respond
from usp_workers.storage.models import DeliveryStatus, Subscription

PATH = "/services/feed/subscriptions"
SECRET = "oauth-client-secret-5e2b"  #: a test value: what the token endpoint checks


@dataclass
class Gateway:
    """A token endpoint and the API behind it, which takes only the token it issued last."""

    fetches: list[dict[str, str]] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    revoked: set[str] = field(default_factory=set)
    lifetime: int = 3600
    token_status: int = 200
    seen: list[str] = field(default_factory=list)

    async def token(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = dict(scope["headers"])
        form = dict(pair.split("=", 1) for pair in body.decode().split("&"))
        basic = base64.b64decode(headers[b"authorization"].split(b" ")[1]).decode()
        self.fetches.append(form | {"basic": basic})
        if self.token_status != 200 or basic != f"platform-1:{SECRET}":
            await respond(
                send, self.token_status if self.token_status != 200 else 401, b'{"error":"invalid_client"}'
            )
            return
        token = f"tok-{len(self.tokens) + 1}"
        self.tokens.append(token)
        answer = {"access_token": token, "token_type": "Bearer", "expires_in": self.lifetime}
        await respond(send, 200, json.dumps(answer).encode(), [("content-type", "application/json")])

    async def api(self, scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        given = dict(scope["headers"]).get(b"authorization", b"").decode()
        self.seen.append(given)
        valid = given.startswith("Bearer ") and given[7:] in self.tokens and given[7:] not in self.revoked
        await respond(send, 200 if valid else 401, b"")


def oauth(live: Live, gateway: Gateway, **extra: object) -> dict[str, object]:
    token_url, _ = live.endpoint("token", gateway.token)
    return {
        "type": "oauth2_client_credentials",
        "token_url": token_url,
        "client_id": "platform-1",
        "client_secret": SECRET,
        "scope": "webhooks:write",
    } | extra


def test_oauth_client_credentials(live: Live, tmp_path: Path) -> None:
    gateway = Gateway()
    url, _ = live.endpoint("behind-gateway", gateway.api)
    created = httpx.post(
        live.base + PATH, json={"url": url, "auth": oauth(live, gateway)}, headers=ADMIN
    ).json()
    assert created["auth"]["client_secret"] == "********"
    assert SECRET not in httpx.get(f"{live.base}{PATH}/{created['id']}", headers=ADMIN).text
    with Session(live.engine) as session:
        stored = session.get(Subscription, created["id"])
        assert stored is not None
        assert stored.endpoint_auth is not None
        assert SECRET not in stored.endpoint_auth, "sealed at rest"

    def succeeded(count: int) -> bool:
        mine = [d for d in deliveries(live.engine) if d.subscription_id == created["id"]]
        return len(mine) == count and all(d.status == DeliveryStatus.SUCCEEDED for d in mine)

    live.ok("trigger", "booking.confirmed")
    wait_until(lambda: succeeded(1), "the first delivery", live)
    live.ok("trigger", "booking.confirmed")
    wait_until(lambda: succeeded(2), "the second delivery", live)
    assert len(gateway.fetches) == 1, "the token is cached until it expires"
    assert gateway.fetches[0] | {"basic": ""} == {
        "grant_type": "client_credentials",
        "scope": "webhooks%3Awrite",
        "basic": "",
    }
    assert gateway.seen == ["Bearer tok-1", "Bearer tok-1"]

    gateway.revoked.add("tok-1")  # the gateway revokes it: a 401, a new token, the same try again
    live.ok("trigger", "booking.confirmed")
    wait_until(lambda: succeeded(3), "the third delivery", live)
    assert len(gateway.fetches) == 2
    assert gateway.seen[-2:] == ["Bearer tok-1", "Bearer tok-2"]
    mine = [d for d in deliveries(live.engine) if d.subscription_id == created["id"]]
    assert [d.attempt_count for d in mine] == [1, 1, 1], "the refetch and the resend are inside one attempt"
    assert SECRET not in live.worker.output()

    # From the CLI: the secret read from a file, never on the command line; then removed.
    (secret_file := tmp_path / "secret").write_text(SECRET + "\n")
    printed = live.ok(
        "subscriptions",
        "auth",
        created["id"],
        "--oauth-token-url",
        str(oauth(live, gateway)["token_url"]),
        "--client-id",
        "platform-1",
        "--client-secret-file",
        str(secret_file),
    )
    assert printed.startswith(f"{created['id']}: OAuth 2.0 client credentials as platform-1 from ")
    assert SECRET not in printed
    assert (
        live.ok("subscriptions", "auth", created["id"], "--off").strip()
        == f"{created['id']}: no endpoint authentication"
    )


def test_a_failed_token_fetch_is_an_attempt_outcome_with_its_reason(live: Live) -> None:
    gateway = Gateway(token_status=503)
    url, _ = live.endpoint("no-token", gateway.api)
    created = httpx.post(
        live.base + PATH, json={"url": url, "auth": oauth(live, gateway)}, headers=ADMIN
    ).json()
    event_id = event_id_in(live.ok("trigger", "booking.confirmed"))
    wait_until(lambda: any(d.attempt_count >= 1 for d in deliveries(live.engine)), "the first try", live)
    shown = httpx.get(f"{live.base}/admin/events/{event_id}", headers=ADMIN).json()
    (delivery,) = [d for d in shown["deliveries"] if d["subscription_id"] == created["id"]]
    attempt = delivery["attempts"][0]
    assert attempt["error_class"] == "oauth_token_failed"
    assert attempt["status_code"] is None
    assert attempt["key_ids"] is None, "nothing was sent, so no key signed anything"
    assert "the token endpoint answered 503" in delivery["last_error"]
    assert gateway.seen == [], "nothing sent without a token"


@dataclass
class Pki:
    ca: str
    server_cert: Path
    server_key: Path
    ca_file: Path
    client_cert: str
    client_key: str
    stranger_cert: str  #: a client certificate another CA issued
    stranger_key: str


def _cert(
    subject: str, key: Any, issuer: x509.Name, issuer_key: Any, *, ca: bool, usage: Any
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if subject == "localhost":
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _pem_key(key: Any) -> str:
    return str(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
    )


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "platform test CA")])
    ca = _cert("platform test CA", ca_key, ca_name, ca_key, ca=True, usage=None)
    server_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    server = _cert("localhost", server_key, ca_name, ca_key, ca=False, usage=ExtendedKeyUsageOID.SERVER_AUTH)
    client = _cert(
        "usp-business", client_key, ca_name, ca_key, ca=False, usage=ExtendedKeyUsageOID.CLIENT_AUTH
    )
    other_key = ec.generate_private_key(ec.SECP256R1())
    other_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "another CA")])
    stranger_key = ec.generate_private_key(ec.SECP256R1())
    stranger = _cert(
        "usp-business", stranger_key, other_name, other_key, ca=False, usage=ExtendedKeyUsageOID.CLIENT_AUTH
    )
    ca_pem = ca.public_bytes(serialization.Encoding.PEM).decode()
    (tmp_path / "ca.pem").write_text(ca_pem)
    (tmp_path / "server.pem").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "server.key").write_text(_pem_key(server_key))
    return Pki(
        ca_pem,
        tmp_path / "server.pem",
        tmp_path / "server.key",
        tmp_path / "ca.pem",
        client.public_bytes(serialization.Encoding.PEM).decode(),
        _pem_key(client_key),
        stranger.public_bytes(serialization.Encoding.PEM).decode(),
        _pem_key(stranger_key),
    )


def test_mutual_tls(live: Live, pki: Pki) -> None:
    presented: list[str] = []

    async def api(scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        transport = scope.get("extensions", {}).get("tls", {})
        presented.append(str(transport.get("client_cert_name", "")))
        await respond(send, 200, b"")

    with serving(api, certfile=pki.server_cert, keyfile=pki.server_key, client_ca=pki.ca_file) as served:
        url = f"https://localhost:{served.port}/hooks"
        auth = {
            "type": "mtls",
            "certificate": pki.client_cert,
            "private_key": pki.client_key,
            "ca_certificate": pki.ca,
        }
        with_cert = httpx.post(live.base + PATH, json={"url": url, "auth": auth}, headers=ADMIN).json()
        assert with_cert["auth"]["private_key"] == "********"
        assert with_cert["auth"]["certificate_subject"] == "CN=usp-business"
        # The same CA trusted for the server, but a client certificate it did not issue.
        stranger = auth | {"certificate": pki.stranger_cert, "private_key": pki.stranger_key}
        without = httpx.post(
            live.base + PATH, json={"url": url + "?stranger", "auth": stranger}, headers=ADMIN
        ).json()
        event_id = event_id_in(live.ok("trigger", "booking.confirmed"))

        def of(subscription_id: str) -> Any:
            mine = [
                d
                for d in deliveries(live.engine)
                if d.event_id == event_id and d.subscription_id == subscription_id
            ]
            return mine[0] if mine else None

        wait_until(
            lambda: (
                of(with_cert["id"]) is not None and of(with_cert["id"]).status == DeliveryStatus.SUCCEEDED
            ),
            "the mTLS delivery",
            live,
        )
        wait_until(lambda: of(without["id"]).attempt_count >= 1, "the try without a certificate", live)
        assert of(without["id"]).status != DeliveryStatus.SUCCEEDED, "refused: a certificate of another CA"
        assert of(without["id"]).last_error is not None
    with Session(live.engine) as session:
        stored = session.get(Subscription, with_cert["id"])
        assert stored is not None
        assert stored.endpoint_auth is not None
        assert "PRIVATE KEY" not in stored.endpoint_auth, "the key sealed at rest"


@pytest.mark.parametrize(
    ("auth", "where"),
    [
        ({"type": "basic"}, "auth.type"),
        (
            {
                "type": "oauth2_client_credentials",
                "token_url": "ftp://x",
                "client_id": "a",
                "client_secret": "b",
            },
            "auth.token_url",
        ),
        (
            {"type": "oauth2_client_credentials", "token_url": "https://t.example/token", "client_id": "a"},
            "auth.client_secret",
        ),
        ({"type": "mtls", "certificate": "not a pem", "private_key": "x"}, "auth.certificate"),
    ],
)
def test_bad_endpoint_auth_is_refused_naming_the_member(live: Live, auth: dict[str, Any], where: str) -> None:
    url, _ = live.endpoint("refused-auth", Answer(200))
    answer = httpx.post(live.base + PATH, json={"url": url, "auth": auth}, headers=ADMIN)
    assert (answer.status_code, answer.json()["reason"], answer.json()["where"]) == (
        422,
        "invalid_auth",
        where,
    )
