"""The base every wire model shares: optional fields that are unknown are left out, not sent as ``null``.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_schemas._base``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

__all__ = ["WireModel", "always_sent"]


class WireModel(BaseModel):
    """Base of the payload and envelope models: tolerant of unknown fields, terse on output."""

    # Forward compatibility: a business may add fields in a minor release; receivers keep them
    # (and re-serialize them) instead of failing. Models that must refuse extras override this.
    model_config = ConfigDict(extra="allow")

    @model_serializer(mode="wrap")
    def _omit_unknown_optionals(self, handler: SerializerFunctionWrapHandler) -> Any:
        dumped = handler(self)
        if isinstance(dumped, dict):
            for name, field in type(self).model_fields.items():
                if name in dumped and dumped[name] is None and field.default is None:
                    del dumped[name]
        return dumped


def always_sent(*names: str) -> Callable[[dict[str, Any]], None]:
    """A ``json_schema_extra`` hook listing defaulted fields as required in the JSON Schema.

    Fields such as ``jsonrpc`` or ``event`` have defaults so Python callers need not repeat them,
    which makes pydantic call them optional; on the wire they are always present, and the
    published schema must say so.
    """

    def mark_required(schema: dict[str, Any]) -> None:
        required: list[str] = schema.setdefault("required", [])
        required[:0] = [name for name in names if name not in required]

    return mark_required
