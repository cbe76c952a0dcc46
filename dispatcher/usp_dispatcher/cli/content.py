"""The content server's commands: ``content`` (publications, tiers, posts and agents'
subscriptions, through the admin API like the other operator commands), ``payments confirm``
(complete a sandbox or USDC checkout against the configured database, as a provider's webhook
would) and ``ucap-mcp`` (the agent-side MCP server of the UCAP seed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from usp_core import db
from usp_dispatcher.cli.admin import DEFAULT_URL, AdminClient, Token, Url
from usp_dispatcher.cli.config import load_settings, open_engine
from usp_dispatcher.cli.helptext import LabelledGroup
from usp_dispatcher.cli.output import Json, add_row, print_json, short_id, table

__all__ = ["register"]

content_app = typer.Typer(
    cls=LabelledGroup,
    help="Publications, tiers, posts and agents' subscriptions (UCAP).",
    no_args_is_help=True,
)
payments_app = typer.Typer(
    cls=LabelledGroup, help="Checkout sessions of agents' subscriptions.", no_args_is_help=True
)
console = Console()

JsonFile = Annotated[
    Path, typer.Argument(exists=True, dir_okay=False, help="A JSON file (see docs/ucap.md).")
]


def register(app: typer.Typer) -> None:
    """Add the content commands to ``app``."""
    app.add_typer(content_app, name="content")
    app.add_typer(payments_app, name="payments")
    app.command("ucap-mcp")(ucap_mcp)


@content_app.command("add-publication")
def add_publication(file: JsonFile, url: Url = DEFAULT_URL, token: Token = None) -> None:
    """Add a publication (and its tiers) from a JSON file."""
    with AdminClient(url, token) as api:
        made = api.call("POST", "/admin/ucap/publications", json=_read(file))
    console.print(f"publication {made['id']} ({made['slug']}) added", markup=False)


@content_app.command("add-tier")
def add_tier(publication_id: str, file: JsonFile, url: Url = DEFAULT_URL, token: Token = None) -> None:
    """Add a tier to a publication from a JSON file."""
    with AdminClient(url, token) as api:
        made = api.call("POST", f"/admin/ucap/publications/{publication_id}/tiers", json=_read(file))
    console.print(f"tier {made['id']} added to {made['publication_id']}", markup=False)


@content_app.command("add-post")
def add_post(publication_id: str, file: JsonFile, url: Url = DEFAULT_URL, token: Token = None) -> None:
    """Publish a post from a JSON file (free, or unlocked by its tier_ids)."""
    with AdminClient(url, token) as api:
        made = api.call("POST", f"/admin/ucap/publications/{publication_id}/posts", json=_read(file))
    kind = "free" if made["free"] else "paid"
    console.print(f"{kind} post {made['id']} published in {made['publication_id']}", markup=False)


@content_app.command("subscriptions")
def subscriptions(
    status: Annotated[str | None, typer.Option(help="pending_payment, active, expired or cancelled.")] = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """Agents' subscriptions, newest first."""
    params = {} if status is None else {"status": status}
    with AdminClient(url, token) as api:
        answer = api.call("GET", "/admin/ucap/subscriptions", params=params)
    if as_json:
        print_json(answer)
        return
    shown = table(None, "id", "publication", "tier", "status", "method", "price", "agent")
    for row in answer["subscriptions"]:
        price = row["price"]
        add_row(
            shown,
            short_id(row["id"]),
            row["publisher_id"],
            row["tier_id"],
            row["status"],
            row["payment_method"],
            f"{price['amount'] / 100:.2f} {price['currency']}/{price['interval']}",
            row["agent"]["key_directory"],
        )
    console.print(shown)


@payments_app.command("confirm")
def confirm(session_id: Annotated[str, typer.Argument(help="The checkout session id (chk_…).")]) -> None:
    """Complete a checkout session in the configured database, as the provider's webhook would:
    the subscription is activated and the entitlement granted, once."""
    from usp_dispatcher.errors import UcapError
    from usp_dispatcher.ucap.subscriptions import fulfil
    from usp_workers import handing_off

    settings = load_settings()
    try:
        with (
            open_engine(settings) as engine,
            handing_off(settings),  # its two events go out now, as the API's would
            db.session(engine) as session,
        ):
            done = fulfil(session, session_id)
    except UcapError as exc:
        console.print(f"{exc.code}: {exc.detail}", style="red", markup=False)
        raise typer.Exit(1) from None
    if done.granted:
        console.print(
            f"{session_id} paid: entitlement {done.entitlement_id} granted", markup=False, soft_wrap=True
        )
    else:
        console.print(
            f"{session_id} was already paid (entitlement {done.entitlement_id})", markup=False, soft_wrap=True
        )


def ucap_mcp(
    api: Annotated[str, typer.Option("--api", help="The UCAP server's base URL (its /v1 API).")],
    agent_key: Annotated[
        Path,
        typer.Option(
            "--agent-key", exists=True, dir_okay=False, help="The agent's Ed25519 key (PKCS#8 PEM)."
        ),
    ],
    signature_agent: Annotated[
        str,
        typer.Option("--signature-agent", help="Your key directory: an origin or a JWKS URL (OpenBotAuth)."),
    ],
) -> None:
    """Serve the five UCAP tools over stdio, signing every /v1 call with the agent's key (the seed's
    agent-side MCP server: add it to your MCP client's configuration)."""
    from usp_dispatcher.mcp.ucap_agent import load_agent_key, run_agent_stdio

    try:
        load_agent_key(agent_key)
    except ValueError as exc:
        console.print(str(exc), style="red", markup=False)
        raise typer.Exit(2) from None
    run_agent_stdio(api, agent_key, signature_agent)


def _read(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except ValueError:
        console.print(f"{file} is not JSON", style="red", markup=False)
        raise typer.Exit(2) from None
