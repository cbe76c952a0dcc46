"""The webhook event envelope and one model per event type, joined in a union tagged by ``event``.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_schemas._events``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, Self, TypeAlias, get_args

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, model_validator
from pydantic_core import ErrorDetails

from usp_schemas._base import WireModel, always_sent
from usp_schemas._content import (
    ContentSubscription,
    ContentSubscriptionStatus,
    Entitlement,
    EntitlementStatus,
    Post,
    PostId,
    Publication,
    PublicationId,
)
from usp_schemas._payloads import (
    AvailabilityChange,
    Booking,
    BookingState,
    Service,
    WaitlistEntry,
    WaitlistState,
)
from usp_schemas._types import BookingId, EventId, ServiceId, UtcTimestamp, WaitlistEntryId
from usp_schemas._version import USP_VERSION, UspVersion

__all__ = [
    "BOOKING_CONFIRMED_EXAMPLE",
    "EVENT_TYPES",
    "OPERATIONAL_EVENT_TYPES",
    "AvailabilityChanged",
    "BookingCancelled",
    "BookingCompleted",
    "BookingConfirmed",
    "BookingCreated",
    "BookingEvent",
    "BookingNoShow",
    "BookingRescheduled",
    "ContentEvent",
    "DeadDelivery",
    "DeliveryDead",
    "EntitlementEvent",
    "EntitlementGranted",
    "EntitlementRevoked",
    "EventEnvelope",
    "EventValidationError",
    "OperationalEvent",
    "OperationalWebhookEvent",
    "PostEvent",
    "PostPublished",
    "PostUpdated",
    "ProbeFailed",
    "ProbeFailure",
    "ProbeFinding",
    "PublicationUpdated",
    "ServiceCreated",
    "ServiceDeleted",
    "ServiceEvent",
    "ServiceUpdated",
    "SubscriptionActivated",
    "SubscriptionCancelled",
    "SubscriptionCreated",
    "SubscriptionDisabled",
    "SubscriptionEvent",
    "SubscriptionFailing",
    "SubscriptionNotice",
    "SubscriptionRecovered",
    "WaitlistConverted",
    "WaitlistEvent",
    "WaitlistExpired",
    "WaitlistJoined",
    "WaitlistLeft",
    "WaitlistOffered",
    "WebhookEvent",
    "parse_event",
]


class EventEnvelope(WireModel):
    """Fields every event carries. Subclass per event type; never sent bare."""

    model_config = ConfigDict(json_schema_extra=always_sent("event"))

    event: str
    event_id: EventId = Field(
        description="producer-chosen, 1-80 of A-Z a-z 0-9 _ -; stable across retries: the dedupe key"
    )
    timestamp: UtcTimestamp = Field(description="when the change happened, RFC 3339 in UTC")
    version: UspVersion = USP_VERSION
    order_id: str | None = Field(default=None, min_length=1, description="the UCP order, when known")
    correlation_id: str | None = Field(default=None, min_length=1, description="the USP join id, when known")


class BookingEvent(EventEnvelope):
    """Base of ``booking.*``: ``booking_id`` is required and must equal ``data.id``.

    ``data_states`` lists the states the booking can be in right after the change the event
    reports; anything else means the sender built the event from the wrong snapshot.
    """

    data_states: ClassVar[frozenset[BookingState]]

    booking_id: BookingId
    service_id: ServiceId | None = None
    data: Booking

    @model_validator(mode="after")
    def _subject_matches_data(self) -> Self:
        _require_equal("booking_id", self.booking_id, "data.id", self.data.id)
        _require_equal_if_set("service_id", self.service_id, "data.service_id", self.data.service_id)
        _require_equal_if_set("order_id", self.order_id, "data.order_id", self.data.order_id)
        _require_state(self.event, self.data.state, self.data_states)
        return self


class ServiceEvent(EventEnvelope):
    """Base of ``catalog.service.*``: ``service_id`` is required and must equal ``data.id``."""

    service_id: ServiceId
    data: Service

    @model_validator(mode="after")
    def _subject_matches_data(self) -> Self:
        _require_equal("service_id", self.service_id, "data.id", self.data.id)
        return self


class WaitlistEvent(EventEnvelope):
    """Base of ``waitlist.*``: ``waitlist_entry_id`` is required and must equal ``data.id``."""

    data_states: ClassVar[frozenset[WaitlistState]]

    waitlist_entry_id: WaitlistEntryId
    service_id: ServiceId | None = None
    booking_id: BookingId | None = None
    data: WaitlistEntry

    @model_validator(mode="after")
    def _subject_matches_data(self) -> Self:
        _require_equal("waitlist_entry_id", self.waitlist_entry_id, "data.id", self.data.id)
        _require_equal_if_set("service_id", self.service_id, "data.service_id", self.data.service_id)
        _require_equal_if_set("booking_id", self.booking_id, "data.booking_id", self.data.booking_id)
        _require_state(self.event, self.data.state, self.data_states)
        return self


class BookingCreated(BookingEvent):
    """A booking was made (``pending``, or ``confirmed`` when the business confirms at once)."""

    data_states = frozenset({"pending", "confirmed"})
    event: Literal["booking.created"] = "booking.created"


class BookingConfirmed(BookingEvent):
    """The business confirmed a booking.

    >>> event = parse_event(BOOKING_CONFIRMED_EXAMPLE)
    >>> type(event).__name__, event.booking_id == event.data.id
    ('BookingConfirmed', True)
    """

    data_states = frozenset({"confirmed"})
    event: Literal["booking.confirmed"] = "booking.confirmed"


class BookingRescheduled(BookingEvent):
    """A booking moved to another slot; ``data`` has the new slot and times."""

    data_states = frozenset({"pending", "confirmed"})
    event: Literal["booking.rescheduled"] = "booking.rescheduled"


class BookingCancelled(BookingEvent):
    """A booking was cancelled (``data.cancellation_reason`` says why, when known)."""

    data_states = frozenset({"cancelled"})
    event: Literal["booking.cancelled"] = "booking.cancelled"


class BookingCompleted(BookingEvent):
    """The appointment took place."""

    data_states = frozenset({"completed"})
    event: Literal["booking.completed"] = "booking.completed"


class BookingNoShow(BookingEvent):
    """The buyer did not come."""

    data_states = frozenset({"no_show"})
    event: Literal["booking.no_show"] = "booking.no_show"


class ServiceCreated(ServiceEvent):
    """A service was added to the catalog."""

    event: Literal["catalog.service.created"] = "catalog.service.created"


class ServiceUpdated(ServiceEvent):
    """A service changed; ``data`` is the whole service, not a diff."""

    event: Literal["catalog.service.updated"] = "catalog.service.updated"


class ServiceDeleted(ServiceEvent):
    """A service left the catalog; ``data`` is its last state."""

    event: Literal["catalog.service.deleted"] = "catalog.service.deleted"


class AvailabilityChanged(EventEnvelope):
    """A service's slots changed; ``service_id`` is required and must equal ``data.service_id``."""

    event: Literal["catalog.availability.changed"] = "catalog.availability.changed"
    service_id: ServiceId
    data: AvailabilityChange

    @model_validator(mode="after")
    def _subject_matches_data(self) -> Self:
        _require_equal("service_id", self.service_id, "data.service_id", self.data.service_id)
        return self


