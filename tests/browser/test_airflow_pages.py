"""The Airflow UI of a real deployment (PostgreSQL, api-server, scheduler, dag-processor) in
headless Chromium: one DAG run of three 2 x 2 steps (tests/browser/dags/torchstep_browser.py)
— one succeeds, one fails with a non-retryable error on rank 3, one hangs until its
``execution_timeout`` — and each task's Logs and XCom pages read as a user reads them.

What the pages show (checked here): the task log holds every line of every rank, prefixed
``[trainer/<rank>]``, nothing cut (a 3,000-character line is whole, though past the right edge
until Wrap is on: ``w``); the root cause is the log's last torchstep line; the XCom is the whole
step result, its first lines the state and the root cause's message; each rank's ``tail`` in
it is cut at 2,000 bytes per line (``… [line cut at 2000 bytes]``), the rest in the rank's
``log_file``; a step stopped by its timeout says where each rank was (rank 3 in ``load_batch``,
the others in ``all_reduce``) and where every thread's stack is (``stacks.txt``).
"""

from __future__ import annotations

import os
import re
import shutil
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from browser.pages import Browser, airflow_harness, where_ranks_were

# a deployment (or server) and a run of three 2 x 2 steps come first: minutes on a loaded machine
# one module, one deployment: `make unit` runs a module in one xdist worker (tests/conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

DAG = Path(__file__).resolve().parent / "dags" / "torchstep_browser.py"
LINES = 300  # dags/torchstep_browser.py: LINES
RANKS = range(4)


@pytest.fixture(scope="module")
def airflow(browser: Browser) -> Iterator[dict[str, Any]]:
    """The deployment and its finished run of ``torchstep_browser``."""
    harness = airflow_harness()
    if harness.postgres_bin() is None:
        if os.environ.get("CI"):
            pytest.fail("CI must run the browser tests: PostgreSQL is not installed (make system-deps)")
        pytest.skip("PostgreSQL is not installed (make system-deps installs it)")
    d = harness.Deployment()
    (d.home / "dags" / DAG.name).symlink_to(DAG)
    try:
        d.start()
        run = d.trigger("torchstep_browser", timeout=400)
        base = f"{d.url}/dags/torchstep_browser/runs/{urllib.parse.quote(run['dag_run_id'], safe='')}/tasks"
        yield {"deployment": d, "run": run, "tasks": base}
    finally:
        d.stop()
        shutil.rmtree(d.home, ignore_errors=True)


# -- reading the pages -------------------------------------------------------------------------
_ITEMS = """
const out = [];
for (const it of document.querySelectorAll('[data-testid^=virtualized-item-]')) {
  const ev = [...it.querySelectorAll('.event')].map(e => e.textContent).join('');
  out.push([Number(it.dataset.index), ev]);
}
return out;
"""
_SCROLLER = """
let el = document.querySelector('[data-testid^=virtualized-item-]').parentElement;
while (el && !(el.scrollHeight > el.clientHeight + 1 && /(auto|scroll)/.test(getComputedStyle(el).overflowY))) {
  el = el.parentElement;
}
return el;
"""


def open_log(browser: Browser, airflow: dict[str, Any], task: str, last: str) -> str:
    """Open the task's Logs page (it opens at the end) and wait for ``last``; the visible text."""
    browser.open(f"{airflow['tasks']}/{task}")
    return browser.wait_text(last)


