"""Access's tables: platforms' API keys, principals' bound profiles, agents' signature nonces."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Field

from usp_core.clock import UtcDateTime, utcnow
from usp_core.ids import new_id
from usp_dispatcher.tables import DispatcherTable

__all__ = ["ApiKeyRow", "NonceRow", "PrincipalProfileRow"]


class ApiKeyRow(DispatcherTable, table=True):
    """A platform's bearer API key. Only its SHA-256 is stored: a leaked database does not leak
    usable keys, and lookup by hash needs no constant-time loop over every key."""

    __tablename__ = "sched_api_keys"

    id: str = Field(default_factory=lambda: new_id("key"), primary_key=True, max_length=40)
    principal: str = Field(index=True, max_length=256, description="who the key authenticates")
    token_hash: str = Field(unique=True, max_length=64, description="hex SHA-256 of the key")
    label: str | None = Field(default=None, max_length=200)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)
    revoked_at: datetime | None = Field(default=None, sa_type=UtcDateTime)


class PrincipalProfileRow(DispatcherTable, table=True):
    """The first profile URI an authenticated principal presented (USP §10.1.6 identity
    binding): a later call by that principal naming another profile is refused (``forbidden``).
    Many principals may share one profile."""

    __tablename__ = "sched_principal_profiles"

    principal: str = Field(primary_key=True, max_length=256)
    profile: str = Field(index=True, max_length=2048)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)


class NonceRow(DispatcherTable, table=True):
    """A signature ``nonce`` seen from an agent's key, kept until a signature carrying it could no
    longer be accepted (``expires_at``): a second request with the same one is a replay."""

    __tablename__ = "access_nonces"

    key: str = Field(primary_key=True, max_length=64, description="hex SHA-256 of thumbprint and nonce")
    expires_at: datetime = Field(sa_type=UtcDateTime, index=True)