class WaitlistJoined(WaitlistEvent):
    """A buyer joined a waitlist."""

    data_states = frozenset({"joined"})
    event: Literal["waitlist.joined"] = "waitlist.joined"


class WaitlistOffered(WaitlistEvent):
    """A slot was offered to a waitlisted buyer until ``data.offer_expires_at``."""

    data_states = frozenset({"offered"})
    event: Literal["waitlist.offered"] = "waitlist.offered"


class WaitlistConverted(WaitlistEvent):
    """An offer was taken: ``data.booking_id`` is the booking it became."""

    data_states = frozenset({"converted"})
    event: Literal["waitlist.converted"] = "waitlist.converted"


class WaitlistExpired(WaitlistEvent):
    """An offer (or the entry) lapsed without being taken."""

    data_states = frozenset({"expired"})
    event: Literal["waitlist.expired"] = "waitlist.expired"


class WaitlistLeft(WaitlistEvent):
    """The buyer left the waitlist."""

    data_states = frozenset({"left"})
    event: Literal["waitlist.left"] = "waitlist.left"


class ContentEvent(EventEnvelope):
    """Base of ``content.*`` (UCAP): ``publisher_id`` is the publication the event is about."""

    publisher_id: PublicationId


class PostEvent(ContentEvent):
    """Base of ``content.post.*``: ``post_id`` must equal ``data.id`` (metadata only, no body)."""

    post_id: PostId
    data: Post

    @model_validator(mode="after")
    def _subject_matches_data(self) -> Self:
        _require_equal("post_id", self.post_id, "data.id", self.data.id)
        _require_equal("publisher_id", self.publisher_id, "data.publisher_id", self.data.publisher_id)
        return self


