"""``usp-webhooks api-keys``: platforms' bearer API keys (create, list, revoke).

Works on the database directly, like ``keys``: an operator with the database settings is already
trusted with everything the keys open. A new key is printed once, on standard output, and
nowhere else (no log line, no table); afterwards only its id and hash exist.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console
from sqlmodel import Session

from usp_core import db
from usp_dispatcher.access import create_api_key, list_api_keys, revoke_api_key
from usp_dispatcher.cli.config import load_settings, open_engine
from usp_dispatcher.cli.helptext import LabelledGroup
from usp_dispatcher.cli.output import Json, add_row, age, print_json, table

__all__ = ["api_keys_app"]

api_keys_app = typer.Typer(
    cls=LabelledGroup, help="Platforms' bearer API keys for the MCP tools.", no_args_is_help=True
)
console = Console()


@contextmanager
def _database() -> Iterator[Session]:
    """A session on the configured database, read as every command reads it. ``cli`` is imported
    here, not at the top: it registers this module's commands, so it imports this module."""

    with open_engine(load_settings()) as engine, db.session(engine) as session:
        yield session


@api_keys_app.command("create")
def api_keys_create(
    principal: Annotated[str, typer.Argument(help="Who the key authenticates (it acts as key:<PRINCIPAL>).")],
    label: Annotated[str | None, typer.Option(help="A note for operators (where the key went).")] = None,
    profile: Annotated[
        str | None,
        typer.Option(help="Bind the key to this platform profile URI now (else: its first call's)."),
    ] = None,
) -> None:
    """Make a key for PRINCIPAL and print it once: store it now, it cannot be shown again."""
    with _database() as session:
        try:
            row, plaintext = create_api_key(session, principal, label=label, profile=profile)
        except ValueError as exc:
            console.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
    console.print(f"API key [bold]{row.id}[/bold] for key:{row.principal} (shown once, store it now):")
    # Plain print, not rich: no wrapping or markup may alter the key.
    typer.echo(plaintext)


@api_keys_app.command("list")
def api_keys_list(as_json: Json = False) -> None:
    """Every key: id, principal, label, created, revoked (never the key itself)."""
    with _database() as session:
        rows = list_api_keys(session)
    if as_json:
        print_json(
            [
                {
                    "id": row.id,
                    "principal": f"key:{row.principal}",
                    "label": row.label,
                    "created_at": row.created_at.isoformat(),
                    "revoked_at": None if row.revoked_at is None else row.revoked_at.isoformat(),
                }
                for row in rows
            ]
        )
        return
    # The whole id: it is what `api-keys revoke` takes, and the table is narrow enough for it.
    shown = table("API keys", "id", "principal", "created", "revoked", "label")
    for row in rows:
        add_row(
            shown,
            row.id,
            f"key:{row.principal}",
            age(row.created_at.isoformat()),
            "-" if row.revoked_at is None else age(row.revoked_at.isoformat()),
            row.label or "-",
        )
    console.print(shown)


@api_keys_app.command("revoke")
def api_keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (from create or list).")],
) -> None:
    """Revoke a key at once; exit 1 when there is no such live key."""
    with _database() as session:
        revoked = revoke_api_key(session, key_id)
    if not revoked:
        console.print(f"no live API key has id {key_id}")
        raise typer.Exit(1)
    console.print(f"API key {key_id} is revoked")
