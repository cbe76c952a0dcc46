"""The few RESP2 frames the Redis dedupe line writes and reads (commands out; simple strings,
errors, integers and bulk strings back)."""

from __future__ import annotations

__all__ = ["ReplyError", "bulks", "pack", "parse"]


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


def parse(buffer: bytes, start: int = 0) -> tuple[bytes | int | ReplyError | None, int] | None:
    """The reply at ``start`` in ``buffer`` and where the next one starts; ``None`` while it is
    incomplete. An error reply is returned, not raised, so the caller can tell it from a broken
    stream (``ValueError``: a reply type the dedupe line never asks for)."""
    end = buffer.find(b"\r\n", start)
    if end < 0:
        return None
    kind, rest = buffer[start : start + 1], buffer[start + 1 : end]
    if kind == b"$":
        size = int(rest)
        if size < 0:
            return None, end + 2
        if len(buffer) < end + 2 + size + 2:
            return None
        return buffer[end + 2 : end + 2 + size], end + 2 + size + 2
    if kind == b":":
        return int(rest), end + 2
    if kind == b"+":
        return rest, end + 2
    if kind == b"-":
        return ReplyError(rest.decode(errors="replace")), end + 2
    raise ValueError(f"unexpected RESP reply type {kind!r}")
