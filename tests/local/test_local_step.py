"""torchstep.steps.local: LocalStep, one try of a local plan (real processes, real gloo groups)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest
import torchstep
from local_testlib import pids_with, role
from proclib import wait_for
from torchstep.steps import LocalStep, step_run_id
from torchx import specs


def app_of(*roles: specs.Role) -> specs.AppDef:
    return specs.AppDef("steps", roles=list(roles))


@pytest.mark.timeout(300)
def test_local_step_runs_two_processes_and_hands_every_rank_line_to_the_callback(tmp_path: Path, log_dir: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    lines: list[str] = []
    step = LocalStep(
        torchstep.build_plan(app_of(role("trainer", ["report", str(out)], replicas=1, nproc=2)), "local"),
        run_id=step_run_id("dag", "train", "manual__2026", 1),
        cfg={"log_dir": str(log_dir)},
        on_line=lines.append,
    )
    result = step.run()
    assert result.state == "SUCCEEDED", result.message
    assert result.app_id.startswith("steps-")  # the app's name and a hash of the run id
    text = "\n".join(lines)
    assert "hello from trainer rank 0 of 2" in text and "hello from trainer rank 1 of 2" in text
    assert step.result is result
    assert (log_dir / result.app_id / "result.json").is_file()


@pytest.mark.timeout(300)
def test_cancel_from_another_thread_stops_every_process(log_dir: Path, no_leftovers: str) -> None:
    lines: list[str] = []
    step = LocalStep(
        torchstep.build_plan(app_of(role("trainer", ["loop", "100000", "0.05"], replicas=1, nproc=2)), "local"),
        run_id=step_run_id("flow", "task-cancel"),
        cfg={"log_dir": str(log_dir), "grace_period": 5},
        on_line=lines.append,
    )
    box: dict[str, torchstep.StepResult] = {}
    t = threading.Thread(target=lambda: box.update(r=step.run()))
    t.start()
    wait_for(lambda: any("step 3" in line for line in list(lines)), 120, "the ranks to make progress")
    step.cancel()
    t.join(60)
    assert not t.is_alive()
    assert box["r"].state == "CANCELLED" and box["r"].retryable is False
    assert pids_with(no_leftovers) == []


@pytest.mark.timeout(300)
def test_an_exception_injected_into_the_waiting_thread_stops_the_step_then_propagates(
    log_dir: Path, no_leftovers: str
) -> None:
    """What Airflow's timeout alarm and Prefect's injected TimedOut/Cancelled do."""
    lines: list[str] = []
    step = LocalStep(
        torchstep.build_plan(app_of(role("trainer", ["loop", "100000", "0.05"], replicas=1, nproc=2)), "local"),
        run_id="alarm-test",
        cfg={"log_dir": str(log_dir), "grace_period": 5},
        on_line=lines.append,
    )

    class Alarm(Exception):
        pass

    def on_alarm(*_: object) -> None:
        raise Alarm()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    timer = threading.Thread(
        target=lambda: (
            wait_for(lambda: any("step 3" in line for line in list(lines)), 120, "progress"),
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGALRM),
        )
    )
    timer.start()
    try:
        with pytest.raises(Alarm):
            step.run()
    finally:
        signal.signal(signal.SIGALRM, previous)
        timer.join(10)
    assert pids_with(no_leftovers) == []  # stopped before the exception reached the caller


@pytest.mark.timeout(300)
def test_the_local_target_waits_the_planned_delays_between_retries(
    tmp_path: Path, log_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One rule for retry waits (StepRetry.delays): two roles with different delays; the
    role with the largest budget owns the timing, as in explain and the Airflow task."""

    counter = tmp_path / "attempts"

    def r(name: str, code: str, **opts: float) -> specs.Role:
        return specs.Role(
            name,
            image="x",
            entrypoint="python",
            args=["-c", code],
            max_retries=2,
            retry_policy=specs.RetryPolicy.APPLICATION,
            metadata={"torchstep": opts},
        )

    # role a stamps each attempt's start and fails; role b just runs (it is stopped when a fails)
    stamp = f"import time; open({str(counter)!r}, 'a').write(f'{{time.time()}}\\n'); raise SystemExit(3)"
    app = specs.AppDef(
        "waits",
        roles=[
            r("a", stamp, retry_delay=1, retry_backoff=3, max_retry_delay=2),
            r("b", "import time; time.sleep(60)", retry_delay=9),
        ],
    )
    plan = torchstep.build_plan(app, "local")
    assert plan.step_retry.delays() == [1.0, 2.0]
    result = torchstep.run_local(app, log_dir=str(log_dir), cfg={"retries": 2, "grace_period": 2})
    assert result.state == "FAILED" and result.attempts == 3
    out = capsys.readouterr().out
    assert "retrying in 1 s" in out and "retrying in 2 s" in out
    starts = sorted(float(t) for t in counter.read_text().split())
    assert len(starts) == 3
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert gaps[0] >= 1.0 and gaps[1] >= 2.0
