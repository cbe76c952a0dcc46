"""The packages' doors: the service enters the delivery engine through ``usp_workers`` itself, which
loads each name on first use, and a UCAP content read needs nothing of the engine."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys

import pytest

import usp_workers


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    shown = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys\nprint('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(shown.split())


def test_the_front_door_names_every_export_and_each_is_what_its_module_holds() -> None:
    exports = usp_workers._EXPORTS
    assert sorted(usp_workers.__all__) == sorted(exports)
    for name, (module, attribute) in exports.items():
        loaded = importlib.import_module(module)
        expected = loaded if attribute is None else getattr(loaded, attribute)
        assert getattr(usp_workers, name) is expected, name


def test_what_type_checkers_see_is_what_the_door_loads() -> None:
    """The ``TYPE_CHECKING`` imports (for mypy) name the same objects, from the same modules, as
    the table ``__getattr__`` loads from: the two lists cannot drift apart."""
    seen: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(ast.parse(inspect.getsource(usp_workers))):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom)
                assert statement.module is not None
                for alias in statement.names:
                    value = getattr(importlib.import_module(statement.module), alias.name)
                    where = (
                        (value.__name__, None) if inspect.ismodule(value) else (statement.module, alias.name)
                    )
                    seen[alias.asname or alias.name] = where
    assert seen == usp_workers._EXPORTS


def test_a_name_it_does_not_export_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="deliver_batch"):
        getattr(usp_workers, "deliver_batch")  # noqa: B009


def test_taking_one_name_loads_only_its_module() -> None:
    loaded = _modules_after("from usp_workers import emit")
    assert "usp_workers.engine.outbox" in loaded
    assert not {"celery", "usp_workers.runtime.tasks", "usp_workers.engine.delivery"} & loaded


def test_a_ucap_read_imports_nothing_of_the_delivery_engine() -> None:
    """What a content read runs: the catalog (search, lookup, content), the agent's signature and
    nonce checks, and the API's settings."""
    loaded = _modules_after(
        "import usp_dispatcher.ucap.catalog, usp_dispatcher.ucap.agents, usp_dispatcher.access.signatures,"
        " usp_dispatcher.access.nonces, usp_dispatcher.settings"
    )
    assert "usp_dispatcher.ucap.catalog" in loaded
    assert not {m for m in loaded if m == "usp_workers" or m.startswith("usp_workers.")}
