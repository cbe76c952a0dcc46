"""The browser surfaces: the operator console (``/console``, :mod:`.pages`) and the platform
portal (``/portal``, :mod:`.portal`), server-rendered pages over the admin operations.

They call :mod:`usp_workers.operations` as ``/admin`` does (no query layer of their own); only
:mod:`usp_dispatcher.app` and the admin routes (portal links) import them.
"""

from . import portal
from .pages import router
from .web import STATIC_PATH, static_files

__all__ = ["STATIC_PATH", "portal", "router", "static_files"]