def log_lines(browser: Browser, *, from_end: bool = False, until: tuple[str, ...] = ()) -> list[str]:
    """Lines of the open Logs page in order, read as they scroll past: the viewer renders only
    the lines in view. From the top to the end (every line), or from the end upwards until
    every string of ``until`` is among them."""
    box = browser.wait(lambda: browser.js(_SCROLLER), "the log viewer")
    seen: dict[int, str] = {}
    height, view = browser.js("return [arguments[0].scrollHeight, arguments[0].clientHeight]", box)
    step = max(1, int(view * 0.8))
    positions = list(range(0, height, step)) + [height]
    for top in reversed(positions) if from_end else positions:

        def rendered(top: int = top) -> list | None:
            browser.js("arguments[0].scrollTop = arguments[1]", box, top)  # again if the viewer moved it
            first = browser.js(_ITEMS)
            time.sleep(0.2)
            again = browser.js(_ITEMS)
            return again if again and again == first else None  # rendered and settled

        seen.update(dict(browser.wait(rendered, f"the log viewer to render the lines at {top} px", timeout=60)))
        if until and all(any(u in x for x in seen.values()) for u in until):
            break
    indices = sorted(seen)
    if not until:  # every line: no index may be missing
        missing = sorted(set(range(indices[0], indices[-1] + 1)) - set(indices))
        assert not missing, f"the log viewer never rendered lines {missing[:20]}"
    return [seen[i] for i in indices]


def xcom_text(browser: Browser, airflow: dict[str, Any], task: str) -> str:
    """The task's XCom page (Storage → XCom) with every value expanded: the value's rendered
    lines (the JSON viewer shows the first ~15 lines of the result, then scrolls)."""
    from selenium.webdriver.common.by import By

    browser.open(f"{airflow['tasks']}/{task}/xcom")
    browser.wait(
        lambda: browser.driver.find_elements(By.CSS_SELECTOR, "[data-testid=xcom-value] .view-lines"), "the XCom value"
    )
    browser.driver.find_element(By.CSS_SELECTOR, "[data-testid=expand-all-button]").click()
    text = browser.wait(
        lambda: (
            (t := browser.js("return document.querySelector('[data-testid=xcom-value] .view-lines').innerText"))
            and '"state"' in t
            and t
        ),
        "the expanded XCom value",
    )
    return str(text).replace("\u00a0", " ")


# -- the pages ---------------------------------------------------------------------------------
def test_the_failed_task_log_shows_every_rank_whole_and_the_root_cause_last(browser: Browser, airflow) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    root_cause = "root cause: rank 3 (trainer replica 1): NonRetryableError: rank 3: shard 3 is corrupt"
    open_log(browser, airflow, "fails_on_rank_3", root_cause)
    # the root-cause line runs past the right edge until the user turns Wrap on (w)
    width = "return [...document.querySelectorAll('[data-testid^=virtualized-item-]')].filter(i => i.textContent.includes(arguments[0])).map(i => [i.scrollWidth, i.getBoundingClientRect().height])"
    wide_px = browser.js(width, root_cause)[0][0]  # the torchstep line (Airflow's exception repeats it)
    viewport = browser.js("return document.querySelector('[data-testid^=virtualized-item-]').parentElement.clientWidth")
    ActionChains(browser.driver).send_keys("w").perform()
    browser.wait(lambda: browser.js(width, root_cause)[0][1] > 20, "the root-cause line to wrap")
    browser.screenshot("airflow-task-log-failed")
    assert wide_px > viewport, "the root-cause line fitted the page without Wrap: the docs say it does not"

    browser.driver.set_window_size(1400, 2000)  # fewer positions to read (taller: the renderer stalls under load)
    try:
        lines = log_lines(browser)
    finally:
        browser.driver.set_window_size(1400, 900)
    text = "\n".join(lines)
    for rank in RANKS:  # every line of every rank, in order, prefixed: nothing lost or cut
        numbered = [x for x in lines if x.startswith(f"[trainer/{rank}] rank {rank} of 4 line ")]
        assert numbered == [f"[trainer/{rank}] rank {rank} of 4 line {i} of {LINES}" for i in range(1, LINES + 1)]
        wide = next(x for x in lines if x.startswith(f"[trainer/{rank}] rank {rank} wide line "))
        assert wide.endswith(" end of the wide line") and len(wide) > 3000
    assert "[trainer/3] torchstep.errors.NonRetryableError: rank 3: shard 3 is corrupt: retrying cannot help" in lines
    # a peer whose all_reduce broke before its agent stopped it prints its own error, under its
    # prefix; one stopped first (rank 2 shares rank 3's agent) prints none, as under torchrun
    assert not [x for x in lines if x.startswith("RuntimeError: ")], "a rank's error line lost its prefix"
    torchstep_lines = [x for x in lines if x.startswith("torchstep: ")]
    assert root_cause in torchstep_lines[-1] and re.search(r"FAILED \(exit code \d+\)", torchstep_lines[-1])
    assert "(not retryable)" in text  # Airflow's exception line: the task is not retried


