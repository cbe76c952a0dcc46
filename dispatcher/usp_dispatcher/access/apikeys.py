"""Bearer credentials: platforms' API keys, and the business's admin token.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.access.apikeys``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import Final

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from usp_core.clock import utcnow
from usp_dispatcher.access.bindings import MAX_PROFILE_LENGTH, bind_profile
from usp_dispatcher.access.errors import unauthenticated
from usp_dispatcher.access.identity import BUSINESS, Identity
from usp_dispatcher.access.tables import ApiKeyRow
from usp_dispatcher.errors import AccessError
from usp_dispatcher.settings import ApiSettings

__all__ = [
    "KEY_PREFIX",
    "authenticate_bearer",
    "create_api_key",
    "hash_api_key",
    "issue_api_key",
    "list_api_keys",
    "lookup_api_key",
    "revoke_api_key",
    "still_authenticates",
]

KEY_PREFIX: Final = "uspk_"
_KEY_BYTES: Final = 32
#: A principal name: what ``key:<name>`` says in logs and bindings. No spaces or controls, and
#: short enough that ``key:`` + name fits the 256-character principal columns.
_PRINCIPAL_NAME: Final = re.compile(r"[A-Za-z0-9._~@:/+-]{1,200}")
_MAX_TOKEN: Final = 512


def issue_api_key(
    session: Session, principal: str, *, label: str | None = None, profile: str | None = None
) -> str:
    """Make a key for ``principal`` (a name such as ``acme``) and commit it; returns the
    plaintext key, which exists nowhere else afterwards.

    ``profile`` binds ``key:<principal>`` to that platform profile now, instead of on its first
    call: first-contact binding (USP §10.1.6) lets whoever holds a new key claim any profile that
    nobody's key is bound to yet, so an operator who knows which platform the key is for should
    say so. ``ValueError`` for a principal name with spaces or odd characters (or over 200 long),
    or a principal already bound to another profile.
    """
    return create_api_key(session, principal, label=label, profile=profile)[1]


def create_api_key(
    session: Session, principal: str, *, label: str | None = None, profile: str | None = None
) -> tuple[ApiKeyRow, str]:
    """:func:`issue_api_key` that also returns the stored row (its ``id`` is what revokes it)."""
    if not _PRINCIPAL_NAME.fullmatch(principal):
        raise ValueError("a principal name is 1-200 letters, digits or ._~@:/+- (no spaces)")
    if label is not None and len(label) > 200:
        raise ValueError("a label is at most 200 characters")
    if profile is not None:
        _bind(session, f"key:{principal}", profile)
    for _ in range(3):  # a hash collision among 256-bit keys does not happen; a retry costs nothing
        plaintext = KEY_PREFIX + secrets.token_urlsafe(_KEY_BYTES)
        row = ApiKeyRow(principal=principal, token_hash=hash_api_key(plaintext), label=label)
        session.add(row)
        try:
            session.commit()
        except IntegrityError:
            session.rollback()
            continue
        return row, plaintext
    raise RuntimeError("could not store a new API key")  # pragma: no cover


def revoke_api_key(session: Session, key_id: str) -> bool:
    """Revoke a key by id and commit; ``False`` when there is no such key or it was revoked."""
    row = session.get(ApiKeyRow, key_id)
    if row is None or row.revoked_at is not None:
        return False
    row.revoked_at = utcnow()
    session.add(row)
    session.commit()
    return True


def list_api_keys(session: Session) -> list[ApiKeyRow]:
    """Every key, oldest first (only hashes: nothing here is a usable key)."""
    return list(session.exec(select(ApiKeyRow).order_by(col(ApiKeyRow.created_at), col(ApiKeyRow.id))).all())


def lookup_api_key(session: Session, token: str) -> str | None:
    """The principal name of the live (unrevoked) key whose plaintext is ``token``, or ``None``.
    Core, not the ORM: every authenticated request runs it (bench/statements.py)."""
    if not token.startswith(KEY_PREFIX) or len(token) > _MAX_TOKEN:
        return None
    statement = sa.select(col(ApiKeyRow.principal)).where(
        col(ApiKeyRow.token_hash) == hash_api_key(token), col(ApiKeyRow.revoked_at).is_(None)
    )
    principal: str | None = session.connection().execute(statement).scalar()
    return principal


def still_authenticates(session: Session, principal: str) -> bool:
    """Whether ``principal`` (an :class:`Identity`'s) can still authenticate: for ``key:<name>``,
    some key of that name is unrevoked. Other principals (the admin token, agents' signatures)
    have nothing to revoke here. What ends the live pushes to a session its key opened."""
    if not principal.startswith("key:"):
        return True
    name = principal.removeprefix("key:")
    live = select(ApiKeyRow.id).where(ApiKeyRow.principal == name).where(col(ApiKeyRow.revoked_at).is_(None))
    return session.exec(live).first() is not None


def hash_api_key(token: str) -> str:
    """What ``sched_api_keys.token_hash`` holds: the hex SHA-256 of the key."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def authenticate_bearer(
    session: Session, settings: ApiSettings, token: str, *, keys_offered: bool = True
) -> Identity:
    """The identity a bearer token proves: the business (admin token) or ``key:<name>``.

    ``keys_offered=False`` (the policy does not offer ``bearer``) refuses API keys; the admin
    token still works, being the business's own credential, not a platform mechanism.
    Raises ``AccessError`` (-32001) for anything else.
    """
    configured = settings.admin_token.get_secret_value() if settings.admin_token is not None else ""
    if configured and hmac.compare_digest(token.encode("utf-8"), configured.encode("utf-8")):
        return Identity(BUSINESS, "bearer")
    principal = lookup_api_key(session, token) if keys_offered else None
    if principal is None:
        raise unauthenticated(
            "the bearer credential is not a valid API key"
            if keys_offered
            else "bearer API keys are not accepted here"
        )
    return Identity(f"key:{principal}", "bearer")


def _bind(session: Session, principal: str, profile: str) -> None:
    """Bind ``principal`` to ``profile`` before its key exists (``ValueError`` when it is bound to
    another profile, or the profile is not a plausible URI)."""
    if not profile or len(profile) > MAX_PROFILE_LENGTH or not profile.isprintable() or " " in profile:
        raise ValueError(f"a profile is a URI of 1 to {MAX_PROFILE_LENGTH} printable characters")
    try:
        bind_profile(session, principal, profile)
    except AccessError as exc:
        raise ValueError(f"{principal} is already bound to another profile") from exc
