"""The engine's tables, its migrations, and retention. Imports nothing of ``usp_workers`` but
settings."""
