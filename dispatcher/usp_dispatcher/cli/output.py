"""How the CLI prints what it lists: tables that fit 80 columns, or the API's JSON with ``--json``.

Tables show ids shortened to their prefix and last eight characters (``dlv_…7203eef7``: ids are
time-ordered, so the tail is what tells rows apart) and times as ages (``5m``, ``3h``, ``2d``);
``--json`` prints the full answer for scripts and for copying a full id.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table
from rich.text import Text

__all__ = ["Json", "add_row", "age", "print_json", "short_id", "table"]

Json = Annotated[
    bool, typer.Option("--json", help="Print the API's JSON answer (full ids and times) instead of a table.")
]

_SHORT = 16


def short_id(value: str | None) -> str:
    """``value`` as a table shows it.

    >>> short_id("dlv_01a2442ce15477f68ce1e1957203eef7")
    'dlv_…7203eef7'
    >>> short_id("evt_789abc")
    'evt_789abc'
    """
    if value is None:
        return "-"
    if len(value) <= _SHORT:
        return value
    prefix, underscore, _ = value.partition("_")
    head = prefix + underscore if underscore and len(prefix) <= 6 else ""
    return f"{head}…{value[-8:]}"


def age(moment: str | None, *, now: datetime | None = None) -> str:
    """How long ago an RFC 3339 ``moment`` was, in its largest unit.

    >>> age("2026-01-01T00:00:00Z", now=datetime(2026, 1, 1, 3, 30, tzinfo=UTC))
    '3h'
    """
    if moment is None:
        return "-"
    then = datetime.fromisoformat(moment.replace("Z", "+00:00"))
    seconds = max(0, int(((now or datetime.now(UTC)) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def table(title: str | None, *columns: str) -> Table:
    """A borderless table whose rows stay one line each at 80 columns: the last column (a URL, an
    excerpt) gives up width first and is cut with an ellipsis; the others keep their width."""
    made = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")
    for index, column in enumerate(columns):
        # Rich narrows only wrappable columns before cutting all of them evenly; the cells
        # themselves never wrap (add_row), so "wrappable" here means "cut with an ellipsis".
        made.add_column(column, no_wrap=index < len(columns) - 1, overflow="ellipsis")
    return made


def add_row(made: Table, *cells: object) -> None:
    """A row of plain text (no Rich markup: values come from the API), each cell on one line."""
    made.add_row(*(Text(str(cell), no_wrap=True, overflow="ellipsis") for cell in cells))


def print_json(answer: Any) -> None:
    """The answer as indented JSON on stdout, untouched by Rich (no wrapping, no markup)."""
    typer.echo(json.dumps(answer, indent=2, ensure_ascii=False))
