"""Business outcomes: what a service function answers instead of a result, never by raising.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.scheduling.outcomes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from usp_schemas import (
    BOOKING_NOT_FOUND,
    IDEMPOTENCY_CONFLICT,
    INVALID_STATE_TRANSITION,
    SERVICE_NOT_FOUND,
    SLOT_UNAVAILABLE,
    WAITLIST_CLOSED,
    Message,
    Severity,
)

__all__ = [
    "SUBSCRIPTION_LIMIT_REACHED",
    "SUBSCRIPTION_NOT_FOUND",
    "WAITLIST_ENTRY_NOT_FOUND",
    "WAITLIST_LIMIT_REACHED",
    "Outcome",
    "booking_not_found",
    "idempotency_conflict",
    "invalid_state_transition",
    "service_not_found",
    "slot_unavailable",
    "subscription_limit_reached",
    "subscription_not_found",
    "waitlist_closed",
    "waitlist_entry_not_found",
    "waitlist_limit_reached",
]

#: Our addition to the contract's codes (``OUTCOME_CODES`` allows a business its own): an unknown
#: waitlist entry id. ``waitlist_closed`` would tell the agent the waitlist exists and is shut.
WAITLIST_ENTRY_NOT_FOUND: Final = "waitlist_entry_not_found"
#: Ours too: the platform already holds as many open waitlist entries as it may.
WAITLIST_LIMIT_REACHED: Final = "waitlist_limit_reached"
#: Ours: an unknown feed subscription id, or another platform's.
SUBSCRIPTION_NOT_FOUND: Final = "subscription_not_found"
#: Ours: the platform's profile already holds as many active feed subscriptions as it may.
SUBSCRIPTION_LIMIT_REACHED: Final = "subscription_limit_reached"


@dataclass(frozen=True, slots=True)
class Outcome:
    """A business refusal: the request was understood and declined; nothing was changed.

    >>> slot_unavailable("slot_x").code
    'slot_unavailable'
    """

    messages: tuple[Message, ...]

    @property
    def code(self) -> str:
        """The first message's code (there is one message per refusal today)."""
        return self.messages[0].code


def slot_unavailable(slot_id: str, *, why: str = "is no longer available") -> Outcome:
    return _error(SLOT_UNAVAILABLE, f"The slot {slot_id} {why}.", "recoverable", "$.slot_id")


def service_not_found(service_id: str) -> Outcome:
    return _error(
        SERVICE_NOT_FOUND, f"There is no bookable service {service_id}.", "recoverable", "$.service_id"
    )


def booking_not_found(booking_id: str) -> Outcome:
    return _error(BOOKING_NOT_FOUND, f"There is no booking {booking_id}.", "unrecoverable", "$.booking_id")


def invalid_state_transition(what: str, state: str, action: str) -> Outcome:
    return _error(INVALID_STATE_TRANSITION, f"A {state} {what} cannot be {action}.", "unrecoverable")


def waitlist_closed(why: str) -> Outcome:
    return _error(WAITLIST_CLOSED, f"The waitlist is closed: {why}.", "requires_buyer_input")


def waitlist_entry_not_found(entry_id: str) -> Outcome:
    return _error(
        WAITLIST_ENTRY_NOT_FOUND,
        f"There is no waitlist entry {entry_id}.",
        "unrecoverable",
        "$.waitlist_entry_id",
    )


def waitlist_limit_reached(limit: int) -> Outcome:
    return _error(
        WAITLIST_LIMIT_REACHED,
        f"Your platform already has {limit} open waitlist entries at this business, the most it may "
        "hold: leave one that is no longer wanted first.",
        "recoverable",
    )


def idempotency_conflict() -> Outcome:
    return _error(
        IDEMPOTENCY_CONFLICT,
        "This idempotency key was already used for a different request; use a new key for a new request.",
        "unrecoverable",
    )


def subscription_not_found(subscription_id: str) -> Outcome:
    return _error(
        SUBSCRIPTION_NOT_FOUND,
        f"There is no subscription {subscription_id}.",
        "unrecoverable",
        path="$.subscription_id",
    )


def subscription_limit_reached(limit: int) -> Outcome:
    return _error(
        SUBSCRIPTION_LIMIT_REACHED,
        f"Your platform profile already has {limit} active subscriptions, the most it may hold: "
        "delete one first.",
        "recoverable",
    )


def _error(code: str, content: str, severity: Severity, path: str | None = None) -> Outcome:
    return Outcome((Message(type="error", code=code, content=content, severity=severity, path=path),))
