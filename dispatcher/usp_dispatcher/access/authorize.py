"""Authentication and authorization of one USP MCP tool call.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.access.authorize``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import anyio.to_thread
from sqlalchemy.engine import Engine
from sqlmodel import Session

from usp_core import db
from usp_core.ssrf import Resolver
from usp_dispatcher.access.apikeys import authenticate_bearer
from usp_dispatcher.access.bindings import MAX_PROFILE_LENGTH, bind_profile
from usp_dispatcher.access.credentials import (
    MECHANISM,
    BookingCredential,
    looks_like_booking_credential,
    proof_holds,
    verify_booking_credential,
)
from usp_dispatcher.access.errors import Access, forbidden, invalid_params, unauthenticated
from usp_dispatcher.access.identity import Caller, Identity
from usp_dispatcher.access.policy import AuthorizationPolicy
from usp_dispatcher.access.signatures import DirectoryCache, NonceCheck, verify_agent_signature
from usp_dispatcher.settings import ApiSettings

__all__ = ["authenticate_http", "authorize"]

_IN_BAND_MECHANISMS: Final = ("bearer", MECHANISM)
_PROFILE: Final = re.compile(r"[\x21-\x7e]+")


async def authenticate_http(
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    engine: Engine,
    settings: ApiSettings,
    resolver: Resolver | None = None,
    directories: DirectoryCache | None = None,
    nonces: NonceCheck | None = None,
    session: Session | None = None,
) -> Identity | None:
    """The identity an HTTP request's credential proves; ``None`` when it presents none.

    ``Authorization: Bearer <API key | admin token>`` or an RFC 9421 signature with
    ``Signature-Agent`` (see :mod:`.signatures`; ``url`` is the URL the client used). Every
    credential presented must hold (``AccessError`` -32001 otherwise); with both, the bearer one
    is the identity. A booking-scoped credential sent as a bearer token is ignored here: it
    travels in ``_meta.usp.authorization`` and :func:`authorize` judges it. Mechanisms the policy
    does not offer are ignored too (the admin token always counts).

    An API key is looked up on ``session`` when one is given, and the session is left open: the
    call's authorization and its work then go on in that transaction (one per call, and a key
    revoked meanwhile is refused by the lookup of the next call); otherwise on a session of its own.
    """
    policy = AuthorizationPolicy.from_settings(settings)
    lowered = {name.lower(): value for name, value in headers.items()}
    identity: Identity | None = None
    authorization = lowered.get("authorization")
    if authorization is not None:
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise unauthenticated("Authorization must be 'Bearer <token>'")
        if not looks_like_booking_credential(token):
            identity = await anyio.to_thread.run_sync(
                _bearer, engine, settings, token, policy.offers("bearer"), session
            )
    signed = "signature" in lowered or "signature-input" in lowered
    if signed and policy.offers("http_message_signatures"):
        agent = await verify_agent_signature(
            method,
            url,
            headers,
            body,
            settings=settings,
            resolver=resolver,
            directories=directories,
            nonces=nonces,
        )
        identity = identity or agent
    return identity


def authorize(
    session: Session,
    settings: ApiSettings,
    *,
    tool: str,
    access: Access,
    arguments: Mapping[str, Any],
    params: Mapping[str, Any],
    identity: Identity | None,
    now: datetime | None = None,
) -> Caller:
    """Decide whether this call may run, and as whom (see the module's table).

    ``arguments`` are the ``tools/call`` arguments including ``_meta``; ``params`` the whole
    JSON-RPC ``params`` exactly as received (a ``platform_key_pop`` proof signs their JCS form).
    Records a principal's first profile (and commits it).
    """
    policy = AuthorizationPolicy.from_settings(settings)
    usp = _usp_meta(arguments)
    profile = _profile(usp)
    presented = _presented(usp)

    scoped: _Scoped | None = None
    if presented is not None:
        if presented.mechanism == MECHANISM or looks_like_booking_credential(presented.credential):
            scoped = _scoped_credential(session, settings, policy, presented, params, now)
        elif identity is None:
            identity = authenticate_bearer(
                session, settings, presented.credential, keys_offered=policy.offers("bearer")
            )

    if identity is not None and identity.is_business:
        return Caller(identity.principal, profile, identity.mechanism, True, None, identity.key_thumbprint)
    credential = scoped.credential if scoped is not None else None

    if access is Access.BUSINESS_ONLY:
        if credential is not None:
            raise forbidden(f"{tool} is business_only: a booking_scoped_credential never authorizes it")
        if identity is None:
            raise unauthenticated(f"{tool} is business_only: authenticate as the business")
        raise forbidden(f"{tool} is business_only: platforms may not call it")

    if access is Access.PUBLIC:
        if identity is None:
            return Caller(None, profile, None, False, None, None)
        return Caller(identity.principal, profile, identity.mechanism, False, None, identity.key_thumbprint)

    if identity is None and credential is None and policy.require_authentication:
        hint = f" ({scoped.ignored})" if scoped is not None and scoped.ignored else ""
        offered = ", ".join(policy.mechanisms) or "none"
        raise unauthenticated(f"{tool} requires authentication (offered: {offered}){hint}")
    if profile is None:
        raise invalid_params(f"{tool} is a privileged method: _meta.usp.profile is required")
    if identity is not None:
        bind_profile(session, identity.principal, profile)
    if credential is not None:
        if access is Access.PRIVILEGED_SCOPED:
            _check_scope(credential, tool, arguments, profile)
            thumbprint = credential.jkt or (identity.key_thumbprint if identity else None)
            principal = identity.principal if identity is not None else None
            return Caller(principal, profile, MECHANISM, False, credential.booking_id, thumbprint)
        if identity is None:
            raise forbidden(f"a booking_scoped_credential does not authorize {tool}")
    if identity is not None:
        return Caller(identity.principal, profile, identity.mechanism, False, None, identity.key_thumbprint)
    return Caller(None, profile, None, False, None, None)  # the policy lets anonymous platforms in


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Presented:
    """``_meta.usp.authorization`` as presented."""

    mechanism: str
    credential: str
    proof: object


@dataclass(frozen=True)
class _Scoped:
    """A booking credential that holds (``credential``), or why it counts as absent."""

    credential: BookingCredential | None
    ignored: str | None = None


def _bearer(
    engine: Engine, settings: ApiSettings, token: str, keys_offered: bool, held: Session | None
) -> Identity:
    with db.session_or_held(engine, held) as session:
        return authenticate_bearer(session, settings, token, keys_offered=keys_offered)


def _scoped_credential(
    session: Session,
    settings: ApiSettings,
    policy: AuthorizationPolicy,
    presented: _Presented,
    params: Mapping[str, Any],
    now: datetime | None,
) -> _Scoped:
    if not policy.offers(MECHANISM):
        return _Scoped(None, "booking_scoped_credential is not offered")
    credential = verify_booking_credential(session, settings, presented.credential, now=now)
    if credential.jkt is not None and not proof_holds(presented.proof, params, jkt=credential.jkt, now=now):
        # MUST 8: a bound credential without a valid proof is absent, not a bearer token.
        return _Scoped(None, "the booking credential is key-bound and needs a valid platform_key_pop proof")
    return _Scoped(credential)


def _check_scope(
    credential: BookingCredential, tool: str, arguments: Mapping[str, Any], profile: str
) -> None:
    if tool not in credential.scope:
        raise forbidden(f"the booking credential does not authorize {tool}")
    if arguments.get("booking_id") != credential.booking_id:
        raise forbidden("the booking credential is for another booking")
    if credential.profile is not None and credential.profile != profile:
        raise forbidden("the booking credential was issued to another platform profile")


def _usp_meta(arguments: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = arguments.get("_meta")
    if meta is None:
        return {}
    if not isinstance(meta, Mapping):
        raise invalid_params("_meta must be an object")
    usp = meta.get("usp")
    if usp is None:
        return {}
    if not isinstance(usp, Mapping):
        raise invalid_params("_meta.usp must be an object")
    return usp


def _profile(usp: Mapping[str, Any]) -> str | None:
    profile = usp.get("profile")
    if profile is None:
        return None
    if not isinstance(profile, str) or len(profile) > MAX_PROFILE_LENGTH or not _PROFILE.fullmatch(profile):
        raise invalid_params(f"_meta.usp.profile must be a URI (at most {MAX_PROFILE_LENGTH} characters)")
    return profile


def _presented(usp: Mapping[str, Any]) -> _Presented | None:
    authorization = usp.get("authorization")
    if authorization is None:
        return None
    if not isinstance(authorization, Mapping):
        raise invalid_params("_meta.usp.authorization must be an object")
    mechanism, credential = authorization.get("mechanism"), authorization.get("credential")
    if mechanism not in _IN_BAND_MECHANISMS:
        raise invalid_params(
            f"_meta.usp.authorization.mechanism must be one of {', '.join(_IN_BAND_MECHANISMS)}"
        )
    if not isinstance(credential, str) or not credential:
        raise invalid_params("_meta.usp.authorization.credential must be a non-empty string")
    return _Presented(str(mechanism), credential, authorization.get("proof"))
