"""The probe event: what ``usp-webhooks probe`` sends to find out whether an endpoint really
verifies what it receives.

Not a USP event: never emitted, never subscribed to, not in :data:`~usp_schemas.EVENT_TYPES`.
It is signed like any delivery and carries the ``USP-Probe`` header; a receiver verifies it like
any delivery, then answers 2xx without acting on it (``data.probe`` is always true).
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from usp_schemas._types import EventId, UtcTimestamp
from usp_schemas._version import USP_VERSION, UspVersion

__all__ = ["PROBE_EVENT", "PROBE_HEADER", "ProbeData", "ProbeEvent"]

PROBE_EVENT: Final = "probe.test"
#: The header every probe delivery carries (value: the case's name), outside the signature.
PROBE_HEADER: Final = "USP-Probe"


class ProbeData(BaseModel):
    """What a probe carries: always ``probe: true``, and the case of the battery it is."""

    model_config = ConfigDict(extra="forbid")

    probe: Literal[True] = True
    case: str = Field(max_length=64, description="which check of the battery this delivery is")


class ProbeEvent(BaseModel):
    """A probe delivery's body."""

    model_config = ConfigDict(extra="forbid")

    event: Literal["probe.test"] = PROBE_EVENT
    event_id: EventId
    timestamp: UtcTimestamp
    version: UspVersion = USP_VERSION
    data: ProbeData
