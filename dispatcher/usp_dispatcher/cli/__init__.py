"""The ``usp-webhooks`` command line: :mod:`.main` (the app, serving and key commands), :mod:`.admin`
and :mod:`.content` (operator commands over the admin API), :mod:`.access` (API keys, on the
database), :mod:`.config` and :mod:`.output` (what they share). It may import the whole dispatcher."""

from usp_dispatcher.cli.main import app, main

__all__ = ["app", "main"]
