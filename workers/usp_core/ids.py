"""Ids of stored things: a prefix and a time-ordered suffix, so they sort by creation."""

from __future__ import annotations

from usp_schemas import new_event_id

__all__ = ["new_id"]


def new_id(prefix: str) -> str:
    """A time-ordered id such as ``sub_019a...`` (the UUIDv7 layout of event ids)."""
    return f"{prefix}_{new_event_id().removeprefix('evt_')}"
