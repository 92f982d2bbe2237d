"""The worker zygote (``torchstep-agent --zygote``): Python workers are forked from a process
that imported torch once, and every agent behaviour holds — restarts, timers, signals, a
SIGKILLed agent, daemons, non-Python workers. (The whole agent suite also runs with the
zygote on: ``TORCHSTEP_TEST_ZYGOTE=1 pytest tests/agent``.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from agent_testlib import WORKER, Agent, Agents, alive, clean_env
from proclib import wait_for

PROBE = r"""
import os, sys, time
preloaded = "torch" in sys.modules  # before this script imported anything
open(os.path.join(os.environ["PIDS_DIR"], f"worker{os.environ['RANK']}.{os.getpid()}"), "w").close()
open(os.path.join(os.environ["PIDS_DIR"], f"parent{os.environ['RANK']}.{os.getppid()}"), "w").close()
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
print(f"rank {dist.get_rank()} preloaded={preloaded} argv={sys.argv[1:]} cwd={os.getcwd()}", flush=True)
dist.destroy_process_group()
time.sleep(float(sys.argv[1]))
"""


@pytest.fixture
def probe(tmp_path: Path) -> str:
    path = tmp_path / "probe.py"
    path.write_text(PROBE)
    return str(path)


def rank_logs(a: Agent, attempt: int = 0) -> str:
    return "".join(p.read_text() for p in sorted(a.log_dir.glob(f"*_*/attempt_{attempt}/*/stdout.log")))


def test_workers_are_forked_from_the_zygote_with_torch_already_imported(agents: Agents, probe: str) -> None:
    a = agents.run(["--zygote", "--nproc-per-node", "2", probe, "0", "$(id) {{ ds }}"], timeout=120)
    assert a.returncode == 0, a.diagnostics()
    logs = rank_logs(a)
    for rank in (0, 1):
        assert f"rank {rank} preloaded=True argv=['0', '$(id) {{{{ ds }}}}']" in logs, logs
    parents = {int(p.name.split(".")[1]) for p in a.pids_dir.glob("parent*")}
    assert len(parents) == 1 and a.pid not in parents  # both forked by one zygote, not exec'd by the agent
    assert a.result["state"] == "SUCCEEDED"
    wait_for(lambda: not any(alive(p) for p in [*parents, *a.worker_pids()]), 10, "the zygote and workers gone")


def test_without_the_flag_every_worker_is_a_fresh_interpreter(agents: Agents, probe: str) -> None:
    a = agents.run(["--nproc-per-node", "2", probe, "0"], env={"TORCHSTEP_ZYGOTE": "0"}, timeout=120)
    assert a.returncode == 0, a.diagnostics()
    assert "rank 0 preloaded=False" in rank_logs(a)


@pytest.mark.timeout(300)
def test_a_crashed_worker_group_is_restarted_from_the_zygote(agents: Agents) -> None:
    a = agents.run(["--zygote", "--nproc-per-node", "2", "--max-restarts", "1", WORKER, "--mode", "crash-once"],
                   timeout=120)  # fmt: skip
    assert a.returncode == 0, a.diagnostics()
    r = a.result
    assert (r["state"], r["restarts"]) == ("SUCCEEDED", 1)
    assert "attempt 0: rank 1 worker_failed (exit 3)" in r["replicas"][0]["message"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("api", ["torch", "torchstep"])
def test_an_expired_timer_kills_the_stuck_zygote_worker_and_the_group_restarts(agents: Agents, api: str) -> None:
    a = agents.run(["--zygote", "--nproc-per-node", "2", "--max-restarts", "1", "--stop-timeout", "2", WORKER,
                    "--mode", f"timer-{api}"], timeout=120)  # fmt: skip
    assert a.returncode == 0, a.diagnostics()
    r = a.result
    assert (r["state"], r["restarts"]) == ("SUCCEEDED", 1)
    assert "attempt 0: rank 1 timer_expired (SIGKILL): timer 'stuck-step' expired" in r["replicas"][0]["message"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_signalled_agent_leaves_no_zygote_and_no_worker(agents: Agents, probe: str, sig: int) -> None:
    a = agents.start(["--zygote", "--nproc-per-node", "2", probe, "600"])
    wait_for(lambda: len(a.worker_pids("worker")) == 2 and "preloaded" in rank_logs(a), 120, "both workers running")
    parents = {int(p.name.split(".")[1]) for p in a.pids_dir.glob("parent*")}
    everything = [*a.worker_pids("worker"), *parents]
    assert zygotes_of(a)
    os.kill(a.pid, sig)  # the agent alone, not its group
    wait_for(lambda: not any(alive(p) for p in everything) and not zygotes_of(a), 15, "the zygote and workers gone")
    assert a.wait(30) == (128 + sig if sig == signal.SIGTERM else -signal.SIGKILL)


@pytest.mark.timeout(300)
def test_a_daemon_of_a_zygote_worker_does_not_outlive_the_run(agents: Agents, tmp_path: Path) -> None:
    script = str(Path(__file__).resolve().parent / "scripts" / "daemonizer.py")
    pidfile = tmp_path / "daemon.pid"
    a = agents.run(["--zygote", "--nproc-per-node", "1", script, str(pidfile), "ok"], timeout=120)
    assert a.returncode == 0, a.diagnostics()
    daemon = int(pidfile.read_text())
    wait_for(lambda: not alive(daemon), 15, "the double-forked daemon killed")


def test_a_non_python_worker_starts_as_usual(agents: Agents) -> None:
    a = agents.run(["--zygote", "--nproc-per-node", "1", "--no-python", "/bin/echo", "plain binary"], timeout=120)
    assert a.returncode == 0, a.diagnostics()
    assert "plain binary" in rank_logs(a)
    assert "workers start as usual" in a.stderr + (a.log_dir / "agent.log").read_text(errors="replace")


def zygotes_of(a: Agent) -> list[int]:
    """Live zygote processes started by agent ``a`` (found by its unique ``PIDS_DIR``)."""
    mark = f"PIDS_DIR={a.pids_dir}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if b"torchstep.agent.zygote" in (proc / "cmdline").read_bytes() and mark in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return [p for p in found if alive(p)]


def test_a_zygote_started_early_goes_when_the_agent_does_not_use_it(agents: Agents) -> None:
    """The zygote starts before the command line is parsed (its import of torch overlaps the
    agent's): a bad command line or a non-Python worker must not leave it behind."""
    bad = agents.run(["--zygote", "--no-such-flag", "x.py"], timeout=120)
    plain = agents.run(["--zygote", "--nproc-per-node", "1", "--no-python", "/bin/true"], timeout=120)
    assert (bad.returncode, plain.returncode) == (2, 0), plain.diagnostics()
    wait_for(lambda: not zygotes_of(bad) and not zygotes_of(plain), 15, "the unused zygotes gone")


def test_the_environment_switch_turns_it_on(agents: Agents, probe: str) -> None:
    a = agents.run(["--nproc-per-node", "1", probe, "0"], env={"TORCHSTEP_ZYGOTE": "1"}, timeout=120)
    assert a.returncode == 0, a.diagnostics()
    assert "preloaded=True" in rank_logs(a)


def test_a_local_run_turns_it_on_through_the_role_env(tmp_path: Path, probe: str) -> None:
    import torchstep
    from torchx import specs

    role = specs.Role("trainer", image="unused", entrypoint="python", args=[probe, "0"], num_replicas=2,
                      resource=specs.Resource(cpu=-1, gpu=0, memMB=-1), env={"TORCHSTEP_ZYGOTE": "1"},
                      metadata={"torchstep": {"nproc_per_node": 1}})  # fmt: skip
    pids = tmp_path / "pids"
    pids.mkdir()
    role.env["PIDS_DIR"] = str(pids)
    result = torchstep.run_local(specs.AppDef("z", roles=[role]), log_dir=str(tmp_path / "logs"))
    assert result.state == "SUCCEEDED"
    logs = "".join(p.read_text() for p in (tmp_path / "logs").rglob("rank*.log"))
    assert logs.count("preloaded=True") == 2, logs


def test_only_this_interpreter_in_its_own_directory_counts_as_the_same_python(tmp_path: Path) -> None:
    import sys

    from torchstep.agent._exec import same_python

    assert same_python(sys.executable)
    link = tmp_path / "python"
    link.symlink_to(os.path.realpath(sys.executable))  # the same binary elsewhere: another environment
    assert not same_python(str(link))
    assert not same_python("/bin/echo") and not same_python("no-such-command-here")


ENV_PROBE = r"""
import sys
preloaded = "torch" in sys.modules
import torch
print(f"preloaded={preloaded} threads={torch.get_num_threads()}", flush=True)
"""


@pytest.mark.timeout(300)
def test_a_worker_env_that_acts_at_interpreter_start_is_honoured(tmp_path: Path) -> None:
    """OpenMP reads OMP_NUM_THREADS when torch loads (in the zygote): a forked worker gets its
    own value applied; a variable only an interpreter's start reads (PYTHONHASHSEED) makes the
    zygote refuse and the wrapper exec the worker, saying why in the worker's stderr."""
    from torchstep.agent import _exec, zygote

    script = tmp_path / "env_probe.py"
    script.write_text(ENV_PROBE)
    zdir = tmp_path / "zygote"
    zdir.mkdir(mode=0o700)
    env = clean_env({"OMP_NUM_THREADS": "2"})
    env.pop("PYTHONHASHSEED", None)
    env.pop("TORCHSTEP_ZYGOTE", None)
    argv = [sys.executable, "-m", "torchstep.agent.zygote", "--socket", str(zdir / "socket"), "--map-dir", str(zdir),
            "--ready", str(zdir / "ready")]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: (zdir / "ready").exists(), 60, "the zygote listening")

        def worker(**extra: str) -> subprocess.CompletedProcess[str]:
            cmd = [sys.executable, "-I", "-S", _exec.__file__, "--", sys.executable, "-u", str(script)]
            wenv = {**env, zygote.SOCKET_ENV: str(zdir / "socket"), **extra}
            return subprocess.run(cmd, env=wenv, capture_output=True, text=True, timeout=120)

        forked = worker(OMP_NUM_THREADS="1")
        assert (forked.returncode, forked.stdout.strip()) == (0, "preloaded=True threads=1"), forked.stderr
        refused = worker(PYTHONHASHSEED="7")
        assert (refused.returncode, refused.stdout.strip()) == (0, "preloaded=False threads=2"), refused.stderr
        assert "worker zygote not used (PYTHONHASHSEED differs from the agent's)" in refused.stderr
    finally:
        proc.terminate()  # its SIGTERM handler kills every group it forked
        proc.wait(30)
