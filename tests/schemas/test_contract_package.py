"""The package as a whole: its public surface, its examples, and an import without side effects."""

from __future__ import annotations

import doctest
import importlib
import json
import subprocess
import sys

import pytest

import usp_schemas

MODULES = [
    "usp_schemas",
    "usp_schemas._event_id",
    "usp_schemas._events",
    "usp_schemas._jsonrpc",
    "usp_schemas._mcp",
    "usp_schemas._payloads",
    "usp_schemas.generate",
]


def test_every_exported_name_exists_and_is_documented() -> None:
    missing = [name for name in usp_schemas.__all__ if not hasattr(usp_schemas, name)]
    undocumented = [
        name
        for name in usp_schemas.__all__
        if callable(obj := getattr(usp_schemas, name)) and isinstance(obj, type) and not obj.__doc__
    ]

    assert missing == []
    assert undocumented == []
    assert len(set(usp_schemas.__all__)) == len(usp_schemas.__all__)


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_are_true(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)

    assert result.failed == 0


# Runs in a fresh interpreter and records what the import touches beyond loading code: Python's
# importer reads .py/.pyc/.so/.pth files and the stdlib zip, and pydantic scans installed
# distributions' metadata for its plugins on the first model. Anything else (a schema file, a
# config file, a socket, a child process) would be this package doing I/O at import.
_PROBE = r"""
import json, os, sys
CODE = (".py", ".pyc", ".so", ".pth", ".zip")
seen = []
def hook(event, args):
    if event == "open" and isinstance(args[0], str):
        path, mode = args[0], args[1] or "r"
        writes = any(flag in mode for flag in "wax+")
        loads_code = path.endswith(CODE) or "/__pycache__/" in path
        reads_metadata = ".dist-info" in path or os.path.isdir(path)
        if (writes and not path.endswith(".pyc")) or not (loads_code or reads_metadata):
            seen.append(f"open {path} {mode}")
    elif event.startswith(("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn")):
        seen.append(event)
sys.addaudithook(hook)
import usp_schemas
print(json.dumps(seen))
"""


def test_import_does_no_io() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True
    )

    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
