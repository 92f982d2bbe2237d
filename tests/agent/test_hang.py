"""``--hang-timeout`` (issue 37 §1): a group in which no rank printed, beat or reported
progress for S seconds is failed as an expired timer fails it (retryable), after the agent
took every rank's stacks; a group that prints or reports progress is left alone.

Real agents, real workers (gloo), timings asserted with generous slack (2 shared cores)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from agent_testlib import Agents
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
    """Exec'd workers that never touched the torchstep API have no handler; the group is
    failed all the same, every rank named (no outlier can be told)."""
    agent, ready = start_loader(
        agents, tmp_path, "--hang-timeout", "2", nproc=2, mode="silent", env={"TORCHSTEP_ZYGOTE": "0"}
    )
    assert agent.wait(120) == 137, agent.diagnostics()
    res = agent.result
    ranks = res["replicas"][0]["ranks"]
    assert [r["reason"] for r in ranks] == ["hang_timeout", "hang_timeout"]
    for r in ranks:
        assert r["stack"] == ["no stack: no stack handler (started by exec, without the torchstep worker API)"]
    assert "ranks 0, 1 gave no stack: no stack handler" in res["message"]
    took = res["root_cause"]["timestamp"] - max(ready_times(ready))
    assert 1.5 <= took <= 2 + 2 + SLACK_S, took


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
