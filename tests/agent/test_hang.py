"""``--hang-timeout`` (issue 37 §1): a group in which no rank printed, beat or reported
progress for S seconds is failed as an expired timer fails it (retryable), after the agent
took every rank's stacks; a group that prints or reports progress is left alone.

Real agents, real workers (gloo), timings asserted with generous slack (2 shared cores)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from agent_testlib import Agents
from netlib import free_port
from proclib import wait_for
from test_stacks import HANG, ready_times, start_loader

#: What the timings may exceed the bound by on a loaded machine (the bound itself is S + 2 s).
SLACK_S = 6.0


def test_a_stuck_rank_fails_the_group_within_the_bound_and_is_named(agents: Agents, tmp_path: Path) -> None:
    s = 3.0
    agent, ready = start_loader(agents, tmp_path, "--hang-timeout", f"{s:g}", "--max-restarts", "0")
    assert agent.wait(120) == 137, agent.diagnostics()  # the stuck rank's SIGKILL, as after a timer
    res = agent.result
    assert res["state"] == "FAILED" and res["retryable"] is True
    root = res["root_cause"]
    assert (root["rank"], root["reason"]) == (2, "hang_timeout")
    assert re.search(
        r"no progress for [\d.]+s \(--hang-timeout 3s\): rank 2 at hang\.py:\d+ in load_batch; "
        r"ranks 0, 1 waiting in all_reduce",
        root["message"],
    ), root
    assert root["message"] in res["message"]
    ranks = {r["rank"]: r for r in res["replicas"][0]["ranks"]}
    assert ranks[0]["reason"] == ranks[1]["reason"] == "stopped"  # killed after the culprit, not named
    assert ranks[0]["waiting_in"] == "all_reduce" and ranks[2]["stack"][0].endswith("in load_batch")
    # detection: no sooner than S after the last sign of life (the ranks' ready lines), and
    # within S + 2 s of it (+ slack for a loaded machine)
    last_sign = max(ready_times(ready))
    took = root["timestamp"] - last_sign
    assert s - 0.5 <= took <= s + 2 + SLACK_S, took
    assert Path(res["replicas"][0]["stacks_file"]).read_text().count("(most recent call first)") >= 3


def test_ranks_without_a_stack_are_still_failed_and_say_why(agents: Agents, tmp_path: Path) -> None:
    """Exec'd workers whose Python skips site (``python -S``: no sitecustomize, where an
    exec'd worker's handler comes from) have no handler; the group is failed all the same,
    every rank named (no outlier can be told)."""
    agent, ready = start_loader(
        agents,
        tmp_path,
        "--hang-timeout",
        "2",
        *("--no-python", sys.executable, "-S"),
        nproc=2,
        mode="silent",
        env={"TORCHSTEP_ZYGOTE": "0"},
    )
    assert agent.wait(120) == 137, agent.diagnostics()
    res = agent.result
    ranks = res["replicas"][0]["ranks"]
    assert [r["reason"] for r in ranks] == ["hang_timeout", "hang_timeout"]
    for r in ranks:
        assert r["stack"] == [
            "no stack: no stack handler: the worker runs with -S (its Python skips PYTHONPATH or site, "
            "where torchstep's handler comes from)"
        ]
    assert "ranks 0, 1 gave no stack: no stack handler: the worker runs with -S" in res["message"]
    took = res["root_cause"]["timestamp"] - max(ready_times(ready))
    assert 1.5 <= took <= 2 + 2 + SLACK_S, took


@pytest.mark.parametrize(
    ("path", "s"),
    # exec'd ranks import torch first (the script talks meanwhile): a little more slack
    [("zygote", 4.0), pytest.param("exec", 6.0, marks=pytest.mark.slow)],
)
def test_completing_collectives_are_progress_until_a_rank_stops_taking_part(
    agents: Agents, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str, s: float
) -> None:
    """Ranks that print nothing but whose all_reduce calls complete run twice the hang
    timeout untouched; once rank 1 stops calling (its data loader) and rank 0 waits for it,
    the group is failed within the bound and rank 1 named. A forked worker gets the hook from
    the zygote, an exec'd one from @torchstep.record."""
    monkeypatch.delenv("TORCHSTEP_TEST_ZYGOTE", raising=False)  # each case picks its path
    loop_s = 2 * s
    ready = tmp_path / "ready"
    ready.mkdir()
    extra = ["--record"] if path == "exec" else []
    agent = agents.start(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--hang-timeout",
            f"{s:g}",
            "--max-restarts",
            "0",
            HANG,
            "--mode",
            "collectives",
            "--seconds",
            f"{loop_s:g}",
            "--rank",
            "1",
            "--dir",
            str(ready),
            *extra,
        ],
        env={"TORCHSTEP_ZYGOTE": "0" if path == "exec" else "1"},
    )
    assert agent.wait(120) == 137, agent.diagnostics()
    for rank in (0, 1):  # every rank looped for the whole time, silent, without being stopped
        calls, took = (ready / f"ran.{rank}").read_text().split()
        # rank 0 ends the loop after loop_s by its clock; rank 1's clock may have started a moment
        # later on a loaded machine (it was descheduled): still far beyond the hang timeout
        assert float(took) >= loop_s - 1 and int(calls) > 20, (rank, calls, took)
    res = agent.result
    root = res["root_cause"]
    assert (res["state"], res["retryable"], root["rank"], root["reason"]) == ("FAILED", True, 1, "hang_timeout")
    assert re.search(r"rank 1 at hang\.py:\d+ in load_batch; rank 0 waiting in all_reduce", root["message"]), root
    # the last collective returned (and touched the file, at most 1 s stale) just before the
    # ranks' ready lines: detection S - 1 s .. S + 2 s after them (+ slack)
    took = root["timestamp"] - max(ready_times(ready))
    assert s - 1.5 <= took <= s + 2 + SLACK_S, took


