"""Lengths of time and retry waits as operators type them (``90m``, ``24h``, ``7d``; ``5, 30,
300``): the CLI's options and the console's forms read them the same way."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

__all__ = ["parse_duration", "parse_retry_schedule"]

_AGE = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_duration(text: str) -> timedelta | None:
    """``90m``, ``2h``, ``7d`` (or ``30s``) as a length of time; ``None`` for anything else.

    >>> parse_duration("90m"), parse_duration("soon")
    (datetime.timedelta(seconds=5400), None)
    """
    age = _AGE.match(text.strip())
    return None if age is None else timedelta(**{_UNITS[age.group(2)]: int(age.group(1))})


def parse_retry_schedule(delays: str | None, max_age: str | None) -> dict[str, Any] | None:
    """Retry waits in seconds (commas or spaces between them) and a maximum age, as the API takes
    a subscription's own schedule; ``None`` (no waits): the service's. ``ValueError`` says what
    is wrong (the API checks the bounds).

    >>> parse_retry_schedule("5, 30,300", "2h")
    {'delays': [5.0, 30.0, 300.0], 'max_age_seconds': 7200.0}
    """
    if delays is None or not delays.strip():
        if max_age is not None and max_age.strip():
            raise ValueError("a maximum age goes with retry waits")
        return None
    try:
        waits = [float(part) for part in delays.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"retry waits {delays[:80]!r} are not seconds (5,30,300)") from None
    age = None
    if max_age is not None and max_age.strip():
        length = parse_duration(max_age)
        if length is None:
            raise ValueError(f"maximum age {max_age!r} is not a duration such as 90m, 24h or 7d")
        age = length.total_seconds()
    return {"delays": waits, "max_age_seconds": age}
