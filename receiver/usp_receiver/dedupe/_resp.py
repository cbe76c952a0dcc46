"""The few RESP2 frames the Redis dedupe line writes and reads (commands out; simple strings,
errors, integers and bulk strings back)."""

from __future__ import annotations

import asyncio

__all__ = ["ReplyError", "bulks", "pack", "read_reply"]


class ReplyError(Exception):
    """An error reply (``-ERR …``, ``-NOSCRIPT …``): the stream stays in step."""

    @property
    def no_script(self) -> bool:
        return str(self).startswith("NOSCRIPT")


def pack(*args: str | int | bytes) -> bytes:
    """A command frame."""
    return b"*%d\r\n%s" % (len(args), bulks(*args))


def bulks(*args: str | int | bytes) -> bytes:
    """The arguments of a command frame, without its "*N" header."""
    parts = []
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


async def read_reply(reader: asyncio.StreamReader) -> bytes | int | ReplyError | None:
    """One reply; an error reply is returned, not raised, so the caller can tell it from a broken
    stream (which raises: ``IncompleteReadError``, ``ConnectionError``, ``ValueError``)."""
    line = await reader.readuntil(b"\r\n")
    kind, rest = line[:1], line[1:-2]
    if kind == b"$":
        size = int(rest)
        return None if size < 0 else (await reader.readexactly(size + 2))[:-2]
    if kind == b":":
        return int(rest)
    if kind == b"+":
        return rest
    if kind == b"-":
        return ReplyError(rest.decode(errors="replace"))
    raise ValueError(f"unexpected RESP reply type {kind!r}")
