"""A kfp.local pipeline stopped by its user: Ctrl-C (SIGINT to the terminal's process group),
``kill`` of the pipeline's process alone, or an interrupt the pipeline's process survives
(a program that catches it). kfp.local has no cancel: it stops copying the step's output
and leaves the step's process running; the step must stop itself within its grace period
(CANCELLED, exit 143), leaving nothing running — also while the killed pipeline process is
still a zombie that its own parent has not reaped (a program that started the pipeline with
``Popen`` and waits on something else), and while the pipeline process lives on (found by
the soak's ``kfp`` surface)."""

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytest.importorskip("kfp")

sys.path.append(str(Path(__file__).resolve().parents[1]))
from proclib import kill_all, procs_with_env, wait_for  # noqa: E402

APPS = Path(__file__).resolve().parents[1] / "apps"
SLEEPER = f"{APPS / 'steps.py'}:sleeper"
GRACE_S = 2.0
#: What the step may take past its grace period to end (2 shared cores, other suites running).
MARGIN_S = 30.0
#: The pipeline process a user runs: kfp.local initialised first, then a one-step pipeline.
DRIVER = """
import sys
from kfp import dsl, local
root, ref, mark, log_dir, grace = sys.argv[1:6]
local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root)
from torchstep_kfp import component_from_fn
op = component_from_fn(ref, defaults={"mark": mark}, cfg={"log_dir": log_dir, "grace_period": float(grace)})

@dsl.pipeline(name="interrupted")
def pipe():
    op()

try:
    pipe()
except KeyboardInterrupt:  # a program that survives the interrupt (and waits, as Popen does after any other error)
    import time
    time.sleep(600)
"""


@pytest.mark.parametrize("how", ["ctrl-c", "kill", "interrupt"])
def test_a_stopped_kfp_local_pipeline_cancels_its_step_and_leaves_nothing_running(tmp_path: Path, how: str) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    mark, token = uuid.uuid4().hex, f"TORCHSTEP_KFP_INTERRUPTED={uuid.uuid4().hex}"
    log_dir = tmp_path / "logs"
    env = dict(
        os.environ,
        XDG_STATE_HOME=str(tmp_path / "state"),
        TMPDIR=str(tmp_path),
        TORCHSTEP_KFP_INTERRUPTED=token.split("=", 1)[1],
    )
    argv = [sys.executable, str(driver), str(tmp_path / "root"), SLEEPER, mark, str(log_dir), str(GRACE_S)]
    with open(tmp_path / "console.txt", "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_for(lambda: procs_with_env(f"TORCHSTEP_TEST_MARK={mark}"), 120, "the step's sleeper")
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C
        elif how == "kill":
            proc.send_signal(signal.SIGTERM)  # `kill <pid>`: the pipeline process alone
            # not reaped yet: the dead pipeline process stays a zombie while the step runs on
        else:
            proc.send_signal(signal.SIGINT)  # the pipeline process alone, and it lives on
        step = lambda: [p for p in procs_with_env(token) if p != proc.pid]  # noqa: E731
        wait_for(lambda: not step(), GRACE_S + MARGIN_S, "every process of the step to end")
        if how == "kill":
            assert proc.poll() == -signal.SIGTERM
        results = list(log_dir.glob("sleeper-*/result.json"))
        assert len(results) == 1, results
        result = json.loads(results[0].read_text())
        assert (result["state"], result["exit_code"]) == ("CANCELLED", 128 + signal.SIGTERM), result
    finally:
        kill_all(procs_with_env(token))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
