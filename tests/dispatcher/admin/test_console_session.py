"""The console's session cookie and CSRF token (``usp_dispatcher.console.session``)."""

from __future__ import annotations

import pytest

from usp_dispatcher.console import session

TOKEN = "admin-token-for-the-console"


def test_a_session_reads_back_with_a_csrf_token_of_its_own() -> None:
    first, second = session.issue(TOKEN, now=1_000), session.issue(TOKEN, now=1_000)
    one, other = session.read(first, TOKEN, now=1_010), session.read(second, TOKEN, now=1_010)
    assert one is not None
    assert other is not None
    assert one.csrf != other.csrf, "each login has its own CSRF token"
    assert one.csrf_ok(one.csrf)
    assert not one.csrf_ok(other.csrf)
    assert not one.csrf_ok(None)
    assert TOKEN not in first


@pytest.mark.parametrize(
    ("value", "token", "now"),
    [
        (None, TOKEN, 1_010),
        ("", TOKEN, 1_010),
        ("garbage", TOKEN, 1_010),
        ("1000.nonce..0000", TOKEN, 1_010),
        ("ISSUED", "another-admin-token", 1_010),
        ("ISSUED", TOKEN, 1_000 + session.LIFETIME_SECONDS + 1),
        ("ISSUED", TOKEN, 1_000 - 3_600),
        ("ISSUED", "", 1_010),
    ],
    ids=["absent", "empty", "not ours", "forged mac", "other token", "expired", "from the future", "closed"],
)
def test_what_a_session_cookie_does_not_prove(value: str | None, token: str, now: int) -> None:
    if value == "ISSUED":
        value = session.issue(TOKEN, now=1_000)
    assert session.read(value, token, now=now) is None


def test_a_tampered_issue_time_or_subject_breaks_the_mac() -> None:
    issued, nonce, subject, mac = session.issue(TOKEN, subject="https://a.example/p", now=1_000).split(".")
    assert session.read(f"{int(issued) + 3_600}.{nonce}.{subject}.{mac}", TOKEN, now=4_000) is None
    other = session.issue(TOKEN, subject="https://b.example/p", now=1_000).split(".")[2]
    assert session.read(f"{issued}.{nonce}.{other}.{mac}", TOKEN, now=1_010) is None


def test_a_token_carries_its_subject_and_serves_only_its_purpose() -> None:
    link = session.issue(TOKEN, purpose="portal-link", subject="https://acme.example/usp", now=1_000)
    read = session.read(link, TOKEN, purpose="portal-link", lifetime=900, now=1_100)
    assert read is not None
    assert read.subject == "https://acme.example/usp"
    assert session.read(link, TOKEN, now=1_100) is None, "a portal link is not a console session"
    assert session.read(link, TOKEN, purpose="portal-link", lifetime=900, now=1_901) is None, "expired"
