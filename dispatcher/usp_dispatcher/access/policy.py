"""The business's AuthorizationPolicy: which mechanisms it offers platforms, and whether
privileged tools need authentication at all. Read from the settings; published in
``/.well-known/usp`` (:func:`policy_document`) so platforms know what to present.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from usp_dispatcher.access.credentials import CREDENTIAL_TYP, POP_TYP, PROOF_WINDOW_SECONDS, SCOPED_TOOLS
from usp_dispatcher.access.signatures import DIRECTORY_PATH, WEB_BOT_AUTH_TAG
from usp_dispatcher.settings import ApiSettings
from usp_receiver import DEFAULT_ALGORITHMS

__all__ = ["MECHANISMS", "AuthorizationPolicy", "Mechanism", "policy_document"]

Mechanism = Literal["bearer", "http_message_signatures", "booking_scoped_credential"]
#: Every mechanism this service implements, in the order it prefers them.
MECHANISMS: Final[tuple[Mechanism, ...]] = ("bearer", "http_message_signatures", "booking_scoped_credential")
_JWKS_PATH: Final = "/.well-known/usp/jwks.json"


@dataclass(frozen=True)
class AuthorizationPolicy:
    """What :func:`~.authorize.authorize` enforces.

    >>> policy = AuthorizationPolicy(mechanisms=("bearer",), require_authentication=True)
    >>> policy.offers("bearer"), policy.offers("booking_scoped_credential")
    (True, False)
    """

    mechanisms: tuple[str, ...]
    require_authentication: bool = True

    @classmethod
    def from_settings(cls, settings: ApiSettings) -> AuthorizationPolicy:
        offered = tuple(m for m in MECHANISMS if m in settings.auth_mechanisms)
        return cls(mechanisms=offered, require_authentication=settings.require_authentication)

    def offers(self, mechanism: str) -> bool:
        return mechanism in self.mechanisms


def policy_document(settings: ApiSettings) -> dict[str, Any]:
    """The ``authorization`` object of ``/.well-known/usp``: offered mechanisms and, for each,
    what a platform needs to use it."""
    policy = AuthorizationPolicy.from_settings(settings)
    base = settings.public_base_url.rstrip("/")
    document: dict[str, Any] = {
        "mechanisms": list(policy.mechanisms),
        "require_authentication": policy.require_authentication,
        "identity_binding": "first_contact",  # §10.1.6: the first _meta.usp.profile a principal presents
        # One policy for both bindings: REST carries in headers what MCP carries in _meta.usp.
        "bindings": ["mcp", "rest"],
        "profile": {"mcp": "_meta.usp.profile", "rest": "USP-Agent: <profile URI>"},
    }
    if policy.offers("bearer"):
        document["bearer"] = {
            "http": "Authorization: Bearer <API key>",
            "rest": "Authorization: Bearer <API key>",
            "stdio": "_meta.usp.authorization {mechanism: bearer, credential}",
        }
    if policy.offers("http_message_signatures"):
        document["http_message_signatures"] = {
            "profile": "web-bot-auth",
            "key_directory": f"<Signature-Agent origin>{DIRECTORY_PATH}",
            "covered_components": [*settings.agent_signature_components, "signature-agent"],
            "content_digest": "covered and matching when sent",
            "tag": WEB_BOT_AUTH_TAG,
            "algorithms": sorted(DEFAULT_ALGORITHMS),
            "max_age_seconds": 300,
        }
    if policy.offers("booking_scoped_credential"):
        document["booking_scoped_credential"] = {
            "format": "jws",
            "typ": CREDENTIAL_TYP,
            "jwks_uri": base + _JWKS_PATH,
            "scope": list(SCOPED_TOOLS),
            "ttl_seconds": settings.booking_credential_ttl_seconds,
            "proof": {
                "mechanism": "platform_key_pop",
                "typ": POP_TYP,
                "iat_window_seconds": PROOF_WINDOW_SECONDS,
            },
            "mcp": "_meta.usp.authorization {mechanism: booking_scoped_credential, credential, proof}; "
            "usp_p over the tools/call params",
            "rest": "Authorization: Bearer <credential>; USP-Key-Proof: <proof>, "
            'usp_p over {"method", "target" (path and query), "body" (the JSON body or null)}',
        }
    return document