def test_the_collective_hook_counts_returns_and_changes_nothing_else(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """In a worker: the wrapped calls return what torch returns (an async work handle as
    is), raise what torch raises, touch the file at most once a second, and a second
    install wraps nothing twice."""
    import subprocess
    import sys

    mark = tmp_path / "collectives.0"
    code = f"""
import os, sys, time
import torch, torch.distributed as dist
from torchstep import worker
assert worker.install_collective_hook() is True and worker.install_collective_hook() is True
assert dist.all_reduce is dist.distributed_c10d.all_reduce and dist.all_reduce.__torchstep_collective__
assert dist.all_reduce.__wrapped__.__name__ == "all_reduce"
try:
    dist.all_reduce(torch.ones(1))
except (ValueError, RuntimeError) as e:  # no process group: torch's own error, unchanged
    print("raised", type(e).__name__, "Default process group" in str(e))
assert not os.path.exists({str(mark)!r})  # a call that raised is no progress
store = dist.TCPStore("127.0.0.1", 0, 1, True)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
t = torch.ones(2)
work = dist.all_reduce(t, async_op=True)
print("async", type(work).__name__, work.wait())
first = os.stat({str(mark)!r}).st_mtime_ns
for _ in range(2000):
    dist.all_reduce(t)
assert os.stat({str(mark)!r}).st_mtime_ns == first, "touched again within the second"
time.sleep(1.1)
dist.barrier()
assert os.stat({str(mark)!r}).st_mtime_ns > first
dist.destroy_process_group()
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHSTEP_")}
    env["TORCHSTEP_COLLECTIVES_FILE"] = str(mark)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "raised ValueError True" in out.stdout or "raised RuntimeError True" in out.stdout, out.stdout
    assert "async Work True" in out.stdout, out.stdout
    # without --hang-timeout (no variable) nothing is wrapped
    del env["TORCHSTEP_COLLECTIVES_FILE"]
    plain = "import torch.distributed as dist; from torchstep import worker; "
    plain += "print(worker.install_collective_hook(), hasattr(dist.all_reduce, '__torchstep_collective__'))"
    out = subprocess.run([sys.executable, "-c", plain], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "False"], out


@pytest.mark.slow
def test_no_false_positive_for_ranks_that_print_or_report_progress(agents: Agents, tmp_path: Path) -> None:
    """Ranks that print every 0.3 s, and ranks that print nothing but call
    torchstep.progress() every 0.3 s, run 6 s under --hang-timeout 2 and succeed; the
    progress reaches the result and the agent's log."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    printing = agents.start(
        ["--standalone", "--nproc-per-node", "2", "--hang-timeout", "2", HANG, "--mode", "print", "--seconds", "6"],
        name="a/agent",
    )
    reporting = agents.start(
        ["--standalone", "--nproc-per-node", "2", "--hang-timeout", "2", HANG, "--mode", "progress", "--steps", "20"],
        name="b/agent",
    )
    assert printing.wait(120) == 0, printing.diagnostics()
    assert reporting.wait(120) == 0, reporting.diagnostics()
    assert printing.result["state"] == reporting.result["state"] == "SUCCEEDED"
    assert printing.result["progress"] is None
    progress = reporting.result["progress"]
    assert (progress["step"], progress["total"], progress["rank"], progress["eta_s"]) == (20, 20, 0, 0.0)
    assert 0.5 < progress["rate"] < 4, progress  # ~3.3 steps/s
    log = wait_for(lambda: (reporting.log_dir / "agent.log").read_text(), 10, "agent.log")
    assert re.search(r"progress \d+/20 \(\d+%\)", log), log
    assert re.search(r"INFO\] progress \d+/20 \(\d+%\)", reporting.stderr)  # the console (a task log) too
    for a in (printing, reporting):
        assert "hang_timeout" not in a.stderr and "where the ranks were" not in a.stderr


