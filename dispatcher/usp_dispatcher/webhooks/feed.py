"""Feed subscriptions: where a platform wants its events, checked before anything is stored.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.webhooks.feed``.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Final

import anyio.to_thread
import httpx
import sqlalchemy as sa
from pydantic import SecretStr
from sqlmodel import Session, col, select

from usp_core import db
from usp_core.clock import utcnow
from usp_core.ssrf import ResolvedTarget, Resolver, TargetRefused, check_target
from usp_dispatcher.errors import Conflict, NotFound, Refused
from usp_dispatcher.settings import ApiSettings
from usp_schemas import EVENT_TYPES, OPERATIONAL_EVENT_TYPES
from usp_workers import (
    RFC9421,
    SCHEMES,
    AuthError,
    CustomHeaders,
    EndpointAuth,
    FilterError,
    HeaderError,
    OAuth2ClientCredentials,
    OnDead,
    Ordering,
    ScheduleError,
    SecretsUnavailable,
    Subscription,
    SubscriptionState,
    Transport,
    WebhookSecrets,
    check_auth,
    check_broker,
    check_headers,
    check_schedule,
    compile_filter,
    is_broker_url,
    masked_auth,
    masked_headers,
    seal,
    store_auth,
    store_headers,
    unseal,
)
from usp_workers.operations import DELETED, masked_url

__all__ = [
    "ANY_PROFILE",
    "DELETED",
    "MAX_LEASE_SECONDS",
    "MAX_PAGE",
    "MAX_PROFILE_SUBSCRIPTIONS",
    "MIN_LEASE_SECONDS",
    "AnyProfile",
    "CheckedSubscription",
    "Page",
    "SubscriptionSpec",
    "add_subscription",
    "check_signatures",
    "check_subscription",
    "check_url",
    "count_active_subscriptions",
    "delete_subscription",
    "get_subscription",
    "list_subscriptions",
    "normalize_event_types",
    "renew_lease",
    "rotate_secrets",
    "subscription_view",
    "upsert_profile_subscription",
    "wire_url",
]

#: Largest page the list returns, whatever ``limit`` asks for.
MAX_PAGE = 200
#: Active subscriptions one platform profile may hold over MCP: every event fans out to each,
#: so an unbounded number would let one platform multiply deliveries to a URL of its choosing.
MAX_PROFILE_SUBSCRIPTIONS: Final = 25
#: The advisory lock key's prefix for counting a profile's subscriptions (PostgreSQL).
_LIMIT_LOCK: Final = "usp.subscription_limit:"
_MAX_PATTERNS = 64
#: The bounds of a lease: renewed more often than every 10 s is a busy loop, and a listener gone
#: for a day is gone.
MIN_LEASE_SECONDS: Final = 10
MAX_LEASE_SECONDS: Final = 86_400


class AnyProfile(Enum):
    """The type of :data:`ANY_PROFILE`: a filter value of its own, since ``None`` already means
    "the business's own subscriptions"."""

    ANY = "any"


@dataclass(frozen=True, slots=True)
class SubscriptionSpec:
    """A subscription as asked for, before it is checked."""

    url: str
    transport: Transport = Transport.REST
    event_types: Sequence[str] = ("*",)
    platform_profile: str | None = None
    ordering: Ordering = Ordering.NONE
    on_dead: OnDead = OnDead.BLOCK
    lease_seconds: int | None = None
    signatures: Sequence[str] = (RFC9421,)
    #: a filter on the event's JSON (usp_workers.engine.filters), as the caller sent it
    payload_filter: Any = None
    #: headers of its own on every delivery: ``[{"name", "value", "secret"?}]``
    headers: Sequence[Mapping[str, Any]] = ()
    #: whether the RFC 9421 signature covers those headers
    sign_headers: bool = False
    #: its own ``{"delays": [...], "max_age_seconds": N}`` (none: the service's)
    retry_schedule: Mapping[str, Any] | None = None
    #: how a delivery proves itself to a gateway: ``{"type": "oauth2_client_credentials" | "mtls", ...}``
    auth: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class CheckedSubscription:
    """A subscription that passed both checks: its URL in wire form (:func:`wire_url`), its
    patterns normalized. Only :func:`check_subscription` makes one."""

    url: str
    transport: Transport
    event_types: tuple[str, ...]
    platform_profile: str | None
    ordering: Ordering = Ordering.NONE
    on_dead: OnDead = OnDead.BLOCK
    lease_seconds: int | None = None
    signatures: tuple[str, ...] = (RFC9421,)
    #: made by the check when a Standard Webhooks scheme is asked for; sealed by add_subscription
    secrets: WebhookSecrets | None = None
    secrets_key: SecretStr | None = field(default=None, repr=False)
    payload_filter: str | None = None  #: checked, as canonical JSON
    headers: CustomHeaders | None = None  #: checked; sealed by add_subscription
    retry_schedule: str | None = None  #: checked, as stored
    auth: EndpointAuth | None = None  #: checked; sealed by add_subscription


@dataclass(frozen=True, slots=True)
class Page:
    """One page of subscriptions, oldest first; ``next_cursor`` fetches the next (``None``: done)."""

    items: list[Subscription]
    next_cursor: str | None


def normalize_event_types(patterns: Iterable[str]) -> list[str]:
    """The patterns, deduplicated in order; :class:`Refused` when one matches no known event type.

    >>> normalize_event_types(["booking.*", "waitlist.joined", "booking.*"])
    ['booking.*', 'waitlist.joined']
    """
    normalized: list[str] = []
    for pattern in patterns:
        if pattern in normalized:
            continue
        known_types = (*EVENT_TYPES, *OPERATIONAL_EVENT_TYPES)
        if pattern != "*" and not any(fnmatch.fnmatchcase(known, pattern) for known in known_types):
            raise Refused(
                "unknown_event_type",
                f"event type pattern {pattern!r} matches no USP event type "
                "(use '*', an exact type such as 'booking.confirmed', or a glob such as 'booking.*')",
            )
        normalized.append(pattern)
    if not normalized:
        raise Refused("no_event_types", "event_types must name at least one pattern ('*' for all)")
    if len(normalized) > _MAX_PATTERNS:
        raise Refused("too_many_event_types", f"at most {_MAX_PATTERNS} event type patterns")
    return normalized


async def check_url(
    url: str, settings: ApiSettings, *, resolver: Resolver | None = None, what: str = "webhook URL"
) -> ResolvedTarget:
    """The SSRF check, with its refusal turned into a :class:`Refused` that names the reason."""
    try:
        return await check_target(url, settings, resolver=resolver)
    except TargetRefused as exc:
        raise Refused(
            "target_refused", f"the {what} is refused: {exc}", extra={"target_reason": exc.reason}
        ) from None


async def check_subscription(
    spec: SubscriptionSpec, settings: ApiSettings, *, resolver: Resolver | None = None
) -> CheckedSubscription:
    """``spec`` checked (patterns, then the URL's SSRF check); :class:`Refused` names what is wrong.
    Touches no database: the write is :func:`add_subscription` (or the profile upsert)."""
    patterns = normalize_event_types(spec.event_types)
    if spec.lease_seconds is not None:
        _check_lease(spec.lease_seconds)
    schemes = check_signatures(spec.signatures, settings)
    payload_filter = check_filter(spec.payload_filter)
    headers = check_custom_headers(spec.headers, spec.sign_headers, settings)
    schedule = check_retry_schedule(spec.retry_schedule)
    auth = await check_endpoint_auth(spec.auth, settings, resolver=resolver)
    if is_broker_url(spec.url):
        url = spec.url.strip()
        await check_broker_target(url, settings, resolver=resolver)
        if Transport(spec.transport) is not Transport.REST or auth is not None:
            raise Refused(
                "broker_target",
                "a broker target takes the event JSON as its message (transport rest), signed in its"
                " headers; endpoint authentication is the broker URL's own credentials",
            )
    else:
        url = wire_url(spec.url)
        await check_url(url, settings, resolver=resolver)
    return CheckedSubscription(
        url,
        Transport(spec.transport),
        tuple(patterns),
        spec.platform_profile,
        Ordering(spec.ordering),
        OnDead(spec.on_dead),
        spec.lease_seconds,
        schemes,
        WebhookSecrets.new(schemes) if schemes != (RFC9421,) else None,
        settings.secrets_key,
        payload_filter,
        headers,
        schedule,
        auth,
    )


async def check_endpoint_auth(
    asked: Mapping[str, Any] | None, settings: ApiSettings, *, resolver: Resolver | None = None
) -> EndpointAuth | None:
    """Endpoint authentication checked (``None``: none): its members (:class:`Refused`
    ``invalid_auth`` names the one at fault), the token URL's address as a webhook URL's, and a
    sealing key for its secret (``secrets_key_unset``)."""
    if asked is None:
        return None
    try:
        auth = check_auth(asked)
    except AuthError as exc:
        raise Refused("invalid_auth", str(exc), extra={"where": exc.where}) from None
    if isinstance(auth, OAuth2ClientCredentials):
        await check_url(auth.token_url, settings, resolver=resolver, what="token URL")
    _require_secrets_key(settings, "endpoint credentials")
    return auth


def _require_secrets_key(settings: ApiSettings, what: str) -> None:
    """:class:`Refused` ``secrets_key_unset`` unless ``what`` can be sealed at rest."""
    if settings.secrets_key is None:
        raise Refused(
            "secrets_key_unset", f"{what} are sealed at rest: set USP_SECRETS_KEY (e.g. openssl rand -hex 32)"
        )


async def set_endpoint_auth(
    session: Session,
    subscription_id: str,
    asked: Mapping[str, Any] | None,
    settings: ApiSettings,
    *,
    resolver: Resolver | None = None,
) -> Subscription:
    """Replace (``None``: remove) how the subscription's deliveries prove themselves to a gateway,
    committed; the next try uses it."""
    auth = await check_endpoint_auth(asked, settings, resolver=resolver)

    def sealed(subscription: Subscription) -> str | None:
        return None if auth is None else store_auth(auth, settings.secrets_key, subscription.id)

    return await anyio.to_thread.run_sync(_replace, session, subscription_id, "endpoint_auth", sealed)


def check_retry_schedule(asked: Mapping[str, Any] | None) -> str | None:
    """A subscription's own schedule checked (``None``: the service's); :class:`Refused`
    ``invalid_retry_schedule`` names what is out of bounds."""
    if asked is None:
        return None
    try:
        return check_schedule(list(asked.get("delays") or ()), asked.get("max_age_seconds"))
    except ScheduleError as exc:
        raise Refused("invalid_retry_schedule", str(exc), extra={"where": exc.where}) from None


def set_retry_schedule(
    session: Session, subscription_id: str, asked: Mapping[str, Any] | None
) -> Subscription:
    """Replace a subscription's own retry schedule (``None``: back to the service's), committed;
    it decides every retry from its next failed try on."""
    schedule = check_retry_schedule(asked)
    return _replace(session, subscription_id, "retry_schedule", lambda _: schedule)


def check_custom_headers(
    items: Sequence[Mapping[str, Any]], signed: bool, settings: ApiSettings
) -> CustomHeaders | None:
    """The headers checked (``None`` when there are none); :class:`Refused` ``invalid_header``
    names the one at fault, ``secrets_key_unset`` when a secret one cannot be sealed."""
    try:
        headers = check_headers(items)
    except HeaderError as exc:
        raise Refused("invalid_header", str(exc), extra={"where": exc.where}) from None
    if not headers:
        return None
    if any(h.secret for h in headers):
        _require_secrets_key(settings, "secret header values")
    return CustomHeaders(headers, signed)


def set_headers(
    session: Session,
    subscription_id: str,
    items: Sequence[Mapping[str, Any]],
    signed: bool,
    settings: ApiSettings,
) -> Subscription:
    """Replace a subscription's own headers (none: remove them), committed; tries from then on
    carry them."""
    headers = check_custom_headers(items, signed, settings)

    def sealed(subscription: Subscription) -> str | None:
        return None if headers is None else store_headers(headers, settings.secrets_key, subscription.id)

    return _replace(session, subscription_id, "custom_headers", sealed)


def check_filter(tree: Any) -> str | None:
    """A payload filter checked and in canonical JSON (``None``: none); :class:`Refused`
    ``invalid_filter`` names the part at fault (``extra["where"]``, a JSON path into it)."""
    if tree is None:
        return None
    try:
        return compile_filter(tree).source
    except FilterError as exc:
        raise Refused("invalid_filter", str(exc), extra={"where": exc.where}) from None


def set_filter(session: Session, subscription_id: str, tree: Any) -> Subscription:
    """Replace a subscription's payload filter (``None`` removes it), committed; events emitted
    from then on are judged by it."""
    checked = check_filter(tree)
    return _replace(session, subscription_id, "payload_filter", lambda _: checked)


def _replace(
    session: Session, subscription_id: str, name: str, value: Callable[[Subscription], str | None]
) -> Subscription:
    """Set one of a subscription's stored settings (its stored form made from the row, which a
    sealed value is bound to), committed."""
    subscription = get_subscription(session, subscription_id)
    setattr(subscription, name, value(subscription))
    subscription.updated_at = utcnow()
    session.add(subscription)
    session.commit()
    return subscription


def add_subscription(session: Session, checked: CheckedSubscription) -> Subscription:
    """Store ``checked`` as a new active subscription in ``session`` (flushed, not committed)."""
    subscription = Subscription(
        url=checked.url,
        transport=checked.transport,
        event_types=json.dumps(list(checked.event_types)),
        platform_profile=checked.platform_profile,
        ordering=checked.ordering,
        on_dead=checked.on_dead,
    )
    if checked.lease_seconds is not None:
        subscription.lease_until = subscription.created_at + timedelta(seconds=checked.lease_seconds)
    subscription.signatures = json.dumps(list(checked.signatures))
    subscription.payload_filter = checked.payload_filter
    subscription.retry_schedule = checked.retry_schedule
    if checked.auth is not None:
        subscription.endpoint_auth = store_auth(checked.auth, checked.secrets_key, subscription.id)
    if checked.headers is not None:
        subscription.custom_headers = store_headers(checked.headers, checked.secrets_key, subscription.id)
    if checked.secrets is not None:
        subscription.webhook_secrets = seal(checked.secrets, checked.secrets_key, subscription.id)
    session.add(subscription)
    session.flush()
    return subscription


def store_subscription(session: Session, checked: CheckedSubscription) -> Subscription:
    """:func:`add_subscription`, committed: a new subscription from the REST API or the console."""
    subscription = add_subscription(session, checked)
    session.commit()
    return subscription


async def upsert_profile_subscription(
    session: Session, settings: ApiSettings, spec: SubscriptionSpec, *, resolver: Resolver | None = None
) -> tuple[Subscription, bool]:
    """Store the subscription a platform profile asks for: update the profile's active
    subscription to the same URL if there is one, else create it (committed). Returns it and
    whether it is new.
    """
    if spec.platform_profile is None:
        raise ValueError("a profile subscription needs spec.platform_profile")
    checked = await check_subscription(spec, settings, resolver=resolver)
    return await anyio.to_thread.run_sync(_upsert, session, checked)


async def check_broker_target(url: str, settings: ApiSettings, *, resolver: Resolver | None = None) -> None:
    """A broker target's URL and address checked as a webhook URL's are (:class:`Refused`
    ``target_refused`` names the problem; the credentials in it never)."""
    try:
        await check_broker(url, settings, resolver=resolver)
    except TargetRefused as exc:
        raise Refused(
            "target_refused", f"the broker target is refused: {exc}", extra={"target_reason": exc.reason}
        ) from None


def wire_url(url: str) -> str:
    """The URL exactly as the HTTP client will send it (dot segments resolved, spaces and non-ASCII
    percent-encoded, IDNA host). Stored and signed in this form, so the ``@authority`` and ``@path``
    the receiver sees are the ones we signed.

    >>> wire_url("https://Hooks.example/a/../b c")
    'https://hooks.example/b%20c'
    """
    try:
        return str(httpx.URL(url))
    except (httpx.InvalidURL, ValueError) as exc:
        raise Refused(
            "target_refused", f"the webhook URL is not a valid URL: {exc}", extra={"target_reason": "bad_url"}
        ) from None


def get_subscription(session: Session, subscription_id: str) -> Subscription:
    subscription = session.get(Subscription, subscription_id)
    if subscription is None:
        raise NotFound("subscription_not_found", f"no subscription {subscription_id!r}")
    return subscription


#: ``platform_profile=`` of :func:`list_subscriptions` when every profile's subscriptions are wanted.
ANY_PROFILE: Final = AnyProfile.ANY


def list_subscriptions(
    session: Session,
    *,
    cursor: str | None = None,
    limit: int = 50,
    state: SubscriptionState | None = None,
    platform_profile: str | AnyProfile | None = ANY_PROFILE,
) -> Page:
    """Subscriptions in id order (ids are time-ordered, so oldest first), after ``cursor``.

    ``platform_profile``: only that profile's subscriptions (``None``: only the business's own,
    those without a profile); by default everyone's.
    """
    limit = max(1, min(limit, MAX_PAGE))
    statement = select(Subscription).order_by(col(Subscription.id)).limit(limit + 1)
    if cursor:
        statement = statement.where(col(Subscription.id) > cursor)
    if state is not None:
        statement = statement.where(col(Subscription.state) == state)
    if platform_profile is None:
        statement = statement.where(col(Subscription.platform_profile).is_(None))
    elif not isinstance(platform_profile, AnyProfile):
        statement = statement.where(col(Subscription.platform_profile) == platform_profile)
    rows = list(session.exec(statement).all())
    more = len(rows) > limit
    items = rows[:limit]
    return Page(items, items[-1].id if more else None)


def count_active_subscriptions(session: Session, platform_profile: str) -> int:
    """How many active subscriptions ``platform_profile`` holds, counted under
    :func:`usp_core.db.lock_for_count` (until the session's transaction ends), so two creates
    at once cannot both take the last place."""
    db.lock_for_count(session, _LIMIT_LOCK + platform_profile, Subscription)
    statement = (
        select(sa.func.count())
        .select_from(Subscription)
        .where(col(Subscription.platform_profile) == platform_profile)
        .where(col(Subscription.state) == SubscriptionState.ACTIVE)
    )
    return int(session.exec(statement).one())


def delete_subscription(session: Session, subscription_id: str) -> None:
    """Disable the subscription for good (``disabled_reason = "deleted"``), keeping the row."""
    subscription = get_subscription(session, subscription_id)
    if subscription.state == SubscriptionState.DISABLED and subscription.disabled_reason == DELETED:
        return
    subscription.state = SubscriptionState.DISABLED
    subscription.disabled_reason = DELETED
    subscription.updated_at = utcnow()
    session.add(subscription)
    session.commit()


def check_signatures(schemes: Sequence[str], settings: ApiSettings) -> tuple[str, ...]:
    """The signature schemes asked for, in :data:`SCHEMES` order; RFC 9421 is always one of them
    (the seed requires it), and Standard Webhooks needs ``USP_SECRETS_KEY`` to seal its secrets."""
    asked = set(schemes)
    unknown = sorted(asked.difference(SCHEMES))
    if unknown:
        raise Refused(
            "unknown_signature_scheme",
            f"no signature scheme {unknown[0][:64]!r}: choose from {', '.join(SCHEMES)}",
        )
    if RFC9421 not in asked:
        raise Refused(
            "rfc9421_required",
            "every delivery is signed with RFC 9421 (the USP profile); Standard Webhooks comes beside it",
        )
    if asked != {RFC9421}:
        _require_secrets_key(settings, "Standard Webhooks secrets")
    return tuple(scheme for scheme in SCHEMES if scheme in asked)


def rotate_secrets(
    session: Session,
    subscription_id: str,
    settings: ApiSettings,
    *,
    overlap: timedelta | None = None,
    now: datetime | None = None,
) -> WebhookSecrets:
    """A new Standard Webhooks secret (and key) for the subscription, committed; the old ones
    sign beside it for ``overlap`` (by default the signing keys', ``key_overlap_seconds``).
    Returns the new set (its secret is shown once)."""
    subscription = get_subscription(session, subscription_id)
    if subscription.webhook_secrets is None:
        raise Conflict(
            "no_webhook_secret", f"subscription {subscription_id!r} has no Standard Webhooks signatures"
        )
    moment = now or utcnow()
    try:
        current = unseal(subscription.webhook_secrets, settings.secrets_key, subscription.id)
    except SecretsUnavailable:
        raise Conflict(
            "secrets_unavailable",
            f"USP_SECRETS_KEY does not open subscription {subscription_id!r}'s sealed secrets (it is"
            " unset, or not the key that sealed them): restore that key to rotate them",
        ) from None
    if overlap is None:
        overlap = timedelta(seconds=settings.key_overlap_seconds)
    rotated = current.rotated(moment, overlap)
    subscription.webhook_secrets = seal(rotated, settings.secrets_key, subscription.id)
    subscription.updated_at = moment
    session.add(subscription)
    session.commit()
    return rotated


def renew_lease(
    session: Session, subscription_id: str, seconds: int, *, now: datetime | None = None
) -> Subscription:
    """Extend a leased subscription to ``seconds`` from now (committed). One without a lease, or
    deleted (its lease lapsed, say), is a :class:`Conflict`: the listener must subscribe again."""
    _check_lease(seconds)
    subscription = get_subscription(session, subscription_id)
    if subscription.disabled_reason == DELETED:
        raise Conflict("subscription_deleted", f"subscription {subscription_id!r} was deleted")
    if subscription.lease_until is None:
        raise Conflict("not_leased", f"subscription {subscription_id!r} has no lease to renew")
    moment = now or utcnow()
    subscription.lease_until = moment + timedelta(seconds=seconds)
    subscription.updated_at = moment
    session.add(subscription)
    session.commit()
    return subscription


def _check_lease(seconds: int) -> None:
    if not MIN_LEASE_SECONDS <= seconds <= MAX_LEASE_SECONDS:
        raise Refused(
            "bad_lease",
            f"lease_seconds must be from {MIN_LEASE_SECONDS} to {MAX_LEASE_SECONDS}, not {seconds}",
        )


def subscription_view(subscription: Subscription, secrets: WebhookSecrets | None = None) -> dict[str, Any]:
    """The JSON shape of a subscription in every answer; with the ``secrets`` just made (at
    creation, at a rotation), their ``webhook_secret`` and ``webhook_public_key``, that once."""
    own_headers = masked_headers(subscription.custom_headers)
    view: dict[str, Any] = {
        "id": subscription.id,
        "url": masked_url(subscription.url),
        "transport": Transport(subscription.transport).value,
        "event_types": json.loads(subscription.event_types),
        "platform_profile": subscription.platform_profile,
        "ordering": Ordering(subscription.ordering).value,
        "on_dead": OnDead(subscription.on_dead).value,
        "state": SubscriptionState(subscription.state).value,
        "disabled_reason": subscription.disabled_reason,
        "lease_until": subscription.lease_until.isoformat() if subscription.lease_until else None,
        "signatures": json.loads(subscription.signatures),
        "filter": json.loads(subscription.payload_filter) if subscription.payload_filter else None,
        "headers": own_headers["headers"],
        "sign_headers": own_headers["signed"],
        "retry_schedule": json.loads(subscription.retry_schedule) if subscription.retry_schedule else None,
        "auth": masked_auth(subscription.endpoint_auth),
        "created_at": subscription.created_at.isoformat(),
        "updated_at": subscription.updated_at.isoformat(),
    }
    if secrets is not None:
        view |= {"webhook_secret": secrets.secret, "webhook_public_key": secrets.public_key}
    return view


def _upsert(session: Session, checked: CheckedSubscription) -> tuple[Subscription, bool]:
    existing = session.exec(
        select(Subscription)
        .where(col(Subscription.platform_profile) == checked.platform_profile)
        .where(col(Subscription.url) == checked.url)
        .where(col(Subscription.state) == SubscriptionState.ACTIVE)
        .order_by(col(Subscription.id))
    ).first()
    # A profile has one webhook_url: when it changes, the subscription to the old URL stops.
    for stale in session.exec(
        select(Subscription)
        .where(col(Subscription.platform_profile) == checked.platform_profile)
        .where(col(Subscription.url) != checked.url)
        .where(col(Subscription.state) == SubscriptionState.ACTIVE)
    ).all():
        stale.state = SubscriptionState.DISABLED
        stale.disabled_reason = "replaced: the profile's webhook_url changed"
        stale.updated_at = utcnow()
        session.add(stale)
    if existing is None:
        created = add_subscription(session, checked)
        session.commit()
        return created, True
    existing.transport = checked.transport
    existing.event_types = json.dumps(list(checked.event_types))
    existing.updated_at = utcnow()
    session.add(existing)
    session.commit()
    return existing, False