class PostPublished(PostEvent):
    """A post was published."""

    event: Literal["content.post.published"] = "content.post.published"


class PostUpdated(PostEvent):
    """A published post changed; ``data`` is the whole post's metadata."""

    event: Literal["content.post.updated"] = "content.post.updated"


class PublicationUpdated(ContentEvent):
    """A publication (its name, description, tiers ...) changed; ``data`` is all of it."""

    event: Literal["content.publication.updated"] = "content.publication.updated"
    data: Publication

    @model_validator(mode="after")
    def _subject_matches_data(self) -> Self:
        _require_equal("publisher_id", self.publisher_id, "data.id", self.data.id)
        return self


class SubscriptionEvent(ContentEvent):
    """Base of ``content.subscription.*``: ``subscription_id`` must equal ``data.id``."""

    data_states: ClassVar[frozenset[ContentSubscriptionStatus]]

    subscription_id: str = Field(pattern=r"^csub_[0-9A-Za-z_-]{1,120}$")
    data: ContentSubscription

    @model_validator(mode="after")
    def _subject_matches_data(self) -> Self:
        _require_equal("subscription_id", self.subscription_id, "data.id", self.data.id)
        _require_equal("publisher_id", self.publisher_id, "data.publisher_id", self.data.publisher_id)
        _require_state(self.event, self.data.status, self.data_states)
        return self


class SubscriptionCreated(SubscriptionEvent):
    """An agent asked to subscribe; the subscription waits for its payment."""

    data_states = frozenset({"pending_payment"})
    event: Literal["content.subscription.created"] = "content.subscription.created"


class SubscriptionActivated(SubscriptionEvent):
    """The payment was confirmed: the subscription is active."""

    data_states = frozenset({"active"})
    event: Literal["content.subscription.activated"] = "content.subscription.activated"


class SubscriptionCancelled(SubscriptionEvent):
    """The subscription was cancelled (by the agent, or the business)."""

    data_states = frozenset({"cancelled"})
    event: Literal["content.subscription.canceled"] = "content.subscription.canceled"


class EntitlementEvent(ContentEvent):
    """Base of ``content.entitlement.*``: ``entitlement_id`` must equal ``data.id``."""

    data_states: ClassVar[frozenset[EntitlementStatus]]

    entitlement_id: str = Field(pattern=r"^ent_[0-9A-Za-z_-]{1,120}$")
    subscription_id: str = Field(pattern=r"^csub_[0-9A-Za-z_-]{1,120}$")
    data: Entitlement

    @model_validator(mode="after")
    def _subject_matches_data(self) -> Self:
        _require_equal("entitlement_id", self.entitlement_id, "data.id", self.data.id)
        _require_equal(
            "subscription_id", self.subscription_id, "data.subscription_id", self.data.subscription_id
        )
        _require_equal("publisher_id", self.publisher_id, "data.publisher_id", self.data.publisher_id)
        _require_state(self.event, self.data.status, self.data_states)
        return self


class EntitlementGranted(EntitlementEvent):
    """An agent may now read the tier's posts."""

    data_states = frozenset({"active"})
    event: Literal["content.entitlement.granted"] = "content.entitlement.granted"


