"""The browser surfaces: the operator console (``/console``, :mod:`.pages`) and the platform
portal (``/portal``, :mod:`.portal`), server-rendered pages over the admin operations.

They call :mod:`usp_workers.operations` as ``/admin`` does (no query layer of their own); only
:mod:`usp_dispatcher.api.app` and the admin routes (portal links) import them.
"""

from usp_dispatcher.console import portal
from usp_dispatcher.console.pages import router
from usp_dispatcher.console.web import STATIC_PATH, static_files

__all__ = ["STATIC_PATH", "portal", "router", "static_files"]
