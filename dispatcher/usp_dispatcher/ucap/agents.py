"""Who is asking: every ``/v1`` request and every UCAP tool call is an :class:`Agent`, proven by
its RFC 9421 signature (:func:`usp_dispatcher.access.verify_agent_signature`, the one verifier
the USP tools use too).

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.ucap.agents``.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from usp_core.ssrf import Resolver
from usp_dispatcher.access import AccessError, Identity, verify_agent_signature
from usp_dispatcher.access.signatures import DirectoryCache, NonceCheck
from usp_dispatcher.errors import UcapError
from usp_dispatcher.settings import ApiSettings
from usp_dispatcher.ucap.answers import unauthorized
from usp_dispatcher.ucap.tables import agent_id

__all__ = ["Agent", "RateLimiter", "agent_of", "authenticate_agent"]

_WINDOW: Final = 60.0


@dataclass(frozen=True, slots=True)
class Agent:
    """A signing agent: the URL its key was found at and that key's RFC 7638 thumbprint."""

    key_directory: str
    key_thumbprint: str

    @property
    def id(self) -> str:
        return agent_id(self.key_directory, self.key_thumbprint)

    def ref(self) -> dict[str, str]:
        """The ``usp_schemas.AgentRef`` form."""
        return {"key_directory": self.key_directory, "key_thumbprint": self.key_thumbprint}


async def authenticate_agent(
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    settings: ApiSettings,
    nonces: NonceCheck,
    resolver: Resolver | None = None,
    directories: DirectoryCache | None = None,
) -> Agent:
    """The agent a request's signature proves, or a 403 ``agent_unauthorized``."""
    lowered = {name.lower() for name in headers}
    if "signature" not in lowered and "signature-input" not in lowered:
        raise unauthorized(
            "This request is not signed: sign it with HTTP Message Signatures (RFC 9421, Web Bot "
            "Auth) and name your key directory in Signature-Agent."
        )
    try:
        identity = await verify_agent_signature(
            method,
            url,
            headers,
            body,
            settings=settings,
            resolver=resolver,
            directories=directories,
            nonces=nonces,
        )
    except AccessError as exc:
        raise unauthorized(f"The request signature was refused: {exc.detail}.") from None
    agent = agent_of(identity)
    if agent is None:  # pragma: no cover - verify_agent_signature always sets both
        raise unauthorized("The request signature names no key directory.")
    return agent


def agent_of(identity: Identity | None) -> Agent | None:
    """The agent behind a transport identity (an MCP request's signature); ``None`` for anything
    else (an API key, the admin token, nothing)."""
    if identity is None or identity.key_directory is None or identity.key_thumbprint is None:
        return None
    return Agent(identity.key_directory, identity.key_thumbprint)


class RateLimiter:
    """At most ``per_minute`` requests per agent in any minute (a sliding window of the requests'
    times), per process. Bounded: the least recently seen agents are forgotten first. A check
    drops only the times that left the window (oldest first), so it costs the same at any limit:
    filtering the whole list per request was 3% of a read's CPU at a limit of thousands."""

    def __init__(self, per_minute: int, *, max_agents: int = 10_000) -> None:
        self.per_minute = per_minute
        self.max_agents = max_agents
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def check(self, agent: Agent, now: float | None = None) -> None:
        """Count one request; 429 ``rate_limited`` (with ``Retry-After``) past the limit."""
        moment = time.monotonic() if now is None else now
        stamps = self._seen.pop(agent.id, None) or deque()
        self._seen[agent.id] = stamps
        while stamps and stamps[0] <= moment - _WINDOW:
            stamps.popleft()
        if len(stamps) >= self.per_minute:
            wait = max(1, math.ceil(stamps[0] + _WINDOW - moment))
            raise UcapError(
                429,
                "rate_limited",
                f"More than {self.per_minute} requests in a minute; try again in {wait} s.",
                headers={"Retry-After": str(wait)},
            )
        stamps.append(moment)
        while len(self._seen) > self.max_agents:
            self._seen.popitem(last=False)