class EntitlementRevoked(EntitlementEvent):
    """An entitlement ended before its term (cancelled) or at it (expired)."""

    data_states = frozenset({"cancelled", "expired"})
    event: Literal["content.entitlement.revoked"] = "content.entitlement.revoked"


# -- operational events: the service's own, about its subscriptions, deliveries and probes -----


class SubscriptionNotice(WireModel):
    """What happened to a subscription: its ``state`` now and why (``reason``)."""

    subscription_id: str = Field(pattern=r"^sub_[0-9A-Za-z_-]{1,120}$")
    url: str = Field(description="where it delivers (credentials in it masked)")
    state: Literal["active", "disabled"]
    reason: str | None = Field(default=None, description="why, in words (never a secret)")


class DeadDelivery(WireModel):
    """A delivery that used up its schedule: the event it carried, where, how many tries, why."""

    delivery_id: str = Field(pattern=r"^dlv_[0-9A-Za-z_-]{1,120}$")
    event_id: EventId
    event_type: str
    subscription_id: str = Field(pattern=r"^sub_[0-9A-Za-z_-]{1,120}$")
    url: str
    attempts: int = Field(ge=0)
    last_error: str | None = None


class ProbeFinding(WireModel):
    """One probe case that went wrong, and what its answer means."""

    case: str
    finding: str


class ProbeFailure(WireModel):
    """A ``usp-webhooks probe`` run that found problems: the target and what went wrong."""

    probe_id: str
    target: str
    transport: str
    problems: int = Field(ge=1)
    findings: list[ProbeFinding]


class OperationalEvent(EventEnvelope):
    """Base of the service's own events (operational webhooks): sent only to the business's own
    subscriptions that name them (``"*"`` does not), through the same pipeline, signed the same way.
    ``subscription_id`` is the subscription the event is about, when there is one."""

    subscription_id: str | None = Field(default=None, pattern=r"^sub_[0-9A-Za-z_-]{1,120}$")


class SubscriptionDisabled(OperationalEvent):
    """A subscription was disabled: by a 410, by failing too long, by an operator, a lapsed lease."""

    event: Literal["subscription.disabled"] = "subscription.disabled"
    data: SubscriptionNotice


class SubscriptionFailing(OperationalEvent):
    """A subscription's endpoint keeps failing: its breaker opened (or re-opened after a probe)."""

    event: Literal["subscription.failing"] = "subscription.failing"
    data: SubscriptionNotice


class SubscriptionRecovered(OperationalEvent):
    """A failing subscription's endpoint answers again: its breaker closed."""

    event: Literal["subscription.recovered"] = "subscription.recovered"
    data: SubscriptionNotice


class DeliveryDead(OperationalEvent):
    """A delivery went dead: it waits in the dead letter for a redrive."""

    event: Literal["delivery.dead"] = "delivery.dead"
    data: DeadDelivery


class ProbeFailed(OperationalEvent):
    """A probe found that an endpoint does not verify what it receives as it should."""

    event: Literal["probe.failed"] = "probe.failed"
    data: ProbeFailure


#: The operational events' ``event`` values.
OPERATIONAL_EVENT_TYPES: tuple[str, ...] = (
    "subscription.disabled",
    "subscription.failing",
    "subscription.recovered",
    "delivery.dead",
    "probe.failed",
)
#: Any operational event, discriminated on ``event``.
OperationalWebhookEvent: TypeAlias = Annotated[
    SubscriptionDisabled | SubscriptionFailing | SubscriptionRecovered | DeliveryDead | ProbeFailed,
    Field(discriminator="event"),
]


