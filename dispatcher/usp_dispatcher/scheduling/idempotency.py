"""Idempotency keys: a retried state change is answered, not done again.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.scheduling.idempotency``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col

from usp_dispatcher.errors import InvalidRequest
from usp_dispatcher.scheduling.content import Result, structured
from usp_dispatcher.scheduling.outcomes import Outcome, idempotency_conflict
from usp_dispatcher.scheduling.tables import IdempotencyRecord

__all__ = ["MAX_KEY_LENGTH", "Answer", "forget_idempotency_keys", "perform", "request_hash"]

MAX_KEY_LENGTH = 255


@dataclass(frozen=True, slots=True)
class Answer:
    """What to send back: ``status_code`` (REST; 201 for a creation, else 200), the structured
    content, and whether it was replayed from an earlier call."""

    status_code: int
    body: dict[str, Any]
    replayed: bool = False


def perform(
    session: Session,
    run: Callable[[], Result | dict[str, Any]],
    *,
    operation: str,
    arguments: Mapping[str, Any],
    idempotency_key: str | None,
    principal: str,
    created_status: int = 200,
    kept: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Answer:
    """Run ``run`` (one service function call on ``session``) and commit, or replay.

    ``run`` returns a domain :data:`Result`, or the answer's structured body itself for a change
    outside the scheduling domain (a feed subscription).

    ``operation`` and ``arguments`` (JSON-able: the call's inputs, ids included) identify the
    request for the conflict check. ``created_status`` is the status of a successful answer.
    ``kept`` is what the record keeps of the body for a replay (a secret shown once is not kept).
    Raises :class:`InvalidRequest` for a malformed key (and whatever ``run`` raises).
    """
    if idempotency_key is None:
        answer = _run(run, created_status)
        session.commit()
        return answer
    if not idempotency_key or len(idempotency_key) > MAX_KEY_LENGTH or not idempotency_key.isprintable():
        raise InvalidRequest(f"an idempotency key is 1 to {MAX_KEY_LENGTH} printable characters")
    digest = request_hash(operation, arguments)
    earlier = _earlier_answer(session, principal, idempotency_key, digest)
    if earlier is not None:
        return earlier
    answer = _run(run, created_status)
    session.add(
        IdempotencyRecord(
            principal=principal,
            key=idempotency_key,
            request_hash=digest,
            status_code=answer.status_code,
            response=json.dumps(
                answer.body if kept is None else kept(dict(answer.body)), separators=(",", ":")
            ),
        )
    )
    try:
        session.commit()
    except sa.exc.IntegrityError:
        session.rollback()  # our change and events go too: the other call's stand
        earlier = _earlier_answer(session, principal, idempotency_key, digest)
        if earlier is None:
            raise  # not the key: a real integrity failure
        return earlier
    return answer


def request_hash(operation: str, arguments: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of the request (keys sorted, no spaces)."""
    canonical = json.dumps(
        {"operation": operation, "arguments": arguments}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def forget_idempotency_keys(session: Session, *, before: datetime) -> int:
    """Delete keys stored before ``before`` (e.g. a day ago): a retry comes within minutes, and
    the table must not grow forever. Returns how many went; the caller commits."""
    statement = sa.delete(IdempotencyRecord).where(col(IdempotencyRecord.created_at) < before)
    return session.exec(statement).rowcount


def _run(run: Callable[[], Result | dict[str, Any]], created_status: int) -> Answer:
    result = run()
    if isinstance(result, dict):
        return Answer(created_status, result)
    return Answer(200 if isinstance(result, Outcome) else created_status, structured(result))


def _earlier_answer(session: Session, principal: str, key: str, digest: str) -> Answer | None:
    record = session.get(IdempotencyRecord, (principal, key))
    if record is None:
        return None
    if record.request_hash != digest:
        return Answer(200, structured(idempotency_conflict()))
    body: dict[str, Any] = json.loads(record.response)
    return Answer(record.status_code, body, replayed=True)