def _two_nodes(agents: Agents, tmp_path: Path, rdzv_id: str, *script: str) -> list:
    endpoint = f"127.0.0.1:{free_port()}"
    args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id]
    args += ["--hang-timeout", "3", "--max-restarts", "0", HANG, *script]
    return [agents.start(args, name=f"node{i}") for i in range(2)]


@pytest.mark.slow
def test_a_node_waiting_for_a_peer_node_that_prints_is_not_hung(agents: Agents, tmp_path: Path) -> None:
    """Node 0's rank waits silently in all_reduce for 10 s while node 1's rank prints (a slow
    log flood: the soak's prefect:flood:8:3 false positive at --hang-timeout 20): the agents
    share their progress through the rendezvous store, so neither stops a group that moves."""
    pair = _two_nodes(agents, tmp_path, "peerprints", "--mode", "peer_prints", "--rank", "1", "--seconds", "10")
    for a in pair:
        assert a.wait(180) == 0, a.diagnostics()
        assert a.result["state"] == "SUCCEEDED" and "hang_timeout" not in a.stderr, a.diagnostics()


@pytest.mark.slow
def test_a_rank_stuck_on_one_node_still_stops_both_nodes(agents: Agents, tmp_path: Path) -> None:
    """The shared progress hides no hang: node 1's rank in load_batch, node 0's in all_reduce,
    nothing moves anywhere: both agents fail their group (retryable), node 1's naming load_batch."""
    ready = tmp_path / "ready"
    ready.mkdir()
    pair = _two_nodes(agents, tmp_path, "stuck", "--mode", "loader", "--rank", "1", "--dir", str(ready))
    for a in pair:
        assert a.wait(180) != 0, a.diagnostics()
    stuck = pair[1].result
    assert stuck["root_cause"]["reason"] == "hang_timeout" and stuck["retryable"], stuck
    assert "load_batch" in stuck["root_cause"]["message"], stuck["root_cause"]
    assert pair[0].result["state"] == "FAILED", pair[0].result


def test_the_role_option_reaches_the_agent_and_bad_values_name_the_field() -> None:
    """``role.metadata["torchstep"]["hang_timeout"]`` becomes the agent's ``--hang-timeout``
    (or ``TORCHSTEP_HANG_TIMEOUT`` for a role's own torchrun), and explain says so."""
    import torchstep
    from torchstep.plan.agent_command import agent_argv, replica_env
    from torchx.specs import AppDef, Role

    def plan(metadata: dict, entrypoint: str = "python") -> torchstep.StepPlan:
        role = Role("t", image="/tmp", entrypoint=entrypoint, args=["train.py"], metadata={"torchstep": metadata})
        return torchstep.build_plan(AppDef("a", roles=[role]), target="local")

    role = plan({"hang_timeout": 300}).roles[0]
    assert role.hang_timeout_s == 300.0
    argv = agent_argv(role, rdzv_backend="static", rdzv_endpoint="", rdzv_id=None)
    assert argv[argv.index("--hang-timeout") + 1] == "300"
    assert "agent --hang-timeout 300" in torchstep.explain(
        AppDef(
            "a", roles=[Role("t", image="/tmp", entrypoint="python", metadata={"torchstep": {"hang_timeout": 300}})]
        ),
        target="local",
    )
    own = plan({"hang_timeout": 60}, entrypoint="torchrun").roles[0]
    assert replica_env(own, app_id="a", replica_id=0, rank0_host="localhost")["TORCHSTEP_HANG_TIMEOUT"] == "60"
    assert "--hang-timeout" not in agent_argv(plan({}).roles[0], rdzv_backend="static", rdzv_endpoint="", rdzv_id=None)
    with pytest.raises(torchstep.SpecError, match=r"roles\[0\]\.metadata\['torchstep'\]\['hang_timeout'\]"):
        plan({"hang_timeout": -1})
