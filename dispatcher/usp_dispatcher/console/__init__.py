"""The operator console at ``/console``: server-rendered pages over the admin operations.

It calls :mod:`usp_workers.operations` as ``/admin`` does (no query layer of its own) and is
imported only by :mod:`usp_dispatcher.app`.
"""

from .pages import STATIC_PATH, router, static_files

__all__ = ["STATIC_PATH", "router", "static_files"]
