"""Lengths of time as operators type them (``90m``, ``24h``, ``7d``): the CLI's options and the
console's forms read them the same way."""

from __future__ import annotations

import re
from datetime import timedelta

__all__ = ["parse_duration"]

_AGE = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_duration(text: str) -> timedelta | None:
    """``90m``, ``2h``, ``7d`` (or ``30s``) as a length of time; ``None`` for anything else.

    >>> parse_duration("90m"), parse_duration("soon")
    (datetime.timedelta(seconds=5400), None)
    """
    age = _AGE.match(text.strip())
    return None if age is None else timedelta(**{_UNITS[age.group(2)]: int(age.group(1))})
