"""The five UCAP MCP tools exactly as the seed defines them (name, description, ``inputSchema``),
and how a ``/v1`` answer becomes a tool result. Both MCP servers use these: the remote one at
``/mcp`` (:mod:`usp_dispatcher.mcp.ucap`) and the agent-side stdio one
(:mod:`usp_dispatcher.mcp.ucap_agent`).

Descriptions keep the seed's YAML exactly, folded lines' trailing newline included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import mcp_types as types

__all__ = ["UCAP_TOOLS", "UCAP_TOOLS_BY_NAME", "UcapTool", "tool_result"]

_CONTEXT: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "language": {"type": "string", "description": "Preferred language"},
        "currency": {"type": "string", "description": "Preferred currency (ISO 4217)"},
        "intent": {"type": "string", "description": "Semantic description of search goal"},
    },
}


@dataclass(frozen=True, slots=True)
class UcapTool:
    name: str
    description: str
    input_schema: dict[str, Any]
    capability: str
    read_only: bool


UCAP_TOOLS: Final[tuple[UcapTool, ...]] = (
    UcapTool(
        name="search_catalog",
        description="Search for publications and posts by query, category, price, and recency",
        input_schema={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Free-text search query"},
                "filters": {
                    "type": "object",
                    "properties": {
                        "categories": {
                            "type": "array",
                            "items": {"type": "string"},
                            "description": "Filter by category/tag",
                        },
                        "price": {
                            "type": "object",
                            "properties": {
                                "max": {"type": "integer", "description": "Maximum price in cents per month"}
                            },
                        },
                        "language": {"type": "string", "description": "Content language (BCP 47)"},
                        "recency": {
                            "type": "string",
                            "enum": ["24h", "7d", "30d", "90d"],
                            "description": "Content freshness filter",
                        },
                    },
                },
                "context": _CONTEXT,
                "pagination": {
                    "type": "object",
                    "properties": {
                        "limit": {"type": "integer", "description": "Results per page (default 10, max 25)"},
                        "cursor": {"type": "string", "description": "Pagination cursor"},
                    },
                },
            },
        },
        capability="dev.ucap.content.catalog.search",
        read_only=True,
    ),
    UcapTool(
        name="get_catalog_item",
        description="Get publication or post details by ID (supports multiple ID formats)",
        input_schema={
            "type": "object",
            "properties": {
                "id": {
                    "type": "string",
                    "description": (
                        "ID in format: pub_{id}, post_{id}, slug:{slug}, patreon:{id}, url:{encoded_url}\n"
                    ),
                },
                "context": {
                    "type": "object",
                    "properties": {"language": {"type": "string"}, "currency": {"type": "string"}},
                },
            },
            "required": ["id"],
        },
        capability="dev.ucap.content.catalog.lookup",
        read_only=True,
    ),
    UcapTool(
        name="read_content",
        description="Read full content from a post (may return 402 if subscription required)",
        input_schema={
            "type": "object",
            "properties": {
                "publisher_id": {"type": "string", "description": "Publication ID"},
                "post_id": {"type": "string", "description": "Post ID"},
            },
            "required": ["publisher_id", "post_id"],
        },
        capability="dev.ucap.content.access",
        read_only=True,
    ),
    UcapTool(
        name="subscribe",
        description="Subscribe to a publisher (returns checkout URL for human or USDC payment details)\n",
        input_schema={
            "type": "object",
            "properties": {
                "publisher_id": {"type": "string"},
                "tier_id": {"type": "string"},
                "payment_method": {
                    "type": "string",
                    "enum": ["stripe", "usdc"],
                    "description": "Payment method preference",
                },
            },
            "required": ["publisher_id", "tier_id"],
        },
        capability="dev.ucap.content.subscription",
        read_only=False,
    ),
    UcapTool(
        name="list_entitlements",
        description="List active subscriptions for the authenticated agent/user",
        input_schema={"type": "object", "properties": {}},
        capability="dev.ucap.content.subscription",
        read_only=True,
    ),
)

UCAP_TOOLS_BY_NAME: Final = {tool.name: tool for tool in UCAP_TOOLS}
_PAYMENT_MESSAGE: Final = "Please click the checkout URL to subscribe"


def list_entries() -> list[types.Tool]:
    """The five tools as ``tools/list`` shows them (``_meta["x-ucap-capability"]`` names the
    UCAP capability each maps to)."""
    return [
        types.Tool(
            name=tool.name,
            description=tool.description,
            input_schema=tool.input_schema,
            annotations=types.ToolAnnotations(read_only_hint=tool.read_only, open_world_hint=False),
            _meta={"x-ucap-capability": tool.capability},
        )
        for tool in UCAP_TOOLS
    ]


def tool_result(name: str, status: int, body: Mapping[str, Any]) -> types.CallToolResult:
    """A ``/v1`` answer as the tool's result: ``read_content`` answers ``{"status": "ok",
    "content": …}`` on a 200 and ``{"status": "payment_required", "offers": […], "message": …}`` on
    a 402 (the seed's example); the others answer the HTTP body (``subscribe``'s 402 for ``usdc``
    too: the payment details). A refusal (4xx) is a result with ``isError`` and a ``messages[]``
    entry naming UCAP's code."""
    if name == "read_content" and status == 402:
        structured: dict[str, Any] = {
            "status": "payment_required",
            "offers": body.get("offers", []),
            "message": _PAYMENT_MESSAGE,
            "teaser": body.get("teaser"),
            "publisher": body.get("publisher"),
        }
        offers = ", ".join(_offer_text(o) for o in structured["offers"])
        text = f"Payment required: {_PAYMENT_MESSAGE}. Offers: {offers or 'none'}."
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structured_content=structured
        )
    if status >= 400 and status != 402:  # a 402 of subscribe (usdc) is its answer, not a refusal
        raw = body.get("error")
        error: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
        code = str(error.get("code") or body.get("reason") or "error")
        detail = str(error.get("message") or body.get("detail") or "The request was refused.")
        structured = {"status": "error", "messages": [{"type": "error", "code": code, "content": detail}]}
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=f"Error: {detail}")],
            structured_content=structured,
            is_error=True,
        )
    if name == "read_content":
        structured = {
            "status": "ok",
            **{k: body[k] for k in ("content", "metadata", "publisher", "attribution") if k in body},
        }
        title = (body.get("metadata") or {}).get("title", "the post")
        text = f"{title}\n\n{(body.get('content') or {}).get('text', '')}"
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structured_content=structured
        )
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=_summary(name, body))], structured_content=dict(body)
    )


