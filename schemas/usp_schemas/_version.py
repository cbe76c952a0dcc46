"""The protocol version string, kept apart so every module can import it without cycles."""

from __future__ import annotations

from typing import Final, Literal

__all__ = ["USP_VERSION", "UspVersion"]

#: The only version value this contract accepts in an event envelope. A new protocol version can
#: change the shape of ``data``, so a receiver pinned to this one refuses others loudly instead of
#: mis-reading them.
UspVersion = Literal["2026-08-20"]

#: The USP protocol version this package describes.
USP_VERSION: Final[UspVersion] = "2026-08-20"
