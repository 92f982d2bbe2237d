"""app_task / @torchstep_task in real Prefect flows (one test harness per session): flow
parameters reaching the component, results passed along a prepare → train (2 replicas × 2
processes, gloo) → evaluate flow, retries from the AppDef (exactly once; never for a
non-retryable failure), a timeout that leaves no process behind, the artifacts' rows."""

# No `from __future__ import annotations`: Prefect reads the flows' annotations.
import json
import tempfile
import threading
import uuid
from pathlib import Path

import pytest
from proclib import procs_with_env, wait_for
from torchstep import SpecError

pytest.importorskip("prefect")
from prefect import flow  # noqa: E402
from prefect.artifacts import Artifact  # noqa: E402
from torchstep_prefect import StepFailed, app_task, torchstep_task  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STEPS = ROOT / "tests" / "apps" / "steps.py"
ECHO, FLAKY, SLEEPER = (f"{STEPS}:{name}" for name in ("echo", "flaky", "sleeper"))
#: The canary an injected shell would create: unique to this session, so a file some other
#: run on the machine left in the shared temporary directory is never taken for ours.
PWNED = Path(tempfile.gettempdir()) / f"torchstep-pwned-{uuid.uuid4().hex[:12]}"
TEXT = "{{ params.lr }} $(touch " + str(PWNED) + ") `id` ; python3"

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture(autouse=True)
def private_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def test_task_parameters_are_the_component_parameters_with_their_types() -> None:
    from prefect.utilities.callables import parameter_schema

    echo = app_task(ECHO)
    props = parameter_schema(echo.fn).properties  # what the Prefect UI shows
    assert {k: props[k].get("type") for k in ("lr", "epochs", "name", "debug")} == {
        "lr": "number",
        "epochs": "integer",
        "name": "string",
        "debug": "boolean",
    }
    assert props["lr"]["default"] == 0.1 and echo.name == "echo"
    assert props["tags"]["anyOf"][0]["type"] == "array" and props["lr"]["description"] == "learning rate"


def test_flow_parameters_reach_the_component_and_the_artifacts_show_the_step() -> None:
    echo = app_task(ECHO, name="echo-step")

    @flow
    def pipeline(lr: float, name: str) -> dict:
        return echo(lr=lr, name=name, tags=["a b", "c"], extra={"k": "v w"}, debug=True)

    result = pipeline(lr=0.7, name=TEXT)
    assert result["state"] == "SUCCEEDED"
    out = result["outputs"]
    assert out["lr"] == 0.7 and out["name"] == TEXT and out["tags"] == ["a b", "c"] and out["extra"] == {"k": "v w"}
    assert not PWNED.exists()
    ranks = Artifact.get("echo-step-ranks")
    rows = json.loads(ranks.data) if isinstance(ranks.data, str) else ranks.data
    assert [(r["role"], r["replica"], r["rank"], r["state"], r["exit_code"]) for r in rows] == [
        ("echo", 0, 0, "SUCCEEDED", 0)
    ]
    assert rows[0]["log"].endswith("rank0.log") and rows[0]["restarts"] == 0
    outputs = Artifact.get("echo-step-outputs")
    assert "SUCCEEDED" in outputs.data and "`lr`" in outputs.data and "0.7" in outputs.data


