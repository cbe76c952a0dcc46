"""``usp-webhooks``: run and operate the dispatcher (migrate, serve the API, manage signing keys).

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.cli.main``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from usp_dispatcher import database
from usp_dispatcher.cli.access import api_keys_app
from usp_dispatcher.cli.admin import DEFAULT_URL, AdminClient, Token, Url
from usp_dispatcher.cli.admin import register as register_operator_commands
from usp_dispatcher.cli.config import load_settings, open_engine
from usp_dispatcher.cli.content import register as register_content_commands
from usp_dispatcher.cli.helptext import LabelledGroup
from usp_dispatcher.cli.listen import listen
from usp_dispatcher.cli.output import Json, print_json
from usp_dispatcher.settings import ApiSettings
from usp_workers import SchedulerSettings, WorkerSettings

__all__ = ["app", "keys_app", "main"]

app = typer.Typer(
    cls=LabelledGroup,
    name="usp-webhooks",
    help="Run and operate the USP webhook dispatcher. Configuration: USP_* environment variables.",
    no_args_is_help=True,
    add_completion=False,
    # A traceback showing locals could print a private key or the admin token.
    pretty_exceptions_show_locals=False,
    # Click's own help layout, as gh and the Stripe CLI print theirs: paragraphs reflowed to the
    # terminal, a flag without a type label, a value option with its metavar (--url URL).
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
)
keys_app = typer.Typer(cls=LabelledGroup, help="The business's webhook signing keys.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")

console = Console()


class KeyAlgorithm(StrEnum):
    """Algorithms of the USP signature profile."""

    ED25519 = "ed25519"
    ECDSA_P256_SHA256 = "ecdsa-p256-sha256"


def main() -> None:
    """Console-script entry point (``usp-webhooks``)."""
    app(prog_name="usp-webhooks")


# ------------------------------------------------------------------------------------ database


@app.command()
def migrate() -> None:
    """Bring the configured database's schema to the latest version (safe to run repeatedly):
    the delivery engine's tables, then the scheduling domain's."""
    settings = load_settings()
    with open_engine(settings) as engine:
        chains = database.upgrade(engine)
    backend = engine.url.get_backend_name()
    created = sorted(table for chain in chains.values() for table in chain.created)
    revisions = ", ".join(f"{name} at {chain.after}" for name, chain in chains.items())
    if all(chain.before is None for chain in chains.values()):
        console.print(f"created the schema on {backend} ({revisions}): {len(created)} tables")
        console.print(Text(", ".join(created), style="dim"))
        return
    moved = [
        f"{name} {chain.before} → {chain.after}"
        for name, chain in chains.items()
        if chain.before != chain.after
    ]
    if not moved:
        console.print(f"database schema is up to date on {backend} ({revisions}): nothing to do")
        return
    console.print(f"upgraded the schema on {backend}: {'; '.join(moved)}")
    if created:
        console.print(Text("new tables: " + ", ".join(created), style="dim"))


@app.command()
def ready() -> None:
    """Check that the database and the broker answer (the container health check of the worker
    and the scheduler; the API serves the same at /readyz). Exit 1 naming what failed."""
    from usp_workers import readiness

    settings = load_settings()
    with open_engine(settings) as engine:
        checks = readiness(engine, settings)
    for check in checks:
        if check.ok:
            console.print(f"{check.name}: ok")
        else:
            console.print(Text(f"{check.name}: {check.error}", style="red"))
    if not all(check.ok for check in checks):
        raise typer.Exit(1)


# ------------------------------------------------------------------------------------ API


@app.command()
def api(
    host: Annotated[str, typer.Option(help="Interface to listen on (0.0.0.0 in a container).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.", min=1, max=65535)] = 8000,
) -> None:
    """Serve the HTTP API (events, subscriptions, JWKS) with uvicorn."""
    import uvicorn

    from usp_dispatcher.api.app import create_app

    uvicorn.run(create_app(ApiSettings()), host=host, port=port)


@app.command()
def mcp() -> None:
    """Serve the USP MCP tools over stdio (one JSON-RPC message per line) until stdin closes.

    For an agent that starts the business's server itself; over the network the same tools are
    at the API's /mcp. Credentials come in _meta.usp.authorization.
    """
    from usp_dispatcher.mcp.stdio import run_stdio

    run_stdio(ApiSettings())


# ------------------------------------------------------------------------------------ delivery


@app.command()
def worker(
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="Batches run at once (threads; default 32).")
    ] = None,
) -> None:
    """Run a delivery worker (Celery, threads pool) until SIGTERM or Ctrl-C."""
    from usp_workers import run_worker

    run_worker(WorkerSettings(), concurrency=concurrency)


@app.command()
def scheduler() -> None:
    """Run the scheduler: enqueue due deliveries, reclaim expired leases, expire waitlist offers
    (one is enough; two are safe)."""
    from usp_dispatcher.scheduling.housekeeping import housekeeping_thread
    from usp_workers import run_relay, tasks

    settings = SchedulerSettings()
    # Events of expired offers reach the broker at once, not at the relay's re-send.
    with tasks.handing_off(settings), housekeeping_thread(settings):
        run_relay(settings)


@app.command()
def up(
    host: Annotated[str, typer.Option(help="Interface the API listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="The API's TCP port.", min=1, max=65535)] = 8000,
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="The worker's concurrent batches (default 8).")
    ] = None,
    dev: Annotated[
        bool,
        typer.Option(
            "--dev",
            help="Allow webhook targets on loopback and private networks (a receiver on this machine).",
        ),
    ] = False,
) -> None:
    """Run everything on this machine: the API, a worker and the scheduler; Ctrl-C stops all.

    Needs no settings: without any, a SQLite database and an embedded broker live in the working
    folder. Without USP_ADMIN_TOKEN, an admin token is generated for this session and printed
    once.
    """
    from usp_dispatcher.cli.supervisor import run_up

    raise typer.Exit(
        run_up(load_settings(), host=host, port=port, concurrency=concurrency, console=console, dev=dev)
    )


# ------------------------------------------------------------------------------------ keys


@keys_app.command("list")
def keys_list(url: Url = DEFAULT_URL, token: Token = None, as_json: Json = False) -> None:
    """Every signing key with its schedule and what it does now (public facts only)."""
    with AdminClient(url, token) as api:
        answer = api.call("GET", "/admin/keys")
    if as_json:
        print_json(answer)
        return
    # The kid (a 43-character thumbprint) is what operators copy into configs and find in
    # receivers' logs: never cut it short. Two lines per key keep it whole within 80 columns.
    for item in answer["items"]:
        console.print(Text.assemble((item["kid"], "bold"), "  ", item["state"]))
        schedule = f"signs from {_when(item['signs_from'])}, retires {_when(item['retires_at'])}"
        console.print(Text(f"  {item['alg']}, {schedule}"))


@keys_app.command("rotate")
def keys_rotate(
    alg: Annotated[KeyAlgorithm, typer.Option(help="Algorithm of the new key.")] = KeyAlgorithm.ED25519,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Add a new key: published at once, signing after the publish lead; old keys then retire.

    On a service without keys the new key is the first one and signs at once: a key that waits
    for the publish lead would leave nothing to sign with until then.
    """
    with AdminClient(url, token) as api:
        rotated = api.call("POST", "/admin/keys/rotate", json={"alg": alg.value})
    key = rotated["key"]
    console.print(Text.assemble("new key ", (key["kid"], "bold"), f" ({key['alg']}) is published now"))
    if rotated["first"]:
        console.print("there was no key before it, so it signs from now on")
    else:
        console.print(
            f"it starts signing at {_when(rotated['signs_from'])}; "
            f"older keys stop signing at {_when(rotated['older_keys_retire_at'])}",
            markup=False,
        )


def _when(moment: str | None) -> str:
    """An API timestamp as the key table shows it: UTC, to the minute (``--json`` has it whole)."""
    return (
        "-" if moment is None else datetime.fromisoformat(moment).astimezone(UTC).strftime("%Y-%m-%d %H:%MZ")
    )


# events, replay, recover, dead-letter, subscriptions, trigger, listen: clients of the admin API
register_operator_commands(app)
app.command()(listen)
register_content_commands(app)


app.add_typer(api_keys_app, name="api-keys")
