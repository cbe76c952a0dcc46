"""How ``--help`` names what an option takes: ``--url URL``, ``--since WHEN``, never ``<str>``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import typer.core

__all__ = ["LabelledGroup", "grouped"]

#: The value an option takes, by parameter name; any other is its name in capitals.
METAVARS: dict[str, str] = {
    "url": "URL",
    "api": "URL",
    "forward_to": "URL",
    "signature_agent": "URL",
    "profile": "URI",
    "token": "TOKEN",
    "since": "WHEN",
    "until": "WHEN",
    "limit": "N",
    "max_events": "N",
    "concurrency": "N",
    "subscription": "ID",
    "subject": "ID",
    "correlation": "ID",
    "event_type": "TYPE",
    "events": "PATTERN",
    "agent_key": "FILE",
    "label": "TEXT",
}


class LabelledGroup(typer.core.TyperGroup):
    """A command group whose commands' value options carry a metavar (Typer's help otherwise
    prints the Python type: ``--url <str>``)."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        for param in getattr(command, "params", ()):
            if param.metavar is not None or getattr(param, "is_flag", False):
                continue
            name = param.name or "value"
            if param.param_type_name == "option":
                param.metavar = METAVARS.get(name, name.upper())
            else:  # an argument is shown by its name already: no type after it
                param.metavar = name.upper()
                param.display_type_rich = _no_type
        return command


def _no_type(ctx: Any) -> None:
    return None


def grouped(names: Iterable[str]) -> str:
    """``names`` (``booking.confirmed``, ...) one family per line, for an epilog:

    >>> print(grouped(["booking.created", "booking.confirmed", "waitlist.joined"]))
    \b
      booking.   created, confirmed
      waitlist.  joined
    """
    families: dict[str, list[str]] = {}
    for name in names:
        family, _, rest = name.rpartition(".")
        families.setdefault(family + ".", []).append(rest)
    width = max(len(family) for family in families) + 2
    lines = [f"  {family:<{width}}{', '.join(rest)}".rstrip() for family, rest in families.items()]
    return "\b\n" + "\n".join(lines)
