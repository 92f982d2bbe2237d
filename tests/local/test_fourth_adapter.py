"""The fourth adapter of docs/contributing.md ("The adapter SDK") is real and short: run as
written against a toy orchestrator, its task has the component's typed parameters, is
planned once when it is defined (a call with other values once more), takes the plan's
retries and delays, runs each try through ``open_step`` (one app id and log directory per
try), stops retrying at a non-retryable failure, lets the orchestrator's kill stop every
process of the step, and publishes the rank-0 outputs where the orchestrator shows them —
in at most 40 lines, importing nothing from core but ``torchstep.adapter``."""

from __future__ import annotations

import inspect
import re
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest
from local_testlib import ROOT, pids_with
from plancount import count_plans
from torchstep import SpecError

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
    """A toy orchestrator: a task is a function whose signature it reads (names and types:
    a call with a value of another type is refused before anything runs); it runs the
    function once per try with a context (``toyflow.context()``: run and task ids, the try
    number, a log, a kill hook, the task's outputs), retrying when ``retry_if`` says so after
    the delays it was given."""

    def __init__(self) -> None:
        self.kills: list[Any] = []
        self.tasks: list[dict[str, Any]] = []
        self.outputs: dict[tuple[str, str], dict[str, Any]] = {}
        self._local = threading.local()

    def context(self) -> Any:
        return self._local.context

    def task(self, fn: Any, *, retries: int, delays: list[float], retry_if: Any) -> Any:
        sig = inspect.signature(fn)
        types_ = {name: p.annotation for name, p in sig.parameters.items()}
        self.tasks.append({"name": fn.__name__, "parameters": types_, "retries": retries, "delays": delays})

        def run(run_id: str = "run-1", log: list[str] | None = None, **values: Any) -> Any:
            bound = sig.bind(**values)
            bound.apply_defaults()  # the orchestrator passes every parameter
            for name, value in bound.arguments.items():
                if isinstance(types_[name], type) and not isinstance(value, types_[name]):
                    raise TypeError(f"{name}: expected {types_[name].__name__}, got {value!r}")
            outputs = self.outputs.setdefault((run_id, fn.__name__), {})
            for n in range(1, retries + 2):
                self._local.context = types.SimpleNamespace(
                    run_id=run_id,
                    task_id=fn.__name__,
                    try_number=n,
                    outputs=outputs,
                    log=(log if log is not None else []).append,
                    on_kill=self.kills.append,
                )
                try:
                    return fn(**bound.arguments)
                except Exception as e:
                    if n > retries or not retry_if(e):
                        raise
                    time.sleep(delays[n - 1])
            raise AssertionError("unreachable")

        return run


def example() -> str:
    """The python block of docs/contributing.md's "The adapter SDK"."""
    text = (ROOT / "docs" / "contributing.md").read_text()
    section = text[text.index("## The adapter SDK") :]
    (code,) = re.findall(r"```python\n(.*?)```", section[: section.index("\n## ", 5)], re.S)
    return code


def sketch(toyflow: ToyFlow) -> dict[str, Any]:
    """The example, executed as written."""
    namespace: dict[str, Any] = {"toyflow": toyflow, "__name__": "toyflow_adapter"}
    exec(compile(example(), "docs/contributing.md", "exec"), namespace)  # noqa: S102 - our own docs
    return namespace


def test_the_fourth_adapter_is_at_most_40_lines_on_the_adapter_sdk_only() -> None:
    code = example()
    assert len(code.strip().splitlines()) <= 40
    imports = re.findall(r"^(?:from|import) (\S+)", code, re.M)
    assert imports == ["torchstep.adapter"]


@pytest.mark.timeout(300)
def test_typed_parameters_plan_once_retries_and_published_outputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    toyflow = ToyFlow()
    adapter = sketch(toyflow)
    marker = tmp_path / "attempts"
    plans = count_plans(monkeypatch)
    task = adapter["toy_task"](FLAKY, marker=str(marker), fail_times=1, max_retries=2)
    assert plans == [("flaky", "local")]  # planned once, when the task was defined
    (spec,) = toyflow.tasks
    assert spec["name"] == "flaky" and spec["retries"] == 2 and spec["delays"] == [0.2, 0.2]  # the plan's, mapped
    assert spec["parameters"] == {"marker": str, "fail_times": int, "max_retries": int, "non_retryable": bool}
    with pytest.raises(TypeError, match="fail_times: expected int"):
        task(fail_times="one")  # the orchestrator's own type check, from the typed signature
    assert not marker.exists()

    lines: list[str] = []
    out = task(log=lines)
    assert out["state"] == "SUCCEEDED" and out["outputs"] == {"attempts": 2}
    assert marker.read_text().count("attempt") == 2  # try 1 failed, the orchestrator retried
    assert plans == [("flaky", "local")]  # the task's plan ran: no plan per try
    assert any("[flaky/0]" in line for line in lines)  # the ranks' lines reached the orchestrator's log
    assert len(toyflow.kills) == 2  # each try's step handed its cancel to the orchestrator
    assert toyflow.outputs["run-1", "flaky"] == {"attempts": 2, "state": "SUCCEEDED"}  # published

    marker.unlink()
    assert task(run_id="run-2", fail_times=0)["state"] == "SUCCEEDED"  # other values: one plan for the call
    assert plans == [("flaky", "local")] * 2 and marker.read_text().count("attempt") == 1
    assert toyflow.outputs["run-2", "flaky"] == {"attempts": 1, "state": "SUCCEEDED"}

    with pytest.raises(SpecError, match="the task sets retries=5"):
        adapter["toy_task"](FLAKY, marker=str(marker), max_retries=2, retries=5)  # a second retry layer


@pytest.mark.timeout(300)
def test_a_non_retryable_failure_is_not_retried_and_the_kill_stops_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leftovers: str
) -> None:
    from torchstep.adapter import StepFailed

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    toyflow = ToyFlow()
    adapter = sketch(toyflow)
    marker = tmp_path / "attempts"
    task = adapter["toy_task"](FLAKY, marker=str(marker), non_retryable=True, max_retries=3)
    with pytest.raises(StepFailed, match="bad input, retrying cannot help") as err:
        task()
    assert err.value.result.retryable is False and marker.read_text().count("attempt") == 1
    assert toyflow.outputs["run-1", "flaky"] == {"state": "FAILED"}  # a failed step's result is published too

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
    assert isinstance(box["error"], StepFailed) and box["error"].result.state == "CANCELLED"
    assert pids_with(no_leftovers) == []
