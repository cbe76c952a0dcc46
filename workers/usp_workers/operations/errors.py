"""What an operation refuses with: not found, a conflict, an invalid request
(the API maps each to its status).
"""

from __future__ import annotations


class OperationError(Exception):
    """A refusal with a stable ``reason`` code (never user input) and a human ``detail``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class NotFound(OperationError):
    """The event, subscription or job does not exist."""


class Conflict(OperationError):
    """The request contradicts the stored state (a disabled subscription, a deleted one, ...)."""


class InvalidRequest(OperationError):
    """The request is malformed (a cursor that is not ours, a time range that ends first)."""
