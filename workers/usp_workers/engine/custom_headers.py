"""A subscription's own headers on every delivery (a tenant id, a routing header, a gateway's
key): checked when saved, secret values sealed at rest and masked in every view, and covered by
the signature only when the subscription says so.

The protocol's headers are not theirs to set: the signature, digest, content type and length,
host, the Standard Webhooks and USP headers, tracing and hop-by-hop fields are refused by name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pydantic import SecretStr

from usp_workers.engine.webhook_secrets import seal_bytes, unseal_bytes

__all__ = [
    "MASK",
    "MAX_HEADERS",
    "CustomHeader",
    "CustomHeaders",
    "HeaderError",
    "check_headers",
    "load",
    "masked",
    "store",
]

MAX_HEADERS: Final = 16
MAX_VALUE: Final = 2048
#: What a secret value shows as, everywhere but on the wire.
MASK: Final = "********"
_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,64}")  #: an RFC 9110 token
_VALUE = re.compile(r"[\x20-\x7e\t]*")  #: visible ASCII, spaces and tabs: no CR, LF or NUL
_OWNED: Final = frozenset(
    {
        "signature",
        "signature-input",
        "content-digest",
        "content-type",
        "content-length",
        "content-encoding",
        "host",
        "user-agent",
        "usp-event-id",
        "usp-delivery-id",
        "usp-probe",
        "traceparent",
        "tracestate",
        "connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
    }
)


class HeaderError(ValueError):
    """A header that cannot be saved; ``where`` is its place in the list (``headers[2].name``)."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


@dataclass(frozen=True, slots=True)
class CustomHeader:
    name: str
    value: str
    secret: bool = False


@dataclass(frozen=True, slots=True)
class CustomHeaders:
    """The headers, and whether the RFC 9421 signature covers them (``signed``)."""

    headers: tuple[CustomHeader, ...]
    signed: bool = False

    @property
    def components(self) -> tuple[str, ...]:
        """The component ids the signature adds for them (lower-case names), when ``signed``."""
        return tuple(h.name.lower() for h in self.headers) if self.signed else ()

    def as_dict(self) -> dict[str, str]:
        return {h.name: h.value for h in self.headers}


def check_headers(items: Sequence[Mapping[str, Any]]) -> tuple[CustomHeader, ...]:
    """``[{"name", "value", "secret"?}]`` checked; :class:`HeaderError` names the first at fault."""
    if len(items) > MAX_HEADERS:
        raise HeaderError("headers", f"at most {MAX_HEADERS} headers")
    checked: list[CustomHeader] = []
    seen: set[str] = set()
    for index, item in enumerate(items):
        where = f"headers[{index}]"
        name, value, secret = item.get("name"), item.get("value"), item.get("secret", False)
        if not isinstance(name, str) or _NAME.fullmatch(name) is None:
            raise HeaderError(f"{where}.name", f"{str(name)[:80]!r} is not a header name (an RFC 9110 token)")
        lowered = name.lower()
        if lowered in _OWNED or lowered.startswith("webhook-"):
            raise HeaderError(f"{where}.name", f"{name} belongs to the protocol and cannot be set")
        if lowered in seen:
            raise HeaderError(f"{where}.name", f"{name} is named twice")
        if not isinstance(value, str) or len(value) > MAX_VALUE or _VALUE.fullmatch(value) is None:
            raise HeaderError(
                f"{where}.value",
                f"must be visible ASCII text of at most {MAX_VALUE} characters (no line breaks)",
            )
        if not isinstance(secret, bool):
            raise HeaderError(f"{where}.secret", "must be true or false")
        seen.add(lowered)
        checked.append(CustomHeader(name, value.strip(" \t"), secret))
    return tuple(checked)


def store(headers: CustomHeaders, key: SecretStr | None, subscription_id: str) -> str:
    """The stored form: JSON, each secret value sealed for the subscription's row (so a secret
    header needs ``USP_SECRETS_KEY``: :class:`~usp_workers.engine.webhook_secrets.SecretsUnavailable`)."""
    items = [
        {"name": h.name, "sealed": seal_bytes(h.value.encode(), key, subscription_id)}
        if h.secret
        else {"name": h.name, "value": h.value}
        for h in headers.headers
    ]
    return json.dumps({"headers": items, "signed": headers.signed}, separators=(",", ":"))


def load(stored: str, key: SecretStr | None, subscription_id: str) -> CustomHeaders:
    """The headers to send, secret values unsealed."""
    document = json.loads(stored)
    headers = tuple(
        CustomHeader(item["name"], unseal_bytes(item["sealed"], key, subscription_id).decode(), True)
        if "sealed" in item
        else CustomHeader(item["name"], item["value"])
        for item in document["headers"]
    )
    return CustomHeaders(headers, bool(document.get("signed")))


def masked(stored: str | None) -> dict[str, Any]:
    """What every view shows: names and plain values, :data:`MASK` for a secret one."""
    if not stored:
        return {"headers": [], "signed": False}
    document = json.loads(stored)
    items = [
        {
            "name": item["name"],
            "value": MASK if "sealed" in item else item["value"],
            "secret": "sealed" in item,
        }
        for item in document["headers"]
    ]
    return {"headers": items, "signed": bool(document.get("signed"))}
