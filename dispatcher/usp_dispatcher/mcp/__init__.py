"""The USP MCP binding: the scheduling tools over MCP (stdio and Streamable HTTP at ``/mcp``).

:mod:`.tools` is the tool table and its handlers (each a thin wrapper over the service function
its REST route calls), :mod:`.server` the SDK's low-level server around them, :mod:`.protocol`
the JSON-RPC errors, :mod:`.results` the dual-envelope results, :mod:`.stdio` the stdio transport
behind ``usp-webhooks mcp``. The HTTP mount and the live webhooks are in :mod:`.http` and
:mod:`.live`.
"""

from usp_dispatcher.mcp.server import build_server
from usp_dispatcher.mcp.tools import TOOLS, ToolSpec

__all__ = ["TOOLS", "ToolSpec", "build_server"]
