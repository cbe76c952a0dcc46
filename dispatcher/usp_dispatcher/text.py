"""What every string a client sends must be, on every surface (REST, MCP over HTTP and stdio):
free of NUL; how deep its JSON may nest; and how a refused argument is described. Imports nothing
of the web layer, so the stdio MCP server starts without FastAPI."""

from __future__ import annotations

import re
from typing import Final

from pydantic import ValidationError

__all__ = [
    "MAX_JSON_DEPTH",
    "NUL_REFUSED",
    "TOO_DEEP",
    "contains_nul",
    "json_too_deep",
    "shown_part",
    "validation_text",
]

#: The deepest JSON any surface takes: no real message comes near (an event nests about 5 levels,
#: a tool call about 8); a parser fed 100,000 levels exhausts the stack (RecursionError, or a
#: crashed process when the C parser runs out of a thread's stack).
MAX_JSON_DEPTH: Final = 64
#: The human text of the refusal.
TOO_DEEP: Final = f"The JSON is nested deeper than {MAX_JSON_DEPTH} levels"
_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")

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


def json_too_deep(text: bytes | str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON in ``text`` nests arrays and objects more than ``limit`` deep (brackets in
    strings do not count), found without parsing it: what a parser must not be given.

    Measured against parsing: a 1 MiB body is judged in about a millisecond when its brackets
    are fewer than ``limit`` (two ``bytes.count``), otherwise in one pass of its brackets.

    >>> json_too_deep(b"[" * 65 + b"]" * 65), json_too_deep('{"a": [1, "[[[[["]}', limit=2)
    (True, False)
    """
    raw = text.encode() if isinstance(text, str) else text
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    depth = 0
    for byte in _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS):
        if byte in b"[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def validation_text(exc: ValidationError, *, limit: int = 5) -> str:
    """The argument errors as text: where and what, never the rejected input (it can be anything,
    e.g. a credential pasted into the wrong field).

    >>> from pydantic import BaseModel
    >>> class M(BaseModel):
    ...     n: int
    >>> try:
    ...     M.model_validate({})
    ... except ValidationError as exc:
    ...     print(validation_text(exc))
    n: Field required
    """
    parts = []
    for error in exc.errors(include_input=False, include_url=False)[:limit]:
        where = ".".join(shown_part(part) for part in error["loc"]) or "arguments"
        parts.append(f"{where}: {error['msg']}")
    more = len(exc.errors()) - limit
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)


def shown_part(part: str | int) -> str:
    """A location part as shown: an argument's name is input too (a line separator in it breaks
    line-based readers; a pasted credential must not come back), so only short printable ones."""
    text = str(part)
    return text if len(text) <= 64 and text.isprintable() else "<argument>"
