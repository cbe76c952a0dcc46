"""Constrained scalar types shared by the payloads and the envelope.

Patterns are written in the subset that both pydantic's Rust regex engine and JSON Schema
(ECMA-262) understand, except where a lookahead is unavoidable: those checks run in Python and
publish the ECMA pattern in the schema.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator, AwareDatetime, BeforeValidator, StringConstraints, WithJsonSchema

__all__ = [
    "EVENT_ID_PATTERN",
    "BookingId",
    "EventId",
    "IsoDuration",
    "Rfc3339Datetime",
    "ServiceId",
    "SlotId",
    "UtcTimestamp",
    "WaitlistEntryId",
]

#: A producer-chosen event id: 1 to 80 characters of ``A-Z a-z 0-9 _ -``, starting with a letter or
#: digit (``evt_789abc`` as the binding's example, a ULID, a UUID, ``evt_`` + UUIDv7 hex as this
#: project makes them). Safe in a URL path, a log line and a header; nothing depends on its layout
#: (dedupe compares whole ids, listings order by acceptance time).
EVENT_ID_PATTERN = r"^[0-9A-Za-z][0-9A-Za-z_-]{0,79}$"

_ID_BODY = r"[0-9A-Za-z_-]{1,120}$"


def _prefixed_id(prefix: str) -> StringConstraints:
    return StringConstraints(pattern=rf"^{prefix}_{_ID_BODY}")


EventId = Annotated[str, StringConstraints(pattern=EVENT_ID_PATTERN)]
BookingId = Annotated[str, _prefixed_id("bkg")]
ServiceId = Annotated[str, _prefixed_id("svc")]
SlotId = Annotated[str, _prefixed_id("slot")]
WaitlistEntryId = Annotated[str, _prefixed_id("wl")]

# RFC 3339 section 5.6 ``date-time``: the offset is mandatory, unlike ISO 8601 which pydantic also
# parses (``2026-03-15 09:00``, week dates, unix numbers). Receivers should not guess a time zone.
_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:[Zz]|[+-]\d{2}:\d{2})$",
)


def _require_rfc3339(value: object) -> object:
    if isinstance(value, datetime):
        return value  # built in Python: AwareDatetime still refuses a naive one
    if isinstance(value, str) and _RFC3339.match(value):
        return value
    raise ValueError("expected an RFC 3339 date-time with an offset, e.g. 2026-03-15T09:00:00-04:00")


def _to_utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


#: A date-time with its offset kept (a slot at 09:00-04:00 stays local to the business).
Rfc3339Datetime = Annotated[AwareDatetime, BeforeValidator(_require_rfc3339)]
#: An instant normalised to UTC; pydantic serializes it with a ``Z`` suffix.
UtcTimestamp = Annotated[Rfc3339Datetime, AfterValidator(_to_utc)]

# ISO 8601 duration (no sign, no fractional parts except seconds): PT60M, P1D, PT1H30M.
_DURATION_PATTERN = r"^P(?!$)(\d+Y)?(\d+M)?(\d+W)?(\d+D)?(T(?=\d)(\d+H)?(\d+M)?(\d+(\.\d+)?S)?)?$"
_DURATION = re.compile(_DURATION_PATTERN)


def _require_duration(value: str) -> str:
    if not _DURATION.match(value):
        raise ValueError("expected an ISO 8601 duration, e.g. PT60M")
    return value


#: Kept as the string the business sent: ``timedelta`` would re-serialize ``PT60M`` as ``PT1H``.
IsoDuration = Annotated[
    str,
    AfterValidator(_require_duration),
    WithJsonSchema({"type": "string", "pattern": _DURATION_PATTERN, "examples": ["PT60M"]}),
]
