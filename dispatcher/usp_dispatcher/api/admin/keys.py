"""``/admin``: the business's signing keys: list them, rotate one in."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, Body
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field
from sqlmodel import Session

from usp_core import keys
from usp_dispatcher.settings import ApiSettings
from usp_dispatcher.web.deps import SessionDep, SettingsDep

__all__ = ["router"]

router = APIRouter()


class KeyOut(BaseModel):
    """A signing key's public facts (never its private material)."""

    kid: str
    alg: str
    created_at: datetime
    signs_from: datetime
    retires_at: datetime | None = Field(description="stops signing then; null: until rotated out")
    published: bool = Field(description="in the JWKS now")
    state: keys.KeyState


class KeyList(BaseModel):
    items: list[KeyOut]


class KeyRotateIn(BaseModel):
    alg: Literal["ed25519", "ecdsa-p256-sha256"] = "ed25519"


class RotateOut(BaseModel):
    key: KeyOut
    first: bool = Field(description="there was no key before it, so it signs at once")
    signs_from: datetime = Field(description="when the new key starts signing")
    older_keys_retire_at: datetime | None = Field(
        description="when the older keys stop signing; null when there were none"
    )


@router.get("/keys", response_model=KeyList)
async def list_keys(session: SessionDep, settings: SettingsDep) -> KeyList:
    """Every signing key with its schedule and what it does now."""
    facts = await run_in_threadpool(keys.describe_keys, session, settings)
    return KeyList(items=[KeyOut.model_validate(fact, from_attributes=True) for fact in facts])


@router.post("/keys/rotate", status_code=201, response_model=RotateOut)
async def rotate_key(
    session: SessionDep, settings: SettingsDep, body: Annotated[KeyRotateIn | None, Body()] = None
) -> RotateOut:
    """Add a key: published at once, signing after the publish lead, the older keys then signing
    alongside it for the overlap before they retire. The first key of a database signs at once."""
    alg = body.alg if body is not None else "ed25519"
    return await run_in_threadpool(_rotate, session, settings, alg)


def _rotate(session: Session, settings: ApiSettings, alg: str) -> RotateOut:
    record, first = keys.rotate_or_first(session, settings, alg=alg)
    session.commit()
    retiring = None if first else record.signs_from + timedelta(seconds=settings.key_overlap_seconds)
    fact = keys.describe_key(record, settings)
    return RotateOut(
        key=KeyOut.model_validate(fact, from_attributes=True),
        first=first,
        signs_from=record.signs_from,
        older_keys_retire_at=retiring,
    )