def test_the_example_flow_passes_results_along_with_two_replicas_of_two_processes() -> None:
    """dags/prefect/train_flow.py: prepare → train (2 replicas × 2 processes, gloo) → evaluate."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_flow", ROOT / "dags" / "prefect" / "train_flow.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    state = example.train_flow(steps=20, return_state=True)
    assert state.is_completed()
    loss = state.result()
    assert 0 <= loss < 1
    rows = Artifact.get("train-ranks").data
    rows = json.loads(rows) if isinstance(rows, str) else rows
    assert sorted((r["replica"], r["rank"]) for r in rows) == [(0, 0), (0, 1), (1, 2), (1, 3)]
    assert {r["state"] for r in rows} == {"SUCCEEDED"}


def test_a_failure_is_retried_by_prefect_exactly_once(tmp_path: Path) -> None:
    flaky = app_task(FLAKY, defaults={"marker": "", "max_retries": 1})
    assert flaky.retries == 1 and flaky.retry_delay_seconds == [0.2]  # from the AppDef

    @flow
    def pipeline(marker: str) -> dict:
        return flaky(marker=marker, fail_times=1)

    marker = tmp_path / "attempts"
    result = pipeline(marker=str(marker))
    assert result["state"] == "SUCCEEDED" and result["outputs"] == {"attempts": 2}
    assert marker.read_text().count("attempt") == 2


def test_a_non_retryable_failure_is_not_retried(tmp_path: Path) -> None:
    flaky = app_task(FLAKY, defaults={"marker": "", "max_retries": 3})
    assert flaky.retries == 3

    @flow
    def pipeline(marker: str) -> dict:
        return flaky(marker=marker, non_retryable=True)

    marker = tmp_path / "attempts"
    with pytest.raises(StepFailed) as e:
        pipeline(marker=str(marker))
    assert e.value.retryable is False and e.value.result["exit_code"] == 82
    assert "retrying cannot help" in str(e.value)
    assert marker.read_text().count("attempt") == 1


def test_step_failed_names_the_root_cause_by_its_last_meaningful_line(tmp_path: Path) -> None:
    """A missing script: StepFailed says python's "can't open file", not "exited with code 2"."""
    missing = app_task(f"{STEPS}:missing_script", defaults={"path": ""})

    @flow
    def pipeline(path: str) -> dict:
        return missing(path=path)

    with pytest.raises(StepFailed) as e:
        pipeline(path=str(tmp_path / "missing.py"))
    text = str(e.value)
    assert "FAILED (exit code 2); root cause: rank 0 (trainer replica 0): " in text
    assert f"can't open file '{tmp_path / 'missing.py'}'" in text


def test_a_task_timeout_stops_every_process_and_the_run_ends_timed_out() -> None:
    mark = f"prefect-timeout-{uuid.uuid4().hex[:8]}"
    # long enough for both replicas to start all their processes on a loaded 2-core machine
    # (10 s was not, with load average 15)
    sleeper = app_task(SLEEPER, defaults={"mark": mark}, timeout_seconds=25)

    @flow
    def pipeline() -> str:
        return sleeper(mark=mark, replicas=2, return_state=True).name

    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:  # the step really ran: count its processes while the flow waits
        while not stop.wait(0.1):
            seen.append(len(procs_with_env(f"TORCHSTEP_TEST_MARK={mark}")))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        assert pipeline() == "TimedOut"
    finally:
        stop.set()
        watcher.join()
    assert max(seen) >= 6  # per replica: the worker, its child and its double-forked daemon
    wait_for(lambda: not procs_with_env(f"TORCHSTEP_TEST_MARK={mark}"), 30, "every process of the step to end")


def test_retries_that_contradict_the_appdef_are_refused_with_the_fix() -> None:
    with pytest.raises(SpecError) as e:
        app_task(FLAKY, defaults={"marker": "", "max_retries": 1}, retries=5)
    assert "max_retries" in e.value.field and e.value.fix


def test_the_decorator_form_makes_a_task_of_a_component_function() -> None:
    from torchx import specs

    @torchstep_task(name="hello")
    def hello(msg: str = "hi") -> specs.AppDef:
        """Say hello.

        Args:
            msg: what to say
        """
        return specs.AppDef("hello", roles=[specs.Role("hello", image="python:3.11", entrypoint="echo", args=[msg])])

    from prefect.utilities.callables import parameter_schema

    assert hello.name == "hello" and "msg" in parameter_schema(hello.fn).properties

    @flow
    def pipeline() -> str:
        return hello(msg="hello there")["state"]

    assert pipeline() == "SUCCEEDED"


def test_a_timeout_of_a_submitted_task_stops_the_step_too() -> None:
    """In a worker thread (``.submit()``) Prefect cannot interrupt blocking code: the task
    stops the step itself when the time is up, and ends TimedOut."""
    mark = f"prefect-submit-timeout-{uuid.uuid4().hex[:8]}"
    sleeper = app_task(SLEEPER, defaults={"mark": mark}, timeout_seconds=4)

    @flow
    def pipeline() -> str:
        future = sleeper.submit(mark=mark)
        return future.wait(120) or future.state.name

    assert pipeline() == "TimedOut"
    wait_for(lambda: not procs_with_env(f"TORCHSTEP_TEST_MARK={mark}"), 30, "every process of the step to end")
