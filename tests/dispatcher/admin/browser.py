"""Headless Chromium for the console and portal tests, and the screenshots they take.

``USP_CHROMIUM`` names the browser when it is not ``chromium`` on the PATH (``.ci/run`` installs
Debian's package). ``USP_UPDATE_SCREENSHOTS=1`` copies the screenshots the tests take into
``docs/`` (the README shows them).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

DOCS = Path(__file__).resolve().parents[3] / "docs"


def launched_chromium() -> Iterator[Browser]:
    executable = os.environ.get("USP_CHROMIUM") or shutil.which("chromium")
    if executable is None:
        pytest.fail("no Chromium: install Debian's package `chromium` (as .ci/run does) or set USP_CHROMIUM")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True)
        yield browser
        browser.close()


def screenshot(page: Page, name: str, tmp_path: Path) -> None:
    taken = tmp_path / name
    page.screenshot(path=str(taken), full_page=True)
    if os.environ.get("USP_UPDATE_SCREENSHOTS") == "1":
        shutil.copyfile(taken, DOCS / name)
