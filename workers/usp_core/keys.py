"""The business's signing keys: generated on first start, rotated without a gap, published as JWKS.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_core.keys``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal

import sqlalchemy as sa
from sqlmodel import Field, Session, SQLModel, col, select

from usp_core.clock import UtcDateTime, utcnow
from usp_core.settings import CommonSettings
from usp_receiver import SigningKey

__all__ = [
    "KeyFacts",
    "KeyState",
    "SigningKeyRecord",
    "describe_key",
    "describe_keys",
    "ensure_signing_key",
    "published_jwks",
    "rotate",
    "rotate_or_first",
    "signing_keys",
]


class SigningKeyRecord(SQLModel, table=True):
    """A signing key. It is published from ``created_at``, signs from ``signs_from`` until
    ``retires_at`` (null: until rotated out), and stays published a while after (the JWKS cache)."""

    __tablename__ = "usp_signing_keys"

    kid: str = Field(primary_key=True, max_length=64)
    alg: str = Field(max_length=32)
    private_jwk: str = Field(sa_type=sa.Text, repr=False)
    public_jwk: str = Field(sa_type=sa.Text)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)
    signs_from: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)
    retires_at: datetime | None = Field(default=None, sa_type=UtcDateTime)


_FILE_REF = "file:"

KeyState = Literal["published, not signing yet", "signing", "retired, still published", "retired"]


@dataclass(frozen=True)
class KeyFacts:
    """What an operator may see of a key: its schedule and what it does at one moment. Built
    from the record's public columns only, so nothing private can leak through it."""

    kid: str
    alg: str
    created_at: datetime
    signs_from: datetime
    retires_at: datetime | None
    published: bool
    state: KeyState


def ensure_signing_key(
    session: Session, settings: CommonSettings, *, alg: str = "ed25519"
) -> SigningKeyRecord:
    """The newest key, generating the first one (signing at once) on a fresh database."""
    newest = session.exec(select(SigningKeyRecord).order_by(col(SigningKeyRecord.signs_from).desc())).first()
    if newest is not None:
        return newest
    return _add(session, settings, SigningKey.generate(alg), signs_from=utcnow())


def rotate(
    session: Session, settings: CommonSettings, *, alg: str = "ed25519", now: datetime | None = None
) -> SigningKeyRecord:
    """Add a new key: published now, signing after the publish lead, the old ones retiring after
    the overlap. Returns the new key's record (commit the session to make it happen)."""
    moment = now or utcnow()
    signs_from = moment + timedelta(seconds=settings.key_publish_lead_seconds)
    retire_at = signs_from + timedelta(seconds=settings.key_overlap_seconds)
    for record in session.exec(select(SigningKeyRecord)).all():
        if record.retires_at is None or record.retires_at > retire_at:
            record.retires_at = retire_at
            session.add(record)
    return _add(session, settings, SigningKey.generate(alg), signs_from=signs_from)


def rotate_or_first(
    session: Session, settings: CommonSettings, *, alg: str = "ed25519", now: datetime | None = None
) -> tuple[SigningKeyRecord, bool]:
    """:func:`rotate`, except on a database without keys: there the new key is the first and signs
    at once (one waiting for the publish lead would leave nothing to sign with until then).
    Returns the new record and whether it was the first (commit the session to make it happen)."""
    if session.exec(select(SigningKeyRecord)).first() is None:
        return _add(session, settings, SigningKey.generate(alg), signs_from=now or utcnow()), True
    return rotate(session, settings, alg=alg, now=now), False


def describe_keys(
    session: Session, settings: CommonSettings, *, now: datetime | None = None
) -> list[KeyFacts]:
    """Every key, oldest schedule first, with what it does at ``now``."""
    moment = now or utcnow()
    records = session.exec(select(SigningKeyRecord).order_by(col(SigningKeyRecord.signs_from))).all()
    return [describe_key(record, settings, now=moment) for record in records]


def describe_key(
    record: SigningKeyRecord, settings: CommonSettings, *, now: datetime | None = None
) -> KeyFacts:
    moment = now or utcnow()
    published = _published(record, settings, moment)
    state: KeyState
    if record.signs_from > moment:
        state = "published, not signing yet"
    elif record.retires_at is None or record.retires_at > moment:
        state = "signing"
    else:
        state = "retired, still published" if published else "retired"
    return KeyFacts(
        kid=record.kid,
        alg=record.alg,
        created_at=record.created_at,
        signs_from=record.signs_from,
        retires_at=record.retires_at,
        published=published,
        state=state,
    )


def signing_keys(
    session: Session, settings: CommonSettings, *, now: datetime | None = None
) -> list[SigningKey]:
    """Keys that sign at ``now``, newest first (so the new key is ``sig1`` during an overlap)."""
    moment = now or utcnow()
    records = session.exec(
        select(SigningKeyRecord)
        .where(SigningKeyRecord.signs_from <= moment)
        .order_by(col(SigningKeyRecord.signs_from).desc())
    ).all()
    live = [r for r in records if r.retires_at is None or r.retires_at > moment]
    return [SigningKey.from_jwk(_private_jwk(record, settings)) for record in live]


def published_jwks(
    session: Session, settings: CommonSettings, *, now: datetime | None = None
) -> dict[str, object]:
    """The JWKS document: every key that signs now, will sign soon, or signed within one lead."""
    moment = now or utcnow()
    records = session.exec(select(SigningKeyRecord).order_by(col(SigningKeyRecord.signs_from).desc())).all()
    keys = [json.loads(r.public_jwk) | {"use": "sig"} for r in records if _published(r, settings, moment)]
    return {"keys": keys}


def _published(record: SigningKeyRecord, settings: CommonSettings, moment: datetime) -> bool:
    """In the JWKS at ``moment``: from creation until one publish lead after it stops signing
    (receivers' cached JWKS may still name it for a signature made just before)."""
    grace = timedelta(seconds=settings.key_publish_lead_seconds)
    return record.retires_at is None or record.retires_at + grace > moment


def _add(
    session: Session, settings: CommonSettings, key: SigningKey, *, signs_from: datetime
) -> SigningKeyRecord:
    private = json.dumps(key.to_jwk())
    if settings.key_store_path is not None:
        private = _FILE_REF + str(_write_private(settings.key_store_path, key.kid, private))
    record = SigningKeyRecord(
        kid=key.kid,
        alg=key.alg,
        private_jwk=private,
        public_jwk=json.dumps(dict(key.public.jwk)),
        signs_from=signs_from,
    )
    session.add(record)
    return record


def _write_private(folder: Path, kid: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{kid}.jwk"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    return path


def _private_jwk(record: SigningKeyRecord, settings: CommonSettings) -> dict[str, object]:
    text = record.private_jwk
    if text.startswith(_FILE_REF):
        text = Path(text.removeprefix(_FILE_REF)).read_text()
    jwk: dict[str, object] = json.loads(text)
    return jwk
