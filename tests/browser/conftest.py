"""Fixtures of the browser tests: one headless Chromium per module (see :mod:`browser.pages`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from browser.pages import Browser, require_browser


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    """A headless Chromium for the module; screenshots under its temporary directory."""
    require_browser()
    b = Browser(tmp_path_factory.mktemp("screenshots"))
    try:
        yield b
    finally:
        b.close()
