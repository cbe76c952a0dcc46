"""Benchmark scripts (run each as ``uv run python bench/<name>.py``). A package only so that the
type checker names them ``bench.*``: ``bench/mcp.py`` would otherwise be the module ``mcp`` and
shadow the MCP SDK for the whole project."""
