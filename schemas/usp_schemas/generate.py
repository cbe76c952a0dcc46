"""Write the JSON Schemas of the contract into ``schemas/json`` (or ``--out``); ``--check`` only compares.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_schemas.generate``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter

from usp_schemas._content import ContentSubscription, Entitlement, Post, Publication
from usp_schemas._events import OperationalWebhookEvent, WebhookEvent
from usp_schemas._jsonrpc import WebhookNotification
from usp_schemas._mcp import ToolResult
from usp_schemas._payloads import Booking, Message, Service, Slot, WaitlistEntry
from usp_schemas._probe import ProbeEvent

__all__ = ["DEFAULT_OUTPUT_DIR", "main", "readable_schema", "render_schemas"]

#: ``schemas/json`` beside the package in a source checkout; found from this file, never from cwd.
DEFAULT_OUTPUT_DIR = Path(__file__).resolve().parent.parent / "json"

_DIALECT = "https://json-schema.org/draft/2020-12/schema"
_PAYLOADS: dict[str, type[BaseModel]] = {
    "booking.json": Booking,
    "service.json": Service,
    "slot.json": Slot,
    "waitlist_entry.json": WaitlistEntry,
    "message.json": Message,
    "mcp_tool_result.json": ToolResult,
    "publication.json": Publication,
    "post.json": Post,
    "content_subscription.json": ContentSubscription,
    "entitlement.json": Entitlement,
    "probe_event.json": ProbeEvent,
}


def render_schemas() -> dict[str, str]:
    """Every schema file's name and exact text, without touching the disk (the drift test uses it).

    >>> sorted(render_schemas())[:3]
    ['booking.json', 'content_subscription.json', 'entitlement.json']
    """
    schemas: dict[str, dict[str, Any]] = {
        "webhook_event.json": _webhook_event_schema(),
        "jsonrpc_notification.json": _notification_schema(),
        "operational_event.json": _operational_event_schema(),
    }
    schemas.update({name: model.model_json_schema() for name, model in _PAYLOADS.items()})
    return {name: _dump({"$schema": _DIALECT, **schema}) for name, schema in sorted(schemas.items())}


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m usp_schemas.generate", description=__doc__)
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: schemas/json)")
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 on any difference")
    args = parser.parse_args(argv)

    out: Path | None = args.out
    if out is None:
        # From an installed wheel, parent.parent is site-packages: never write a "json" folder there.
        if not (DEFAULT_OUTPUT_DIR.parent / "pyproject.toml").is_file():
            parser.error("not running from a source checkout; pass --out")
        out = DEFAULT_OUTPUT_DIR

    rendered = render_schemas()
    if args.check:
        stale = stale_files(out, rendered)
        for name in stale:
            print(f"out of date: {out / name}", file=sys.stderr)
        if stale:
            print("run: uv run python -m usp_schemas.generate", file=sys.stderr)
        return 1 if stale else 0

    out.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        path = out / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    for name in sorted({p.name for p in out.glob("*.json")} - rendered.keys()):
        (out / name).unlink()
        print(f"removed {out / name}")
    return 0


def stale_files(folder: Path, rendered: dict[str, str]) -> list[str]:
    """Names in ``folder`` that differ from ``rendered``, are missing, or are no longer generated."""
    on_disk = {p.name for p in folder.glob("*.json")} if folder.is_dir() else set()
    stale = {name for name in on_disk - rendered.keys()}
    for name, text in rendered.items():
        path = folder / name
        if name not in on_disk or path.read_text(encoding="utf-8") != text:
            stale.add(name)
    return sorted(stale)


def _webhook_event_schema() -> dict[str, Any]:
    schema = TypeAdapter(WebhookEvent).json_schema()
    schema["title"] = "WebhookEvent"
    schema["description"] = "A USP webhook event: the REST body, and the params of a usp_webhook notification"
    return schema


def _operational_event_schema() -> dict[str, Any]:
    schema = TypeAdapter(OperationalWebhookEvent).json_schema()
    schema["title"] = "OperationalWebhookEvent"
    schema["description"] = (
        "An operational event: the service's own, about its subscriptions, deliveries and probes"
    )
    return schema


def _notification_schema() -> dict[str, Any]:
    # The model keeps ``params`` a raw dict (the signature covers its exact JSON); the published
    # schema says what that dict is: an event envelope.
    schema = WebhookNotification.model_json_schema()
    event = _webhook_event_schema()
    schema["$defs"] = event.pop("$defs")
    params = {key: event[key] for key in ("oneOf", "discriminator")}
    params["description"] = "the event envelope (plus _meta.usp.signature when signed in band)"
    schema["properties"]["params"] = params
    return schema


def _dump(schema: dict[str, Any]) -> str:
    return json.dumps(readable_schema(schema), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def readable_schema(node: Any) -> Any:
    """Descriptions come from docstrings: drop their doctest examples (Python, useless to other
    languages) and turn reST ``literals`` into Markdown `literals`."""
    if isinstance(node, list):
        return [readable_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    cleaned = {key: readable_schema(value) for key, value in node.items()}
    if isinstance(cleaned.get("description"), str):
        text = cleaned["description"]
        text = text[: text.index(">>>")] if ">>>" in text else text
        cleaned["description"] = text.replace("``", "`").strip()
    return cleaned


if __name__ == "__main__":
    raise SystemExit(main())
