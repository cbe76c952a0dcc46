"""Who is calling: the transport-level :class:`Identity` and the authorized :class:`Caller`.

They are two things on purpose. An identity is only what a credential proved (an API key, the
admin token, an agent's HTTP message signature); a caller is what :func:`~.authorize.authorize`
concluded for one tool call from that identity, the call's ``_meta.usp`` and the policy. Tool
handlers rely on the caller and never look at credentials themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["BUSINESS", "Caller", "Identity", "TransportMechanism"]

#: The principal of the business itself (the admin token).
BUSINESS: Final = "business"

TransportMechanism = Literal["bearer", "http_message_signatures"]


@dataclass(frozen=True)
class Identity:
    """What a credential proved at the transport layer (HTTP headers, or stdio ``_meta``).

    ``principal`` is ``"key:<name>"`` (API key), ``"agent:<key directory>"`` (RFC 9421: the
    Signature-Agent origin, or its JWKS URL) or ``"business"`` (admin token). ``key_thumbprint`` is
    the RFC 7638 thumbprint of the agent key that signed, the ``cnf.jkt`` a booking credential
    issued to this caller is bound to; ``key_directory`` the URL its key was found at.

    >>> Identity("key:acme", "bearer").is_business
    False
    """

    principal: str
    mechanism: str
    key_thumbprint: str | None = None
    key_directory: str | None = None

    @property
    def is_business(self) -> bool:
        return self.principal == BUSINESS


@dataclass(frozen=True)
class Caller:
    """What a tool handler may rely on after :func:`~.authorize.authorize`.

    ``profile`` is the platform the call acts for (``_meta.usp.profile``, bound to the principal);
    ``scoped_booking_id`` is set when a booking-scoped credential authorized the call, and then
    only that booking may be touched; ``key_thumbprint`` is what ``cnf.jkt`` of a credential
    issued to this caller should be.
    """

    principal: str | None
    profile: str | None
    mechanism: str | None
    is_business: bool
    scoped_booking_id: str | None
    key_thumbprint: str | None
