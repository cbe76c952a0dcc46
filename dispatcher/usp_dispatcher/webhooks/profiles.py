"""Platform profile registration: read a platform's profile document and subscribe its webhook URL.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.webhooks.profiles``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from sqlmodel import Session

from usp_core.ssrf import ResolvedTarget, Resolver
from usp_dispatcher.documents import fetch_document
from usp_dispatcher.errors import DocumentUnavailable, Refused
from usp_dispatcher.settings import ApiSettings
from usp_dispatcher.webhooks.feed import SubscriptionSpec, check_url, upsert_profile_subscription
from usp_workers import Subscription, Transport

__all__ = [
    "FETCH_TIMEOUT_SECONDS",
    "MAX_PROFILE_BYTES",
    "PlatformProfile",
    "fetch_profile",
    "register_profile",
]

FETCH_TIMEOUT_SECONDS: Final = 5.0
MAX_PROFILE_BYTES: Final = 64 * 1024
_ACCEPT: Final = "application/json, application/*+json;q=0.9"


@dataclass(frozen=True, slots=True)
class PlatformProfile:
    """What registration reads from a profile document."""

    uri: str
    webhook_url: str
    webhook_transport: Transport
    webhook_event_types: tuple[str, ...]


async def register_profile(
    session: Session, settings: ApiSettings, profile_uri: str, *, resolver: Resolver | None = None
) -> tuple[Subscription, bool]:
    """Fetch ``profile_uri`` and create (or update) its subscription. Returns it and whether it is new."""
    profile = await fetch_profile(profile_uri, settings, resolver=resolver)
    spec = SubscriptionSpec(
        url=profile.webhook_url,
        transport=profile.webhook_transport,
        event_types=profile.webhook_event_types,
        platform_profile=profile.uri,
    )
    return await upsert_profile_subscription(session, settings, spec, resolver=resolver)


async def fetch_profile(
    uri: str, settings: ApiSettings, *, resolver: Resolver | None = None
) -> PlatformProfile:
    """Fetch and read a profile document; :class:`Refused` (with a reason) for anything amiss."""
    scheme = uri.partition(":")[0].lower()
    if scheme != "https" and not (scheme == "http" and settings.allow_private_targets):
        raise Refused("profile_not_https", "a platform profile URI must be an https URL")
    target = await check_url(uri, settings, resolver=resolver, what="profile URI")
    body = await _get_pinned(target, settings)
    return _read_profile(uri, body)


async def _get_pinned(target: ResolvedTarget, settings: ApiSettings) -> bytes:
    """The profile document at ``target`` (:func:`usp_dispatcher.documents.fetch_document`: the
    checked address only, no redirects, :data:`FETCH_TIMEOUT_SECONDS` in all, at most
    :data:`MAX_PROFILE_BYTES`), or :class:`Refused` saying why not."""
    try:
        document = await fetch_document(
            target, settings, accept=_ACCEPT, max_bytes=MAX_PROFILE_BYTES, seconds=FETCH_TIMEOUT_SECONDS
        )
    except DocumentUnavailable as exc:
        raise _refusal(exc) from None
    return document.body


def _refusal(exc: DocumentUnavailable) -> Refused:
    match exc.failure:
        case "timeout":
            return Refused(
                "profile_unreachable", f"the profile did not answer within {FETCH_TIMEOUT_SECONDS:g} s"
            )
        case "unreachable":
            return Refused("profile_unreachable", f"the profile could not be fetched ({exc.cause})")
        case "redirect":
            return Refused("profile_redirect", "the profile URI answered with a redirect (not followed)")
        case "status":
            return Refused("profile_unavailable", f"the profile URI answered {exc.status_code}")
        case "compressed":
            return Refused(
                "profile_unreadable", "the profile was sent compressed although identity was asked"
            )
        case "too_large":
            return Refused("profile_too_large", f"the profile is larger than {MAX_PROFILE_BYTES} bytes")


def _read_profile(uri: str, body: bytes) -> PlatformProfile:
    try:
        document: Any = json.loads(body)
    except ValueError:
        raise Refused("profile_not_json", "the profile is not a JSON document") from None
    if not isinstance(document, dict):
        raise Refused("profile_not_json", "the profile is not a JSON object")
    webhook_url = document.get("webhook_url")
    if not isinstance(webhook_url, str) or not webhook_url:
        raise Refused("profile_without_webhook_url", "the profile has no webhook_url string")
    transport = document.get("webhook_transport", Transport.REST.value)
    if transport not in {t.value for t in Transport}:
        raise Refused(
            "profile_bad_transport", f"webhook_transport must be one of {sorted(t.value for t in Transport)}"
        )
    patterns = document.get("webhook_event_types", ["*"])
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise Refused("profile_bad_event_types", "webhook_event_types must be a list of strings")
    return PlatformProfile(
        uri=uri,
        webhook_url=webhook_url,
        webhook_transport=Transport(transport),
        webhook_event_types=tuple(patterns),
    )
