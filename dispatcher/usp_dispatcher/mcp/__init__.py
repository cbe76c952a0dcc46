"""The USP MCP binding: the scheduling tools over MCP (stdio and Streamable HTTP at ``/mcp``).

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.mcp``.
"""

from usp_dispatcher.mcp.server import build_server
from usp_dispatcher.mcp.tools import TOOLS, ToolSpec

__all__ = ["TOOLS", "ToolSpec", "build_server"]
