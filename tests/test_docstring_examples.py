"""Every ``>>>`` example in the receiver's, the engine's and the dispatcher's docstrings is true."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import usp_dispatcher
import usp_receiver
import usp_workers

MODULES = sorted(
    info.name
    for package in (usp_receiver, usp_workers, usp_dispatcher)
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")
    if ".migrations" not in info.name
)


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_are_true(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)

    assert result.failed == 0