def test_the_failed_task_xcom_opens_on_the_state_and_the_root_cause(browser: Browser, airflow) -> None:
    text = xcom_text(browser, airflow, "fails_on_rank_3")
    browser.screenshot("airflow-xcom-failed")
    assert '"state": "FAILED"' in text
    # the message wraps in the viewer: compare without the line breaks
    flat = re.sub(r"\s+", " ", text)
    assert '"message": "NonRetryableError: rank 3: shard 3 is corrupt: retrying cannot help"' in flat
    # one try only: the attempt count a user looks for is on the first screen
    assert '"attempts": 1' in text


def test_the_timed_out_task_says_where_every_rank_was(browser: Browser, airflow) -> None:
    open_log(browser, airflow, "hangs", "torchstep: stopped:")
    browser.screenshot("airflow-task-log-timed-out")
    # the page opens on Airflow's AirflowTaskTimeout traceback: torchstep's lines are a little above
    lines = log_lines(browser, from_end=True, until=("Process timed out", "where the ranks were"))
    flat = re.sub(r"\s+", " ", "\n".join(lines))
    assert "Process timed out" in flat  # Airflow's own line for execution_timeout
    assert re.search(r"torchstep: stopped: ranks-hang-\w+ CANCELLED \(exit code 143\)", flat), flat[-3000:]
    # the stacks taken before the stop: the outlier by name, the others in the collective
    assert where_ranks_were(flat), flat[-3000:]
    assert "stacks.txt" in flat

    xcom = re.sub(r"\s+", " ", xcom_text(browser, airflow, "hangs"))
    assert '"state": "CANCELLED"' in xcom
    assert re.search(r'"message": "[^"]*rank 3 at ranks\.py:\d+ in load_batch', xcom), xcom


def test_the_succeeded_task_shows_its_outputs_and_where_each_rank_log_is(browser: Browser, airflow) -> None:
    text = open_log(browser, airflow, "succeeds", "succeeded (")  # the log opens at its end: the outcome
    assert re.search(r"torchstep: ranks-ok-\w+ succeeded \(\d+\.\d s, 0 restart\(s\)\)", text)
    xcom = re.sub(r"\s+", " ", xcom_text(browser, airflow, "succeeds"))
    browser.screenshot("airflow-xcom-succeeded")
    assert '"state": "SUCCEEDED"' in xcom
    assert '"outputs": { "rank_sum": 6, "world_size": 4 }' in xcom


def test_a_rank_tail_in_the_result_is_cut_and_says_where_the_rest_is(airflow) -> None:
    """What the XCom page's value holds further down (the same JSON, read through the API
    the page reads): each rank's tail keeps 2,000 bytes of a long line and names the cut; the
    whole line is in the rank's log file."""
    d, run = airflow["deployment"], airflow["run"]
    path = f"/api/v2/dags/torchstep_browser/dagRuns/{urllib.parse.quote(run['dag_run_id'], safe='')}"
    result = d.call("GET", f"{path}/taskInstances/hangs/xcomEntries/return_value?deserialize=true")["value"]
    ranks = [r for rep in result["replicas"] for r in rep["ranks"]]
    assert sorted(r["rank"] for r in ranks) == list(RANKS)
    for r in ranks:
        wide = next(x for x in r["tail"] if " wide line " in x)
        assert wide.endswith(" … [line cut at 2000 bytes]"), wide[-80:]
        assert r["log_file"].endswith(f"rank{r['rank']}.log")
        assert Path(r["log_file"]).read_text().count("end of the wide line") == 1
