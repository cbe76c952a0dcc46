"""The scheduling operations (catalog, availability, bookings, waitlist, and a platform's feed
subscriptions) as one table that the MCP tools and the REST routes both run: each surface
authenticates, authorizes and reads its wire format, then calls the same operation.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.scheduling.service``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import date
from functools import partial
from typing import Any, Final, TypeVar

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.engine import Engine
from sqlmodel import Session

from usp_core import db
from usp_core.ssrf import Resolver
from usp_dispatcher import access
from usp_dispatcher.access import Access, Caller
from usp_dispatcher.errors import InvalidRequest, NotFound, Refused, Unauthenticated
from usp_dispatcher.scheduling import bookings, catalog, idempotency, waitlist
from usp_dispatcher.scheduling.content import Result, structured
from usp_dispatcher.scheduling.inputs import BookingIn, CancelIn, RescheduleIn, WaitlistIn
from usp_dispatcher.scheduling.outcomes import (
    booking_not_found,
    subscription_limit_reached,
    subscription_not_found,
    waitlist_entry_not_found,
)
from usp_dispatcher.scheduling.ownership import may_touch_booking, may_touch_waitlist_entry
from usp_dispatcher.settings import ApiSettings
from usp_dispatcher.webhooks import feed
from usp_receiver import jwk_thumbprint
from usp_workers import OnDead, Ordering, Subscription, Transport, WebhookSecrets

__all__ = ["INVALID_ARGUMENTS", "OPERATIONS", "Call", "Operation", "UspMeta", "read_meta", "release"]

_T = TypeVar("_T")
_ID = Field(min_length=1, max_length=128)
#: The reason of every :class:`Refused` an operation raises for its arguments (``invalid_params``
#: in MCP, a 422 in REST).
INVALID_ARGUMENTS: Final = "invalid_arguments"


# ------------------------------------------------------------------------------------ the call


class UspMeta(BaseModel):
    """``arguments._meta.usp`` as the operations read it (REST carries it in headers;
    ``access.authorize`` reads ``profile`` and ``authorization`` itself). Unknown members are
    allowed: the binding may grow."""

    model_config = ConfigDict(extra="allow")

    profile: str | None = Field(default=None, min_length=1, max_length=2048)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=idempotency.MAX_KEY_LENGTH)
    correlation_id: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^[\x21-\x7e]+$")
    platform_key: dict[str, Any] | None = Field(default=None, description="the platform's public JWK")
    authorization: dict[str, Any] | None = None


class _Meta(BaseModel):
    model_config = ConfigDict(extra="allow")

    usp: UspMeta = Field(default_factory=UspMeta)


def read_meta(arguments: Mapping[str, Any]) -> UspMeta:
    """``arguments._meta.usp``; raises a pydantic ``ValidationError`` when it is malformed."""
    raw = arguments.get("_meta")
    return _Meta.model_validate({} if raw is None else raw).usp


@dataclass(frozen=True, slots=True)
class Call:
    """One authorized call: who is calling and the binding's ``_meta.usp`` inputs."""

    engine: Engine
    settings: ApiSettings
    caller: Caller
    meta: UspMeta
    correlation_id: str | None
    resolver: Resolver | None = None
    #: Set by a state change answered from the idempotency store (REST says so in a header).
    replayed: list[bool] = field(default_factory=list)
    #: The session the call was authenticated and authorized on, still open: the call's first
    #: database work goes on in it, so a call is one transaction. Whoever opened it closes it
    #: (:func:`release`).
    held: list[Session] = field(default_factory=list)

    @property
    def principal(self) -> str:
        """Whose namespace idempotency keys live in: the authenticated principal, else the
        platform's profile (an unauthenticated platform, when the policy allows one)."""
        if self.caller.principal:
            name = self.caller.principal
        elif self.caller.profile:
            name = f"profile:{self.caller.profile}"
        else:
            return "anonymous"
        # The key table's principal column holds 256 characters; a profile URI may hold 2048.
        return name if len(name) <= 256 else "sha256:" + hashlib.sha256(name.encode()).hexdigest()

    async def db(self, work: Callable[[Session], _T]) -> _T:
        """Run ``work`` off the event loop (the database calls block): on the held session the
        first time, on a fresh one after."""
        held = self.held.pop() if self.held else None
        return await anyio.to_thread.run_sync(partial(_in_session, self.engine, work, held))


def _in_session(engine: Engine, work: Callable[[Session], _T], held: Session | None) -> _T:
    with db.session_or_held(engine, held) as session:
        return work(session)