#: Any USP webhook event, discriminated on ``event`` so ``data`` is typed. Use with
#: ``pydantic.TypeAdapter`` or as a field type; ``parse_event`` is the short way.
WebhookEvent: TypeAlias = Annotated[
    BookingCreated
    | BookingConfirmed
    | BookingRescheduled
    | BookingCancelled
    | BookingCompleted
    | BookingNoShow
    | ServiceCreated
    | ServiceUpdated
    | ServiceDeleted
    | AvailabilityChanged
    | WaitlistJoined
    | WaitlistOffered
    | WaitlistConverted
    | WaitlistExpired
    | WaitlistLeft
    | PostPublished
    | PostUpdated
    | PublicationUpdated
    | SubscriptionCreated
    | SubscriptionActivated
    | SubscriptionCancelled
    | EntitlementGranted
    | EntitlementRevoked
    | SubscriptionDisabled
    | SubscriptionFailing
    | SubscriptionRecovered
    | DeliveryDead
    | ProbeFailed,
    Field(discriminator="event"),
]

_EVENT_MODELS: tuple[type[EventEnvelope], ...] = get_args(get_args(WebhookEvent)[0])

#: Every USP and UCAP ``event`` value, in the order of the documentation; the service's own
#: operational events are :data:`OPERATIONAL_EVENT_TYPES`.
EVENT_TYPES: tuple[str, ...] = tuple(
    model.model_fields["event"].default
    for model in _EVENT_MODELS
    if model.model_fields["event"].default not in OPERATIONAL_EVENT_TYPES
)

_EVENT_ADAPTER: TypeAdapter[WebhookEvent] = TypeAdapter(WebhookEvent)


class EventValidationError(ValueError):
    """The input is not a valid USP event. ``errors`` holds pydantic's error details without the
    offending input values (they can hold buyer PII and end up in logs).

    >>> try:
    ...     parse_event(b'{"event": "booking.exploded"}')
    ... except EventValidationError as exc:
    ...     exc.errors[0]["type"]
    'union_tag_invalid'
    """

    def __init__(self, message: str, errors: list[ErrorDetails]) -> None:
        super().__init__(message)
        self.errors = errors


def parse_event(raw: bytes | str | Mapping[str, Any]) -> WebhookEvent:
    """Validate a webhook body (bytes or text) or an already-decoded JSON object into its event model.

    Pass the exact bytes you verified the signature over; decode them only once, here.

    >>> event = parse_event(BOOKING_CONFIRMED_EXAMPLE)
    >>> event.event, event.data.state, event.timestamp.isoformat()
    ('booking.confirmed', 'confirmed', '2026-03-14T22:06:00+00:00')
    """
    try:
        if isinstance(raw, bytes | str):
            return _EVENT_ADAPTER.validate_json(raw)
        return _EVENT_ADAPTER.validate_python(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        summary = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in errors[:5])
        raise EventValidationError(f"invalid USP event ({len(errors)} error(s)): {summary}", errors) from None


#: A realistic ``booking.confirmed`` body, the binding's example completed with a full booking.
BOOKING_CONFIRMED_EXAMPLE = """{
  "event": "booking.confirmed",
  "event_id": "evt_019a2b3c4d5e7000800000000000000a",
  "booking_id": "bkg_456def",
  "order_id": "ord_ucp_001",
  "timestamp": "2026-03-14T22:06:00Z",
  "version": "2026-08-20",
  "data": {
    "id": "bkg_456def",
    "service_id": "svc_haircut_001",
    "slot_id": "slot_20260315_0900",
    "state": "confirmed",
    "buyer": {"first_name": "Alice", "email": "alice@example.com"},
    "start": "2026-03-15T09:00:00-04:00",
    "end": "2026-03-15T10:00:00-04:00",
    "created_at": "2026-03-14T22:05:12Z",
    "updated_at": "2026-03-14T22:06:00Z",
    "order_id": "ord_ucp_001"
  }
}"""


def _require_equal(name: str, value: str, data_name: str, data_value: str) -> None:
    if value != data_value:
        raise ValueError(f"{name} {value!r} does not match {data_name} {data_value!r}")


def _require_equal_if_set(name: str, value: str | None, data_name: str, data_value: str | None) -> None:
    if value is not None and data_value is not None:
        _require_equal(name, value, data_name, data_value)


def _require_state(event: str, state: str, allowed: frozenset[str]) -> None:
    if state not in allowed:
        raise ValueError(f"{event} cannot carry data in state {state!r} (expected {sorted(allowed)})")
