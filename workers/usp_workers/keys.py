"""The business's signing keys: generated on first start, rotated without a gap, published as JWKS.

Rotation is a schedule, not a switch. ``rotate`` adds a key that is *published* at once but only
*signs* from ``now + key_publish_lead_seconds`` (receivers' cached JWKS has picked it up by then);
from that moment both keys sign (``sig1`` new, ``sig2`` old) for ``key_overlap_seconds``, after
which the old key stops signing and, one publish lead later, leaves the JWKS. Every question
("which keys sign now?", "which are published now?") is answered from those timestamps.

Private keys live in the database (``usp_signing_keys.private_jwk``) or, with
``USP_KEY_STORE_PATH``, as 0600 files in that folder with only a reference in the database. They
are never logged: the record's ``repr`` omits them and nothing here prints them.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from pathlib import Path

from sqlmodel import Session, col, select

from usp_receiver import SigningKey

from .models import SigningKeyRecord, utcnow
from .settings import Settings

__all__ = ["ensure_signing_key", "published_jwks", "rotate", "signing_keys"]

_FILE_REF = "file:"


def ensure_signing_key(session: Session, settings: Settings, *, alg: str = "ed25519") -> SigningKeyRecord:
    """The newest key, generating the first one (signing at once) on a fresh database."""
    newest = session.exec(select(SigningKeyRecord).order_by(col(SigningKeyRecord.signs_from).desc())).first()
    if newest is not None:
        return newest
    return _add(session, settings, SigningKey.generate(alg), signs_from=utcnow())


def rotate(
    session: Session, settings: Settings, *, alg: str = "ed25519", now: datetime | None = None
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


def signing_keys(session: Session, settings: Settings, *, now: datetime | None = None) -> list[SigningKey]:
    """Keys that sign at ``now``, newest first (so the new key is ``sig1`` during an overlap)."""
    moment = now or utcnow()
    records = session.exec(
        select(SigningKeyRecord)
        .where(SigningKeyRecord.signs_from <= moment)
        .order_by(col(SigningKeyRecord.signs_from).desc())
    ).all()
    live = [r for r in records if r.retires_at is None or r.retires_at > moment]
    return [SigningKey.from_jwk(_private_jwk(record, settings)) for record in live]


def published_jwks(session: Session, settings: Settings, *, now: datetime | None = None) -> dict[str, object]:
    """The JWKS document: every key that signs now, will sign soon, or signed within one lead."""
    moment = now or utcnow()
    grace = timedelta(seconds=settings.key_publish_lead_seconds)
    records = session.exec(select(SigningKeyRecord).order_by(col(SigningKeyRecord.signs_from).desc())).all()
    keys = [
        json.loads(r.public_jwk) | {"use": "sig"}
        for r in records
        if r.retires_at is None or r.retires_at + grace > moment
    ]
    return {"keys": keys}


def _add(session: Session, settings: Settings, key: SigningKey, *, signs_from: datetime) -> SigningKeyRecord:
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


def _private_jwk(record: SigningKeyRecord, settings: Settings) -> dict[str, object]:
    text = record.private_jwk
    if text.startswith(_FILE_REF):
        text = Path(text.removeprefix(_FILE_REF)).read_text()
    jwk: dict[str, object] = json.loads(text)
    return jwk