async def release(session: Session) -> None:
    """Close a call's session; off the event loop when its work left a transaction open (the
    rollback is a round trip), at once when it committed."""
    if session.in_transaction():
        await anyio.to_thread.run_sync(session.close)
    else:
        session.close()


Handler = Callable[[Call, Any], Awaitable[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation: who may call it (its access class), its arguments, what runs it, and the
    USP capability family it belongs to."""

    name: str
    access: Access
    arguments: type[BaseModel]
    handler: Handler
    family: str


# ------------------------------------------------------------------------------------ arguments


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoArguments(_Strict):
    """``usp_catalog_list`` takes none."""


class AvailabilityArguments(_Strict):
    """``usp_availability_query``: the REST route's query parameters."""

    service_id: str = _ID
    start_date: date
    end_date: date


class BookingRef(_Strict):
    booking_id: str = _ID


class CancelArguments(CancelIn):
    booking_id: str = _ID


class RescheduleArguments(RescheduleIn):
    booking_id: str = _ID


class WaitlistRef(_Strict):
    waitlist_entry_id: str = _ID


class SubscriptionArguments(_Strict):
    """A subscription for the caller's own profile (the profile is not an argument: it is the
    caller's, and the events it may receive are that profile's)."""

    url: str = Field(min_length=1, max_length=2048, description="where to POST events (http or https)")
    transport: Transport = Field(
        default=Transport.REST, description="rest: the event JSON; jsonrpc: usp_webhook"
    )
    event_types: list[str] = Field(
        default_factory=lambda: ["*"], min_length=1, max_length=64, description="'*', exact types, or globs"
    )
    ordering: Ordering = Field(
        default=Ordering.NONE,
        description="subject: each booking's (waitlist entry's, post's) events one at a time, in the"
        " order they were emitted; none: in parallel",
    )
    on_dead: OnDead = Field(
        default=OnDead.BLOCK,
        description="under subject ordering, a dead delivery blocks its subject's later events until"
        " redriven, or is skipped",
    )
    signatures: list[str] = Field(
        default_factory=lambda: ["rfc9421"],
        min_length=1,
        max_length=3,
        description="rfc9421 (always), and standard-webhooks (its whsec_ secret is in this answer, once)"
        " and/or standard-webhooks-v1a (its whpk_ public key is in this answer)",
    )
    filter: dict[str, Any] | None = Field(
        default=None,
        description="only events whose JSON passes it: leaves {path, one of eq ne in exists lt lte gt gte"
        " prefix} over dotted paths (data.service_id), combined with all / any / not",
    )
    headers: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=16,
        description="headers of its own on every delivery: {name, value, secret?}; a secret value is"
        " sealed at rest and shown masked; the protocol's headers are refused",
    )
    sign_headers: bool = Field(default=False, description="cover those headers with the RFC 9421 signature")
    retry_schedule: dict[str, Any] | None = Field(
        default=None,
        description="its own {delays: [seconds after each failed try], max_age_seconds?}; none: the"
        " service's",
    )
    auth: dict[str, Any] | None = Field(
        default=None,
        description="how deliveries prove themselves to a gateway: {type: oauth2_client_credentials,"
        " token_url, client_id, client_secret, scope?} or {type: mtls, certificate, private_key,"
        " ca_certificate?}; the secret is sealed and never shown again",
    )


class SubscriptionPage(_Strict):
    cursor: str | None = Field(default=None, max_length=64, description="next_cursor of the previous page")
    limit: int = Field(default=50, ge=1, le=feed.MAX_PAGE)


class SubscriptionRef(_Strict):
    subscription_id: str = _ID


# ------------------------------------------------------------------------------------ operations


async def catalog_list(call: Call, _: NoArguments) -> dict[str, Any]:
    return await call.db(lambda session: structured(catalog.list_catalog(session)))


async def availability_query(call: Call, args: AvailabilityArguments) -> dict[str, Any]:
    return await call.db(
        lambda session: _checked(
            lambda: structured(
                catalog.query_availability(session, args.service_id, args.start_date, args.end_date)
            )
        )
    )


async def bookings_create(call: Call, args: BookingIn) -> dict[str, Any]:
    jkt = call.caller.key_thumbprint or _platform_key_thumbprint(call.meta)

    def work(session: Session) -> dict[str, Any]:
        body = _change(
            session,
            call,
            lambda: bookings.create_booking(
                session,
                args.service_id,
                args.slot_id,
                args.buyer,
                correlation_id=call.correlation_id,
                order_id=args.order_id,
                platform_profile=call.caller.profile,
            ),
            operation="bookings.create",
            arguments=args.model_dump(mode="json"),
        )
        if "booking" in body:  # a replayed creation gets a credential too: the first may be lost
            body["booking_scoped_credential"] = access.issue_booking_credential(
                session, call.settings, booking_id=body["booking"]["id"], profile=call.caller.profile, jkt=jkt
            )
            session.commit()
        return body

    return await call.db(work)


async def bookings_get(call: Call, args: BookingRef) -> dict[str, Any]:
    def work(session: Session) -> dict[str, Any]:
        if not may_touch_booking(session, call.caller, args.booking_id):
            return structured(booking_not_found(args.booking_id))
        return structured(bookings.get_booking(session, args.booking_id))

    return await call.db(work)


async def bookings_confirm(call: Call, args: BookingRef) -> dict[str, Any]:
    return await _on_booking(
        call,
        args.booking_id,
        lambda session: bookings.confirm_booking(
            session, args.booking_id, correlation_id=call.correlation_id
        ),
        operation="bookings.confirm",
        arguments={"booking_id": args.booking_id},
    )


async def bookings_cancel(call: Call, args: CancelArguments) -> dict[str, Any]:
    return await _on_booking(
        call,
        args.booking_id,
        lambda session: bookings.cancel_booking(
            session, args.booking_id, args.reason, correlation_id=call.correlation_id
        ),
        operation="bookings.cancel",
        arguments={"booking_id": args.booking_id, "reason": args.reason},
    )


async def bookings_reschedule(call: Call, args: RescheduleArguments) -> dict[str, Any]:
    return await _on_booking(
        call,
        args.booking_id,
        lambda session: bookings.reschedule_booking(
            session, args.booking_id, args.slot_id, correlation_id=call.correlation_id
        ),
        operation="bookings.reschedule",
        arguments={"booking_id": args.booking_id, "slot_id": args.slot_id},
    )


async def bookings_complete(call: Call, args: BookingRef) -> dict[str, Any]:
    return await _on_booking(
        call,
        args.booking_id,
        lambda session: bookings.complete_booking(
            session, args.booking_id, correlation_id=call.correlation_id
        ),
        operation="bookings.complete",
        arguments={"booking_id": args.booking_id},
    )


async def bookings_no_show(call: Call, args: BookingRef) -> dict[str, Any]:
    return await _on_booking(
        call,
        args.booking_id,
        lambda session: bookings.mark_no_show(session, args.booking_id, correlation_id=call.correlation_id),
        operation="bookings.no_show",
        arguments={"booking_id": args.booking_id},
    )


async def waitlist_get(call: Call, args: WaitlistRef) -> dict[str, Any]:
    def work(session: Session) -> dict[str, Any]:
        if not may_touch_waitlist_entry(session, call.caller, args.waitlist_entry_id):
            return structured(waitlist_entry_not_found(args.waitlist_entry_id))
        return structured(waitlist.get_waitlist_entry(session, args.waitlist_entry_id))

    return await call.db(work)


async def waitlist_join(call: Call, args: WaitlistIn) -> dict[str, Any]:
    return await call.db(
        lambda session: _change(
            session,
            call,
            lambda: waitlist.join_waitlist(
                session,
                args.service_id,
                args.desired_window,
                args.buyer,
                correlation_id=call.correlation_id,
                platform_profile=call.caller.profile,
            ),
            operation="waitlist.join",
            arguments=args.model_dump(mode="json"),
        )
    )


async def waitlist_leave(call: Call, args: WaitlistRef) -> dict[str, Any]:
    entry_id = args.waitlist_entry_id

    def work(session: Session) -> dict[str, Any]:
        if not may_touch_waitlist_entry(session, call.caller, entry_id):
            return structured(waitlist_entry_not_found(entry_id))
        return _change(
            session,
            call,
            lambda: waitlist.leave_waitlist(session, entry_id, correlation_id=call.correlation_id),
            operation="waitlist.leave",
            arguments={"waitlist_entry_id": entry_id},
        )

    return await call.db(work)


async def feed_subscriptions_create(call: Call, args: SubscriptionArguments) -> dict[str, Any]:
    """The checks (the SSRF one resolves the host, so it is async) come first, as argument
    validation does for every operation: a replay re-checks the URL before it is answered, and a
    different request with a refused URL is refused (:class:`Refused`) rather than a conflict."""
    _require_authenticated(call.caller)
    spec = feed.SubscriptionSpec(
        args.url,
        args.transport,
        args.event_types,
        call.caller.profile,
        args.ordering,
        args.on_dead,
        signatures=tuple(args.signatures),
        payload_filter=args.filter,
        headers=args.headers,
        sign_headers=args.sign_headers,
        retry_schedule=args.retry_schedule,
        auth=args.auth,
    )
    checked = await feed.check_subscription(spec, call.settings, resolver=call.resolver)
    return await call.db(
        lambda session: _change(
            session,
            call,
            lambda: _new_subscription(session, call.caller, checked),
            operation="feed.subscriptions.create",
            arguments=args.model_dump(mode="json"),
            kept=_without_secret,
        )
    )


async def feed_subscriptions_list(call: Call, args: SubscriptionPage) -> dict[str, Any]:
    _require_authenticated(call.caller)

    def work(session: Session) -> dict[str, Any]:
        page = feed.list_subscriptions(
            session,
            cursor=args.cursor,
            limit=args.limit,
            platform_profile=_visible_subscriptions(call.caller),
        )
        return {
            "usp": {},
            "subscriptions": [feed.subscription_view(s) for s in page.items],
            "next_cursor": page.next_cursor,
            "messages": [],
        }

    return await call.db(work)


async def feed_subscriptions_delete(call: Call, args: SubscriptionRef) -> dict[str, Any]:
    _require_authenticated(call.caller)

    def work(session: Session) -> dict[str, Any]:
        try:
            subscription = feed.get_subscription(session, args.subscription_id)
        except NotFound:
            subscription = None
        if subscription is None or not _owns(call.caller, subscription):  # another's: not there
            return structured(subscription_not_found(args.subscription_id))
        feed.delete_subscription(session, args.subscription_id)
        session.refresh(subscription)
        return _subscription_body(subscription)

    return await call.db(work)


# ------------------------------------------------------------------------------------ helpers


def _checked(run: Callable[[], _T]) -> _T:
    try:
        return run()
    except InvalidRequest as exc:
        raise Refused(INVALID_ARGUMENTS, str(exc)) from None


def _change(
    session: Session,
    call: Call,
    run: Callable[[], Result | dict[str, Any]],
    *,
    operation: str,
    arguments: Mapping[str, Any],
    kept: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run a state change through ``perform`` (``_meta.usp.idempotency_key`` is the REST
    ``Idempotency-Key``; the operation names are the REST routes', so the stored request hashes
    mean the same in both bindings). The business acts for whichever profile it names under one
    principal, so for it the profile is part of the request: a key reused for another profile is
    a conflict, not another platform's answer replayed."""
    if call.caller.is_business:
        arguments = {**arguments, "_profile": call.caller.profile}
    answer = _checked(
        lambda: idempotency.perform(
            session,
            run,
            operation=operation,
            arguments=arguments,
            idempotency_key=call.meta.idempotency_key,
            principal=call.principal,
            kept=kept,
        )
    )
    call.replayed.append(answer.replayed)
    return dict(answer.body)


async def _on_booking(
    call: Call,
    booking_id: str,
    run: Callable[[Session], Result],
    *,
    operation: str,
    arguments: Mapping[str, Any],
) -> dict[str, Any]:
    def work(session: Session) -> dict[str, Any]:
        if not may_touch_booking(session, call.caller, booking_id):
            return structured(booking_not_found(booking_id))
        return _change(session, call, lambda: run(session), operation=operation, arguments=arguments)

    return await call.db(work)


def _platform_key_thumbprint(meta: UspMeta) -> str | None:
    """RFC 7638 thumbprint of ``_meta.usp.platform_key``; ``invalid_params`` when it is not a
    public JWK (a private one is refused rather than used: it should never have been sent)."""
    if meta.platform_key is None:
        return None
    jwk = meta.platform_key
    if "d" in jwk or jwk.get("kty") == "oct":
        raise Refused(INVALID_ARGUMENTS, "_meta.usp.platform_key must be a public JWK (no private members)")
    try:
        return jwk_thumbprint(jwk)
    except (KeyError, TypeError, ValueError):
        raise Refused(INVALID_ARGUMENTS, "_meta.usp.platform_key is not a valid public JWK") from None


def _require_authenticated(caller: Caller) -> None:
    """Feed subscriptions are a profile's event stream (buyer details included): an anonymous
    caller, let in by the policy for bookings, proves no profile and may not touch them."""
    if caller.principal is None and not caller.is_business:
        raise Unauthenticated(
            "unauthenticated", "feed subscriptions carry your profile's events: authenticate to manage them"
        )


def _owns(caller: Caller, subscription: Subscription) -> bool:
    return caller.is_business or (
        caller.profile is not None and subscription.platform_profile == caller.profile
    )


def _visible_subscriptions(caller: Caller) -> str | feed.AnyProfile:
    """Whose subscriptions the caller may list: the business everyone's, a platform its profile's."""
    if caller.is_business:
        return feed.ANY_PROFILE
    if caller.profile is None:  # authorize() requires one on these operations; never "the business's"
        raise Refused(INVALID_ARGUMENTS, "_meta.usp.profile is required")
    return caller.profile


def _new_subscription(session: Session, caller: Caller, checked: feed.CheckedSubscription) -> dict[str, Any]:
    """Store the subscription, unless the platform's profile holds as many as it may already
    (inside ``perform``, so a replay answers what the first call got)."""
    profile = checked.platform_profile
    if (
        not caller.is_business
        and profile is not None
        and feed.count_active_subscriptions(session, profile) >= feed.MAX_PROFILE_SUBSCRIPTIONS
    ):
        return structured(subscription_limit_reached(feed.MAX_PROFILE_SUBSCRIPTIONS))
    return _subscription_body(feed.add_subscription(session, checked), checked.secrets)


def _without_secret(body: dict[str, Any]) -> dict[str, Any]:
    """What an idempotent replay of a creation answers: the secret was shown once, and is not
    stored in the clear to be shown again (rotate it to get a new one)."""
    subscription = body.get("subscription")
    if isinstance(subscription, dict) and subscription.get("webhook_secret"):
        return body | {"subscription": subscription | {"webhook_secret": None}}
    return body


def _subscription_body(subscription: Subscription, secrets: WebhookSecrets | None = None) -> dict[str, Any]:
    return {"usp": {}, "subscription": feed.subscription_view(subscription, secrets), "messages": []}


# ------------------------------------------------------------------------------------ the table


OPERATIONS: Final[dict[str, Operation]] = {
    operation.name: operation
    for operation in (
        Operation("usp_catalog_list", Access.PUBLIC, NoArguments, catalog_list, "catalog"),
        Operation(
            "usp_availability_query", Access.PUBLIC, AvailabilityArguments, availability_query, "availability"
        ),
        Operation("usp_bookings_create", Access.PRIVILEGED_PLATFORM, BookingIn, bookings_create, "bookings"),
        Operation("usp_bookings_get", Access.PRIVILEGED_SCOPED, BookingRef, bookings_get, "bookings"),
        Operation("usp_bookings_confirm", Access.BUSINESS_ONLY, BookingRef, bookings_confirm, "bookings"),
        Operation(
            "usp_bookings_cancel", Access.PRIVILEGED_SCOPED, CancelArguments, bookings_cancel, "bookings"
        ),
        Operation(
            "usp_bookings_reschedule",
            Access.PRIVILEGED_SCOPED,
            RescheduleArguments,
            bookings_reschedule,
            "bookings",
        ),
        Operation("usp_bookings_complete", Access.BUSINESS_ONLY, BookingRef, bookings_complete, "bookings"),
        Operation("usp_bookings_no_show", Access.BUSINESS_ONLY, BookingRef, bookings_no_show, "bookings"),
        Operation("usp_waitlist_get", Access.PRIVILEGED_PLATFORM, WaitlistRef, waitlist_get, "waitlist"),
        Operation("usp_waitlist_join", Access.PRIVILEGED_PLATFORM, WaitlistIn, waitlist_join, "waitlist"),
        Operation("usp_waitlist_leave", Access.PRIVILEGED_PLATFORM, WaitlistRef, waitlist_leave, "waitlist"),
        Operation(
            "usp_feed_subscriptions_create",
            Access.PRIVILEGED_PLATFORM,
            SubscriptionArguments,
            feed_subscriptions_create,
            "feed",
        ),
        Operation(
            "usp_feed_subscriptions_list",
            Access.PRIVILEGED_PLATFORM,
            SubscriptionPage,
            feed_subscriptions_list,
            "feed",
        ),
        Operation(
            "usp_feed_subscriptions_delete",
            Access.PRIVILEGED_PLATFORM,
            SubscriptionRef,
            feed_subscriptions_delete,
            "feed",
        ),
    )
}
