"""What every process of the service needs, delivery engine and API alike: the common settings
(``settings``), database engines and sessions (``db``), the clock and ids (``clock``, ``ids``),
the business's signing keys (``keys``, ``keycache``), and outbound HTTP: the SSRF guard
(``ssrf``) and its pinned connection pool (``origin_pool``).
Its modules are entered directly; none imports the engine or the API.

Why it works this way: docs/architecture.md, "Four packages, one direction".
"""
