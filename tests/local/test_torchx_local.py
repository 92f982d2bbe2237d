"""``torchx run -s torchstep_local``: the TorchX CLI submits an AppDef that runs detached on
this machine; ``torchx status``, ``log``, ``list`` and ``cancel`` work from other processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from proclib import procs_with_env, wait_for

TORCHX = str(Path(sys.executable).with_name("torchx"))
FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")

TRAIN = """\
import os, time
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} of {dist.get_world_size()} local {os.environ['LOCAL_RANK']}", flush=True)
dist.barrier()
time.sleep(float(os.environ.get("SLEEP", "0")))
dist.destroy_process_group()
"""


@pytest.fixture()
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``torchx`` in a scratch directory, with this test's own state directory."""
    (tmp_path / "train.py").write_text(TRAIN)
    env = {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    monkeypatch.setenv("XDG_STATE_HOME", env["XDG_STATE_HOME"])

    def torchx(*args: str, timeout: float = 120, **more_env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [TORCHX, *args], cwd=tmp_path, env={**env, **more_env}, capture_output=True, text=True, timeout=timeout
        )

    return torchx


def handle_of(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 0, out.stdout + out.stderr
    line = out.stdout.strip().splitlines()[0]
    assert line.startswith("torchstep_local://torchx/"), out.stdout
    return line


def state(cli, handle: str) -> str:
    out = cli("status", handle)
    for line in out.stdout.splitlines():
        if line.strip().startswith("State:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(out.stdout + out.stderr)


def wait_final(cli, handle: str, timeout: float = 120) -> str:
    return wait_for(lambda: (s := state(cli, handle)) in FINAL and s, timeout, f"{handle} to end", 0.5)


def test_echo_runs_detached_and_status_log_and_list_work_from_other_processes(cli) -> None:
    handle = handle_of(cli("run", "-s", "torchstep_local", "utils.echo", "--msg", "hi $(id) {{ ds }}"))
    assert wait_final(cli, handle) == "SUCCEEDED"
    app_id = handle.rsplit("/", 1)[1]
    log = cli("log", f"{handle}/echo/0")
    assert log.returncode == 0, log.stderr
    assert log.stdout == "echo/0 hi $(id) {{ ds }}\n"  # as data: no shell, no template; prefixed once
    listed = cli("list", "-s", "torchstep_local")
    assert app_id in listed.stdout and "SUCCEEDED" in listed.stdout


def test_log_shows_the_app_lines_as_local_cwd_does_and_leaves_the_agent_lines_in_its_log(cli, tmp_path: Path) -> None:
    handle = handle_of(cli("run", "-s", "torchstep_local", "utils.echo", "--msg", "hello"))
    assert wait_final(cli, handle) == "SUCCEEDED"
    ours = cli("log", handle)
    assert ours.returncode == 0 and ours.stdout == "echo/0 hello\n", ours.stdout + ours.stderr
    # TorchX's own local scheduler gives the same line for the same component
    from torchx.runner import get_runner

    with get_runner() as runner:
        theirs = runner.run_component("utils.echo", ["--msg", "hello"], "local_cwd", cfg={"log_dir": str(tmp_path)})
        runner.wait(theirs, wait_interval=0.1)
        assert list(runner.log_lines(theirs, "echo", 0)) == list(runner.log_lines(handle, "echo", 0)) == ["hello\n"]
    # the agent's own lines are where they belong: its log beside the console
    app_id = handle.rsplit("/", 1)[1]
    agent_log = tmp_path / "state" / "torchstep" / app_id / "echo" / "0" / "agent.log"
    assert "effective settings" in agent_log.read_text()


def test_a_2x2_ddp_job_runs_every_rank_and_logs_per_replica(cli) -> None:
    handle = handle_of(cli("run", "-s", "torchstep_local", "dist.ddp", "-j", "2x2", "--script", "train.py"))
    assert wait_final(cli, handle, timeout=180) == "SUCCEEDED"
    status = cli("status", handle).stdout
    assert "train[0]:SUCCEEDED" in status and "train[1]:SUCCEEDED" in status
    everything = cli("log", f"{handle}/train").stdout
    assert sorted(line.split("rank ")[1][:6] for line in everything.splitlines() if "] rank " in line) == [
        "0 of 4",
        "1 of 4",
        "2 of 4",
        "3 of 4",
    ]
    one = cli("log", f"{handle}/train/1").stdout
    assert one.count("] rank ") == 2  # replica 1's two ranks only
    # two ranks in one replica: each line keeps the rank that wrote it; no line of the agent's
    assert all(line.startswith("train/1 [train/") for line in one.splitlines()), one
    assert cli("log", f"{handle}/nope").returncode != 0


def test_cancel_stops_every_process_and_the_app_ends_cancelled(cli) -> None:
    mark = f"torchx-local-{uuid.uuid4().hex[:8]}"
    handle = handle_of(
        cli(
            "run",
            "-s",
            "torchstep_local",
            "-cfg",
            "grace_period=3",
            "dist.ddp",
            "-j",
            "1x2",
            "--script",
            "train.py",
            "--env",
            f"SLEEP=600,TORCHSTEP_TEST_MARK={mark}",
        )
    )
    wait_for(lambda: len(procs_with_env(f"TORCHSTEP_TEST_MARK={mark}")) >= 3, 120, "agent and workers", 0.2)
    wait_for(lambda: "rank 1 of 2" in cli("log", f"{handle}/train/0").stdout, 120, "the workers to print", 0.5)
    assert state(cli, handle) == "RUNNING"
    # follow the log in another process while it runs: it must end when the app ends
    follower = subprocess.Popen(
        [TORCHX, "log", "-t", f"{handle}/train/0"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ},
        cwd=os.getcwd(),
    )
    t0 = time.monotonic()
    out = cli("cancel", handle)
    assert out.returncode == 0, out.stderr
    wait_for(lambda: not procs_with_env(f"TORCHSTEP_TEST_MARK={mark}"), 30, "no process of the app left", 0.2)
    assert time.monotonic() - t0 < 20
    assert wait_final(cli, handle) == "CANCELLED"
    followed, _ = follower.communicate(timeout=60)
    assert "rank 0 of 2" in followed and "CANCELLED" in followed


def test_a_killed_supervisor_is_reported_failed_and_leaves_no_process(cli, tmp_path: Path) -> None:
    mark = f"torchx-local-{uuid.uuid4().hex[:8]}"
    handle = handle_of(
        cli(
            "run",
            "-s",
            "torchstep_local",
            "dist.ddp",
            "-j",
            "1x1",
            "--script",
            "train.py",
            "--env",
            f"SLEEP=600,TORCHSTEP_TEST_MARK={mark}",
        )
    )
    wait_for(lambda: len(procs_with_env(f"TORCHSTEP_TEST_MARK={mark}")) >= 2, 120, "agent and worker", 0.2)
    app_id = handle.rsplit("/", 1)[1]
    record = json.loads(
        (tmp_path / "state" / "torchstep" / "torchx" / "torchstep_local" / f"{app_id}.json").read_text()
    )
    os.kill(record["pid"], signal.SIGKILL)
    wait_for(lambda: not procs_with_env(f"TORCHSTEP_TEST_MARK={mark}"), 30, "the app's processes to die", 0.2)
    assert state(cli, handle) == "FAILED"
    assert "ended without a result" in cli("status", handle).stdout


@pytest.mark.parametrize("dryrun", [True, False], ids=["dryrun", "run"])
def test_what_this_machine_cannot_run_is_refused_by_the_dry_run_before_anything_starts(
    cli, tmp_path: Path, dryrun: bool
) -> None:
    run = ["run", *(["--dryrun"] if dryrun else []), "-s", "torchstep_local"]
    out = cli(*run, "dist.spmd", "--script", "train.py", CUDA_VISIBLE_DEVICES="")  # one GPU asked, none here
    assert out.returncode != 0
    # one line under torchx's CLI, as under torchstep's: no traceback
    assert "torchx: error: roles[0].resource.gpu (target 'local')" in out.stderr and "fix:" in out.stderr
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "state" / "torchstep" / "torchx" / "torchstep_local").exists()  # nothing submitted
    # a log directory another user owns: refused before the run, as the run itself would
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 12345, 12345)
    out = cli(*run, "-cfg", f"log_dir={theirs}", "utils.echo", "--msg", "x")
    assert out.returncode != 0 and "torchx: error: log_dir (target 'local')" in out.stderr, out.stderr[-2000:]
    assert "owned by uid 12345" in out.stderr


def test_records_are_private_and_a_bad_option_or_handle_is_a_clear_error(cli, tmp_path: Path) -> None:
    out = cli("run", "-s", "torchstep_local", "-cfg", "grace_period=-1", "utils.echo", "--msg", "x")
    assert out.returncode != 0 and "cfg['grace_period']" in out.stderr and "positive" in out.stderr
    from torchx.runner import get_runner

    with get_runner() as runner:  # the Python API passes unknown keys on (the CLI drops them): we refuse them
        with pytest.raises(ValueError, match=r"cfg\['grace_perod'\].*unknown option"):
            runner.dryrun_component("utils.echo", ["--msg", "x"], "torchstep_local", cfg={"grace_perod": 3})
    handle = handle_of(cli("run", "-s", "torchstep_local", "utils.echo", "--msg", "x"))
    wait_final(cli, handle)
    base = tmp_path / "state" / "torchstep" / "torchx" / "torchstep_local"
    assert oct(base.stat().st_mode & 0o777) == "0o700"
    assert {oct(p.stat().st_mode & 0o777) for p in base.iterdir()} == {"0o600"}
    from torchstep.schedulers.local import create_scheduler

    sched = create_scheduler("t")
    assert sched.describe("../../etc/passwd") is None
    assert sched.describe("never-submitted") is None


def test_builtin_torchx_schedulers_are_still_listed_after_install() -> None:
    from torchx.schedulers import get_scheduler_factories

    names = set(get_scheduler_factories())
    assert {"local_cwd", "local_docker", "kubernetes", "slurm", "torchstep_local"} <= names
    local_cwd = get_scheduler_factories()["local_cwd"]("t")
    assert type(local_cwd).__name__ == "LocalScheduler"  # TorchX's own, not a stand-in
    out = subprocess.run([TORCHX, "runopts", "local_cwd"], capture_output=True, text=True, timeout=60)
    assert "log_dir" in out.stdout
    out = subprocess.run([TORCHX, "runopts", "torchstep_local"], capture_output=True, text=True, timeout=60)
    assert "grace_period" in out.stdout and "cpu_affinity" in out.stdout
