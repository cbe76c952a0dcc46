"""The engine's tables, engines and sessions, its migrations, and retention. Imports nothing of
``usp_workers`` but settings."""
