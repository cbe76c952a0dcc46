"""Who may call which USP MCP tool: authentication (API keys, the admin token, agents' RFC 9421
signatures, booking-scoped credentials) and authorization (access classes, profile binding).

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.access``.
"""

from usp_dispatcher.access.apikeys import (
    KEY_PREFIX,
    authenticate_bearer,
    create_api_key,
    issue_api_key,
    list_api_keys,
    revoke_api_key,
)
from usp_dispatcher.access.authorize import authenticate_http, authorize
from usp_dispatcher.access.bindings import bind_profile, bound_profile
from usp_dispatcher.access.credentials import (
    SCOPED_TOOLS,
    BookingCredential,
    issue_booking_credential,
    make_pop_proof,
    proof_digest,
    verify_booking_credential,
)
from usp_dispatcher.access.errors import Access
from usp_dispatcher.access.identity import BUSINESS, Caller, Identity
from usp_dispatcher.access.policy import MECHANISMS, AuthorizationPolicy, policy_document
from usp_dispatcher.access.signatures import (
    DirectoryCache,
    default_directories,
    verify_agent_signature,
)
from usp_dispatcher.errors import FORBIDDEN, INVALID_PARAMS, UNAUTHENTICATED, AccessError

__all__ = [
    "BUSINESS",
    "FORBIDDEN",
    "INVALID_PARAMS",
    "KEY_PREFIX",
    "MECHANISMS",
    "SCOPED_TOOLS",
    "UNAUTHENTICATED",
    "Access",
    "AccessError",
    "AuthorizationPolicy",
    "BookingCredential",
    "Caller",
    "DirectoryCache",
    "Identity",
    "authenticate_bearer",
    "authenticate_http",
    "authorize",
    "bind_profile",
    "bound_profile",
    "create_api_key",
    "default_directories",
    "issue_api_key",
    "issue_booking_credential",
    "list_api_keys",
    "make_pop_proof",
    "policy_document",
    "proof_digest",
    "revoke_api_key",
    "verify_agent_signature",
    "verify_booking_credential",
]
