"""A strict reader for the small YAML subset ``docker-compose.yml`` is written in.

Only for when PyYAML is not importable (it is not a dependency of this workspace). It reads block
mappings, block sequences, flow sequences of scalars, quoted and plain scalars, integers, booleans,
null and comments, and raises ``ValueError`` on everything else (anchors, aliases, tags, block
scalars, flow mappings, multi-document streams): it may refuse a valid file, but it cannot
silently read one differently from a real YAML parser.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["load"]

_KEY = re.compile(r"^([A-Za-z0-9_.-]+):(?:\s+(.*))?$")
_INT = re.compile(r"^[-+]?[0-9]+$")
_UNSUPPORTED_START = tuple("&*!|>{%@`")


@dataclass(frozen=True)
class _Line:
    number: int
    indent: int
    text: str


def load(text: str) -> Any:
    """Parse ``text``; ``ValueError`` (with the line number) outside the supported subset."""
    lines = _lines(text)
    if not lines:
        return None
    value, end = _block(lines, 0, lines[0].indent)
    if end != len(lines):
        raise ValueError(f"line {lines[end].number}: unexpected indentation")
    return value


def _lines(text: str) -> list[_Line]:
    lines: list[_Line] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise ValueError(f"line {number}: tab indentation")
        content = _strip_comment(raw).rstrip()
        if not content.strip():
            continue
        if content.strip() in ("---", "..."):
            raise ValueError(f"line {number}: document markers are not supported")
        lines.append(_Line(number, len(content) - len(content.lstrip()), content.strip()))
    return lines


def _strip_comment(line: str) -> str:
    """Cut a ``#`` comment that starts a line or follows whitespace, outside quotes."""
    quote: str | None = None
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _block(lines: list[_Line], i: int, indent: int) -> tuple[Any, int]:
    if lines[i].text == "-" or lines[i].text.startswith("- "):
        return _sequence(lines, i, indent)
    return _mapping(lines, i, indent)


def _mapping(lines: list[_Line], i: int, indent: int) -> tuple[dict[str, Any], int]:
    result: dict[str, Any] = {}
    while i < len(lines) and lines[i].indent == indent:
        line = lines[i]
        match = _KEY.match(line.text)
        if match is None:
            raise ValueError(f"line {line.number}: expected 'key: value'")
        key, rest = match.group(1), match.group(2)
        if key in result:
            raise ValueError(f"line {line.number}: duplicate key {key!r}")
        i += 1
        if rest:
            result[key] = _scalar_or_flow(rest, line.number)
        elif i < len(lines) and lines[i].indent > indent:
            result[key], i = _block(lines, i, lines[i].indent)
        elif i < len(lines) and lines[i].indent == indent and lines[i].text.startswith("- "):
            result[key], i = _sequence(lines, i, indent)  # a sequence may sit at its key's indent
        else:
            result[key] = None
    if i < len(lines) and lines[i].indent > indent:
        raise ValueError(f"line {lines[i].number}: unexpected indentation")
    return result, i


def _sequence(lines: list[_Line], i: int, indent: int) -> tuple[list[Any], int]:
    result: list[Any] = []
    while i < len(lines) and lines[i].indent == indent and lines[i].text.startswith("- "):
        line = lines[i]
        item = line.text[2:].strip()
        if _KEY.match(item):
            raise ValueError(f"line {line.number}: mappings inside sequences are not supported")
        result.append(_scalar_or_flow(item, line.number))
        i += 1
    return result, i


def _scalar_or_flow(text: str, number: int) -> Any:
    if text.startswith("["):
        if not text.endswith("]"):
            raise ValueError(f"line {number}: a flow sequence must close on its line")
        inner = text[1:-1].strip()
        return [_scalar(item.strip(), number) for item in _split_flow(inner, number)] if inner else []
    return _scalar(text, number)


def _split_flow(inner: str, number: int) -> list[str]:
    items: list[str] = []
    quote: str | None = None
    start = 0
    for i, char in enumerate(inner):
        if quote:
            if char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char in "[]{}":
            raise ValueError(f"line {number}: nested flow collections are not supported")
        elif char == ",":
            items.append(inner[start:i])
            start = i + 1
    if quote:
        raise ValueError(f"line {number}: unterminated quote")
    items.append(inner[start:])
    return items


def _scalar(text: str, number: int) -> Any:
    if text.startswith('"'):
        if len(text) < 2 or not text.endswith('"') or "\\" in text:
            raise ValueError(f"line {number}: only simple double-quoted strings are supported")
        return json.loads(text)
    if text.startswith("'"):
        if len(text) < 2 or not text.endswith("'"):
            raise ValueError(f"line {number}: unterminated single-quoted string")
        return text[1:-1].replace("''", "'")
    if text.startswith(_UNSUPPORTED_START) or text.startswith(("- ", "? ")) or ": " in text:
        raise ValueError(f"line {number}: unsupported YAML construct {text[:20]!r}")
    if _INT.match(text):
        return int(text)
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "~"):
        return None
    if re.match(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$", text) or lowered in (
        "yes",
        "no",
        "on",
        "off",
    ):
        raise ValueError(f"line {number}: quote {text!r}: YAML versions disagree on what it means")
    return text
