"""Helpers of the browser tests (issue 37 §2): what a user sees of a torchstep step on the orchestrators'
own pages — the real Airflow api-server's UI and the real Prefect server's UI — in headless
Chromium (Debian's ``chromium`` and ``chromium-driver``, which ``make system-deps`` installs)
driven by Selenium; kfp.local has no UI, so its printed output gets the same checks.

Where Chromium, its driver or Selenium is missing the tests skip and say which; under CI
(``CI`` set, as ``.ci/run`` does) that skip is a failure instead, so a CI machine without the
browser never passes silently.

Screenshots go under each module's temporary directory; with ``TORCHSTEP_BROWSER_SHOTS=DIR``
they are also copied to DIR (how docs/img/ got its pictures).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def require_browser() -> None:
    """Skip (fail under CI) when headless Chromium cannot be driven here."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if importlib.util.find_spec("selenium") is None:
        missing.append("the selenium package (requirements/dev.lock)")
    if not missing:
        return
    why = f"no {', '.join(missing)} (make system-deps installs chromium and chromium-driver)"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the browser tests: {why}")
    pytest.skip(why)


def airflow_harness() -> Any:
    """tests/airflow/conftest.py as a module: its :class:`Deployment` (PostgreSQL, api-server,
    scheduler, dag-processor), without a second copy of that harness here."""
    spec = importlib.util.spec_from_file_location("_torchstep_airflow_harness", HERE.parent / "airflow" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def where_ranks_were(text: str) -> bool:
    """The stacks' summary names the outlier, rank 3 in ``load_batch``, and accounts for its
    peers: waiting in ``all_reduce``, or (on a loaded machine) still on their way there, at
    the line of torch they were in, or too slow to answer: said to have given no stack."""
    if not re.search(r"rank 3 at ranks\.py:\d+ in load_batch", text):
        return False
    peers = re.findall(
        r"ranks? ([0-2](?:[-, ]+[0-2])*) (?:waiting in all_reduce|gave no stack|at [\w./-]+:\d+ in \w+)", text
    )
    named = {int(r) for group in peers for r in re.findall(r"\d", group.replace("0-2", "0 1 2"))}
    return named == {0, 1, 2}


class Browser:
    """One headless Chromium; pages are read the way a user reads them (what is rendered)."""

    def __init__(self, shots: Path) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in (
            "--headless=new",
            "--no-sandbox",
            "--disable-dev-shm-usage",
            "--disable-gpu",
            "--window-size=1400,900",
        ):
            options.add_argument(arg)
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        self.driver.set_page_load_timeout(180)
        self.shots = shots
        shots.mkdir(parents=True, exist_ok=True)

    def open(self, url: str) -> None:
        self.driver.get(url)

    def text(self) -> str:
        """The page's visible text."""
        from selenium.webdriver.common.by import By

        return str(self.driver.find_element(By.TAG_NAME, "body").text)

    def wait(self, cond: Callable[[], Any], what: str, timeout: float = 180) -> Any:
        """Poll ``cond`` until it returns something true; a clear failure (and a screenshot)
        after ``timeout`` seconds. Generous: a page on a loaded 2-core machine takes tens of seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = cond()
            except Exception:  # a node re-rendered under us (stale element): try again
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                shot = self.screenshot(f"timeout-{int(time.time())}")
                raise AssertionError(f"timed out after {timeout} s waiting for {what} (screenshot {shot})")
            time.sleep(0.25)

    def wait_text(self, needle: str, timeout: float = 180) -> str:
        """Wait until ``needle`` is among the page's visible text; the text."""

        def found() -> str | None:
            text = self.text()
            return text if needle in text else None

        return str(self.wait(found, f"{needle!r} on the page", timeout))

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def screenshot(self, name: str, height: int | None = None) -> Path:
        """Save the viewport as ``<name>.png`` (also into ``$TORCHSTEP_BROWSER_SHOTS``)."""
        if height:
            self.driver.set_window_size(1400, height)
            time.sleep(0.5)
        path = self.shots / f"{name}.png"
        self.driver.save_screenshot(str(path))
        if os.environ.get("TORCHSTEP_BROWSER_SHOTS"):
            keep = Path(os.environ["TORCHSTEP_BROWSER_SHOTS"])
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, keep / path.name)
        return path

    def close(self) -> None:
        self.driver.quit()
