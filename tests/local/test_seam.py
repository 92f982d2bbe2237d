"""torchstep.steps.tries with real processes (open_step's own tests are in tests/steps):
``run_tries`` is the one APPLICATION retry loop — the plan's delays, the non-retryable
verdict, cancellation while a try runs and while it waits."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torchstep
from local_testlib import cli, pids_with, role
from torchstep.steps import Attempt, LocalStep, run_tries
from torchx import specs


def flaky(counter: Path, fail_until: int, code: int = 1, retries: int = 2, delay: float = 0.2) -> specs.AppDef:
    r = role(
        "main",
        ["attempts", str(counter), str(fail_until), str(code)],
        max_retries=retries,
        metadata={"torchstep": {"retry_delay": delay}},
    )
    return specs.AppDef("flaky", roles=[r])


@pytest.mark.timeout(300)
def test_run_tries_waits_the_planned_delays_and_stops_at_a_non_retryable_failure(tmp_path: Path, log_dir: Path) -> None:
    counter = tmp_path / "attempts"
    plan = torchstep.build_plan(flaky(counter, 99, code=82), "local")
    seen: list[tuple[int, float]] = []
    result = run_tries(
        plan,
        attempt="nr",
        cfg={"log_dir": str(log_dir), "tee": False},
        on_retry=lambda r, n, delay: seen.append((n, delay)),
    )
    assert result.state == "FAILED" and result.retryable is False and result.attempts == 1
    assert seen == [] and len(counter.read_text().splitlines()) == 1  # 82: no second try

    counter = tmp_path / "attempts2"
    plan = torchstep.build_plan(flaky(counter, 3), "local")
    opened: list[LocalStep] = []
    result = run_tries(
        plan,
        attempt=Attempt(("test", "run"), 1),
        cfg={"log_dir": str(log_dir), "tee": False},
        on_step=opened.append,
        on_retry=lambda r, n, delay: seen.append((n, delay)),
    )
    assert result.state == "SUCCEEDED" and result.attempts == 3
    assert seen == [(1, 0.2), (2, 0.2)]  # plan.step_retry.delays(): retry_delay 0.2, no backoff
    assert [s.run_id for s in opened] == ["test.run.try1", "test.run.try1.try2", "test.run.try1.try3"]
    assert len({s.result.app_id for s in opened if s.result}) == 3  # every try its own app id and logs


@pytest.mark.timeout(300)
def test_a_cancel_while_run_tries_waits_ends_it_cancelled_and_no_further_try_starts(
    tmp_path: Path, log_dir: Path
) -> None:
    counter = tmp_path / "attempts"
    plan = torchstep.build_plan(flaky(counter, 99, delay=60), "local")
    cancel = threading.Event()
    box: dict[str, torchstep.StepResult] = {}
    t = threading.Thread(
        target=lambda: box.update(r=run_tries(plan, attempt="c", cfg={"log_dir": str(log_dir)}, cancel=cancel))
    )
    t.start()
    deadline = time.monotonic() + 120
    while not (counter.exists() and counter.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(3)  # try 1 failed; the loop waits 60 s before try 2
    t0 = time.monotonic()
    cancel.set()
    t.join(30)
    assert not t.is_alive() and time.monotonic() - t0 < 5
    result = box["r"]
    assert (
        result.state == "CANCELLED"
        and result.retryable is False
        and result.message == "cancelled while waiting to retry"
    )
    assert len(counter.read_text().splitlines()) == 1
    saved = torchstep.StepResult.load(log_dir / result.app_id / "result.json")
    assert saved.state == "CANCELLED"


@pytest.mark.timeout(300)
def test_torchstep_run_stops_gracefully_on_a_signal_and_at_once_on_a_second(
    tmp_path: Path, log_dir: Path, no_leftovers: str
) -> None:
    """A worker that ignores SIGTERM holds the first stop for the whole grace period (60 s);
    the second signal kills every process at once."""
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"
    app = specs.AppDef("stubborn", roles=[specs.Role("w", image="x", entrypoint="python", args=["-c", code])])
    path = tmp_path / "app.json"
    from torchstep.local.appfile import app_to_dict

    path.write_text(__import__("json").dumps(app_to_dict(app)))
    proc = subprocess.Popen(
        cli("--app", str(path), "--log-dir", str(log_dir), "-c", "grace_period=60"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "ready" in line:
                break
        proc.send_signal(signal.SIGTERM)
        time.sleep(2)
        assert proc.poll() is None  # the first signal: the grace period runs
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 128 + signal.SIGTERM
        assert time.monotonic() - t0 < 20  # not the 60 s grace period
    finally:
        if proc.poll() is None:
            proc.kill()
    assert pids_with(no_leftovers) == []
