"""What the API (REST, MCP, console) reads beside :class:`usp_core.settings.CommonSettings`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr
from pydantic_settings import NoDecode

from usp_core.settings import COMMAS, CommonSettings

__all__ = ["ApiSettings"]


class ApiSettings(CommonSettings):
    """The API's (REST, MCP, console): who may call it and how it presents itself."""

    admin_token: SecretStr | None = Field(
        default=None, description="bearer token for admin endpoints; unset: admin endpoints refuse everyone"
    )
    public_base_url: str = Field(
        default="http://127.0.0.1:8000", description="the URL this service is reached at (for discovery)"
    )
    seed_demo_catalog: bool = Field(
        default=True,
        description="on first start (an empty catalog), add the demo services so there is something to book",
    )
    metrics_public: bool = Field(
        default=False,
        description="serve `GET /metrics` without the admin token (only on a private network)",
    )
    metrics_window_seconds: float = Field(
        default=300.0,
        gt=0,
        description="the attempt latency histogram on `/metrics` covers the attempts of this many last "
        "seconds",
    )
    require_authentication: bool = Field(
        default=True,
        description="privileged MCP tools refuse callers that did not authenticate (false: anonymous "
        "platforms may book, bound to their `_meta.usp.profile` only)",
    )
    auth_mechanisms: Annotated[
        tuple[Literal["bearer", "http_message_signatures", "booking_scoped_credential"], ...],
        NoDecode,
        COMMAS,
    ] = Field(
        default=("bearer", "http_message_signatures", "booking_scoped_credential"),
        description="authentication mechanisms offered to platforms, comma-separated (published in "
        "`/.well-known/usp`); the admin token is always accepted",
    )
    agent_signature_components: Annotated[tuple[str, ...], NoDecode, COMMAS] = Field(
        default=("@authority",),
        description="what an agent's Web Bot Auth signature must cover, comma-separated, besides "
        "`signature-agent` (when sent) and `content-digest` (when sent): the draft's minimum; add "
        "`@method,@path` to ask more",
    )
    booking_credential_ttl_seconds: int = Field(
        default=2_592_000, gt=0, description="lifetime of an issued `booking_scoped_credential` (30 days)"
    )
    mcp_session_idle_seconds: float = Field(
        default=300.0,
        gt=0,
        description="an MCP session with no request in flight for this long is closed and its memory "
        "freed (an open notification stream counts as a request); its client opens a new one",
    )
