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
        ("1000.nonce.0000", TOKEN, 1_010),
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


def test_a_tampered_issue_time_breaks_the_mac() -> None:
    issued, nonce, mac = session.issue(TOKEN, now=1_000).split(".")
    assert session.read(f"{int(issued) + 3_600}.{nonce}.{mac}", TOKEN, now=4_000) is None