def _summary(name: str, body: Mapping[str, Any]) -> str:
    if name == "search_catalog":
        results = body.get("results") or []
        shown = "; ".join(
            f"{r['type']} {r[r['type']]['id']}: {r[r['type']].get('title') or r[r['type']].get('name')}"
            for r in results[:10]
        )
        return f"{(body.get('pagination') or {}).get('total', len(results))} results. {shown}".strip()
    if name == "get_catalog_item":
        kind = body.get("type")
        if kind in ("publication", "post"):
            item = body[kind]
            return f"{kind} {item['id']}: {item.get('title') or item.get('name')}"
        return "Error: " + "; ".join(m.get("message", "") for m in body.get("messages") or [])
    if name == "subscribe":
        checkout = body.get("checkout") or {}
        return f"{body.get('message', '')} Checkout: {checkout.get('url', '')}".strip()
    if name == "list_entitlements":
        items = body.get("entitlements") or []
        listed = ", ".join(f"{e['publisher_name']} {e['tier_name']} ({e['status']})" for e in items)
        return f"{len(items)} entitlements" + (f": {listed}." if listed else ".")
    return "Done."


def _offer_text(offer: Mapping[str, Any]) -> str:
    price = offer["price"]
    return (
        f"{offer['tier_name']} at {price['amount'] / 100:.2f} {price['currency']}/{price['interval']}"
        f" ({offer['checkout_url']})"
    )
