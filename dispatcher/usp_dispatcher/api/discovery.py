"""``GET /.well-known/usp``: the business profile, where a platform starts.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.api.discovery``.
"""

from __future__ import annotations

from typing import Any, Final

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from usp_dispatcher import access
from usp_dispatcher.mcp.listen import LISTEN_FILTER
from usp_dispatcher.mcp.results import CAPABILITIES
from usp_dispatcher.mcp.tools import TOOLS
from usp_dispatcher.settings import ApiSettings
from usp_dispatcher.web.deps import SettingsDep
from usp_receiver.mcp import CURSOR_META_KEY, EXTENSION_IDENTIFIER
from usp_schemas import EVENT_TYPES, USP_VERSION

__all__ = ["WEBHOOK_CAPABILITY", "business_profile", "router"]

#: The outbound-webhook capability (the receiver's MCP extension uses the same identifier).
WEBHOOK_CAPABILITY: Final = EXTENSION_IDENTIFIER
#: The MCP protocol versions ``/mcp`` speaks: the handshake ones (a session) and the stateless one.
MCP_VERSIONS: Final = ("2025-06-18", "2025-11-25", "2026-07-28")
_MAX_AGE: Final = 300

router = APIRouter(tags=["discovery"])


@router.get("/.well-known/usp", summary="The business profile (USP discovery)")
def discovery(settings: SettingsDep) -> JSONResponse:
    """Version, capabilities, endpoints, MCP tools with access classes, AuthorizationPolicy,
    webhook event types and JWKS."""
    return JSONResponse(business_profile(settings), headers={"Cache-Control": f"public, max-age={_MAX_AGE}"})


def business_profile(settings: ApiSettings) -> dict[str, Any]:
    """The document ``/.well-known/usp`` serves."""
    base = settings.public_base_url.rstrip("/")
    capabilities = {name: [{"version": USP_VERSION}] for name in (*CAPABILITIES.values(), WEBHOOK_CAPABILITY)}
    return {
        "usp": {"version": USP_VERSION, "capabilities": capabilities},
        "bindings": {
            "mcp": {
                "endpoint": f"{base}/mcp",
                "transports": ["streamable_http", "stdio"],
                "stdio_command": "usp-webhooks mcp",
                "protocol_versions": list(MCP_VERSIONS),
                # MCP 2026-07-28: the subscriptions/listen filter that opts in to usp_webhook.
                "listen_filter": dict(LISTEN_FILTER),
                "listen_cursor_meta_key": CURSOR_META_KEY,
            },
            "rest": {"endpoint": f"{base}/services"},
        },
        "tools": [
            {
                "name": tool.name,
                "description": tool.description,
                "x-usp-access": tool.operation.access.value,
                "capability": tool.capability,
                "inputSchema": tool.input_schema,
            }
            for tool in TOOLS
        ],
        "authorization": access.policy_document(settings),
        "webhooks": {
            "jwks_uri": f"{base}/.well-known/usp/jwks.json",
            "signatures_directory": f"{base}/.well-known/http-message-signatures-directory",
            "event_types": list(EVENT_TYPES),
            "transports": ["rest", "jsonrpc", "mcp"],
            "subscriptions": f"{base}/services/feed/subscriptions",
        },
    }
