"""What every string a client sends must be, on every surface (REST, MCP over HTTP and stdio):
free of NUL. Imports nothing of the web layer, so the stdio MCP server starts without FastAPI."""

from __future__ import annotations

from typing import Final

__all__ = ["NUL_REFUSED", "contains_nul"]

#: The human text of the refusal, over REST and MCP alike.
NUL_REFUSED: Final = "Strings may not contain the NUL character (U+0000)"


def contains_nul(value: object) -> bool:
    """Whether a NUL is in any string of ``value`` (parsed JSON: dict keys and values, lists).

    Iterative, so no nesting depth hides one.

    >>> contains_nul({"buyer": {"name": ["Al\\x00ice"]}}), contains_nul({"n": 1, "s": "ok"})
    (True, False)
    """
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return False
