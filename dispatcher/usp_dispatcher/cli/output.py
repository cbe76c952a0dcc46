"""How the CLI prints what it lists: tables that fit the terminal, or the API's JSON with ``--json``.

Tables show ids shortened to their prefix and last eight characters (``dlv_…7203eef7``: ids are
time-ordered, so the tail is what tells rows apart; every command that takes an id takes this
form too) and times as ages (``5m``, ``3h``, ``2d``); ``--json`` prints the full answer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from usp_workers.operations import short_id

__all__ = ["Column", "Json", "add_row", "age", "fitted_table", "print_json", "short_id", "table"]

Json = Annotated[
    bool, typer.Option("--json", help="Print the API's JSON answer (full ids and times) instead of a table.")
]


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


@dataclass(frozen=True, slots=True)
class Column:
    """A column of :func:`fitted_table`: ``drop`` 0 is shown at any width; the others give way,
    highest first, when the rows would not fit. ``flex``: the column cut with an ellipsis to
    what is left (a URL, an answer); it keeps at least ``least`` characters."""

    header: str
    drop: int = 0
    flex: bool = False
    least: int = 16  #: a flexible column's width before another column is dropped for it


#: Between two columns: their padding and the (blank) rule.
_GAP = 3


def fitted_table(
    title: str | None, columns: Sequence[Column], rows: Sequence[Sequence[object]], width: int
) -> Table:
    """The rows (cells in ``columns`` order) in a table no wider than ``width``: optional columns
    dropped while the rest would not fit at their full width, then the flexible one cut."""
    texts = [[str(cell) for cell in row] for row in rows]
    natural = [
        max([len(column.header), *(len(row[index]) for row in texts)]) for index, column in enumerate(columns)
    ]
    shown = list(range(len(columns)))

    def needed() -> int:
        return sum(
            min(columns[i].least, natural[i]) if columns[i].flex else natural[i] for i in shown
        ) + _GAP * (len(shown) - 1)

    for index in sorted(shown, key=lambda i: (-columns[i].drop, -i)):
        if needed() <= width or columns[index].drop == 0:
            break
        shown.remove(index)
    made = Table(
        title=title,
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1),
        title_justify="left",
    )
    rest = width - sum(natural[i] for i in shown if not columns[i].flex) - _GAP * (len(shown) - 1)
    for index in shown:
        column = columns[index]
        size = (
            max(min(column.least, natural[index]), min(natural[index], rest))
            if column.flex
            else natural[index]
        )
        made.add_column(column.header, no_wrap=True, overflow="ellipsis", width=size)
    for row in texts:
        made.add_row(*(Text(row[i], no_wrap=True, overflow="ellipsis") for i in shown))
    return made


def add_row(made: Table, *cells: object) -> None:
    """A row of plain text (no Rich markup: values come from the API), each cell on one line."""
    made.add_row(*(Text(str(cell), no_wrap=True, overflow="ellipsis") for cell in cells))


def print_json(answer: Any) -> None:
    """The answer as indented JSON on stdout, untouched by Rich (no wrapping, no markup)."""
    typer.echo(json.dumps(answer, indent=2, ensure_ascii=False))
