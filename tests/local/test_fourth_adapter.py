"""The sketch of a fourth adapter in docs/contributing.md ("The seam") is real: run as
written against a toy orchestrator, it plans once when the task is defined, maps the
plan's retries and delays to the orchestrator, runs each try through ``open_step`` (one
app id and log directory per try), stops retrying at a non-retryable failure, and lets the
orchestrator's kill stop every process of the step."""

from __future__ import annotations

import re
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torchstep
from local_testlib import ROOT, pids_with

APPS = ROOT / "tests" / "apps"
FLAKY = f"{APPS / 'steps.py'}:flaky"
SLEEPER = """
import sys
from torchx import specs


def sleeper() -> specs.AppDef:
    code = "import time; print('sleeping', flush=True); time.sleep(600)"
    return specs.AppDef("sleeper", roles=[specs.Role("w", image="x", entrypoint=sys.executable, args=["-c", code])])
"""


class ToyFlow:
    """A toy orchestrator: a task runs its body once per try with a context (run and task
    ids, the try number, a log, a kill hook); it retries when ``retry_if`` says so, waiting
    the delays it was given."""

    def __init__(self) -> None:
        self.kills: list[Any] = []
        self.tasks: list[dict[str, Any]] = []

    def task(self, body: Any, *, name: str, retries: int, delays: list[float], retry_if: Any) -> Any:
        self.tasks.append({"name": name, "retries": retries, "delays": delays})

        def run(run_id: str = "run-1", log: list[str] | None = None) -> Any:
            for n in range(1, retries + 2):
                context = types.SimpleNamespace(run_id=run_id, task_id=name, try_number=n,
                                                log=(log if log is not None else []).append,
                                                on_kill=self.kills.append)  # fmt: skip
                try:
                    return body(context)
                except Exception as e:
                    if n > retries or not retry_if(e):
                        raise
                    time.sleep(delays[n - 1])
            raise AssertionError("unreachable")

        return run


def sketch(toyflow: ToyFlow) -> dict[str, Any]:
    """The python block of docs/contributing.md's "The seam", executed as written."""
    text = (ROOT / "docs" / "contributing.md").read_text()
    section = text[text.index("## The seam") :]
    (code,) = re.findall(r"```python\n(.*?)```", section[: section.index("\n## ", 5)], re.S)
    namespace: dict[str, Any] = {"toyflow": toyflow, "__name__": "toyflow_adapter"}
    exec(compile(code, "docs/contributing.md", "exec"), namespace)  # noqa: S102 - our own docs
    return namespace


@pytest.mark.timeout(300)
def test_the_fourth_adapter_of_the_docs_runs_each_try_through_the_seam(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    toyflow = ToyFlow()
    adapter = sketch(toyflow)
    marker = tmp_path / "attempts"
    task = adapter["toy_task"](FLAKY, marker=str(marker), fail_times=1, max_retries=2)
    assert toyflow.tasks == [{"name": "flaky", "retries": 2, "delays": [0.2, 0.2]}]  # the plan's, mapped
    lines: list[str] = []
    out = task(log=lines)
    assert out["state"] == "SUCCEEDED" and out["outputs"] == {"attempts": 2}
    assert marker.read_text().count("attempt") == 2  # try 1 failed, the orchestrator retried
    assert any("[flaky/0]" in line for line in lines)  # the ranks' lines reached the orchestrator's log
    assert len(toyflow.kills) == 2  # each try's step handed its cancel to the orchestrator

    with pytest.raises(torchstep.SpecError, match="the task sets retries=5"):
        adapter["toy_task"](FLAKY, marker=str(marker), max_retries=2, retries=5)  # a second retry layer


@pytest.mark.timeout(300)
def test_a_non_retryable_failure_is_not_retried_and_the_kill_stops_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leftovers: str
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    toyflow = ToyFlow()
    adapter = sketch(toyflow)
    marker = tmp_path / "attempts"
    task = adapter["toy_task"](FLAKY, marker=str(marker), non_retryable=True, max_retries=3)
    with pytest.raises(adapter["StepFailed"]) as err:
        task()
    assert err.value.result.retryable is False and marker.read_text().count("attempt") == 1

    component = tmp_path / "sleep.py"
    component.write_text(SLEEPER)
    slow = adapter["toy_task"](f"{component}:sleeper", cfg={"grace_period": 5})
    box: dict[str, BaseException] = {}
    lines: list[str] = []

    def run() -> None:
        try:
            slow(log=lines)
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 120
    while not any("sleeping" in line for line in list(lines)) and time.monotonic() < deadline:
        time.sleep(0.05)
    toyflow.kills[-1]()  # the orchestrator kills the task
    t.join(60)
    assert not t.is_alive()
    assert box["error"].result.state == "CANCELLED"  # type: ignore[attr-defined]
    assert pids_with(no_leftovers) == []
