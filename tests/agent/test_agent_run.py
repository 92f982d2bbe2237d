"""The agent end to end on one node: success, failures, exit codes, logs, outputs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from agent_testlib import WORKER, Agents
from torchstep import NON_RETRYABLE_EXIT_CODE


def test_two_workers_succeed_with_env_logs_and_outputs(agents: Agents) -> None:
    a = agents.run(["--nproc-per-node", "2", WORKER, "--mode", "env"])
    assert a.returncode == 0, a.diagnostics()
    r = a.result
    assert r["schema"] == 1 and r["state"] == "SUCCEEDED" and r["exit_code"] == 0 and r["restarts"] == 0
    assert r["outputs"] == {"rank_seen": 0, "metrics": {"acc": 0.5, "world": 2}}  # global rank 0's only
    (rep,) = r["replicas"]
    assert rep["role"] == "default" and rep["replica_id"] == 0
    assert [(k["rank"], k["local_rank"], k["state"], k["exit_code"]) for k in rep["ranks"]] == [
        (0, 0, "SUCCEEDED", 0),
        (1, 1, "SUCCEEDED", 0),
    ]
    envs = {}
    for k in rep["ranks"]:
        log = open(k["log_file"]).read()  # stdout of the rank, kept; stderr beside it (torchrun console)
        stderr_log = k["log_file"].replace("stdout.log", "stderr.log")
        assert f"stderr line of rank {k['rank']}" in open(stderr_log).read()
        envs[k["rank"]] = json.loads(re.search(r"^ENV (.*)$", log, re.M).group(1))
        # torchrun's layout: <log_dir>/<run_id>_<random>/attempt_<n>/<local_rank>/{stdout,stderr}.log
        (run_dir,) = a.log_dir.glob("*_*/attempt_0")
        assert k["log_file"] == str(run_dir / str(k["local_rank"]) / "stdout.log")
    for rank, env in envs.items():
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (
            str(rank),
            str(rank),
            "2",
            "2",
        )
        assert env["MASTER_ADDR"] and int(env["MASTER_PORT"]) > 0
        assert env["TORCHELASTIC_TIMER_FILE"] and env["TORCHSTEP_HEARTBEAT_FILE"]
        assert env["TORCHELASTIC_ERROR_FILE"].endswith(f"attempt_0/{rank}/error.json")
        # launcher settings are consumed by the agent, not inherited by workers
        assert env["TORCHSTEP_RESULT_FILE"] is None and env["TORCHSTEP_LOG_DIR"] is None
    assert envs[0]["MASTER_ADDR"] == envs[1]["MASTER_ADDR"] and envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    # torchrun's console: a worker's stderr on the agent's stderr, no prefix
    assert "stderr line of rank 0" in a.stderr and "stderr line of rank 1" in a.stderr
    assert "[default/" not in a.stdout + a.stderr
    assert (a.log_dir / "result.json").exists() and (a.log_dir / "agent.log").exists()
    # like torchrun: one line of settings on the console, every setting and its source in agent.log
    settings_lines = [line for line in a.stderr.splitlines() if "effective settings" in line]
    assert len(settings_lines) == 1 and "nproc_per_node 2" in settings_lines[0]
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in a.stderr
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" in (a.log_dir / "agent.log").read_text()


def test_crash_always_fails_after_budget_with_rank1_root_cause(agents: Agents) -> None:
    a = agents.run(["--nproc-per-node", "2", "--max-restarts", "1", WORKER, "--mode", "crash-always", "--code", "3"])
    assert a.returncode == 3, a.diagnostics()  # torchrun would say 1
    r = a.result
    assert r["state"] == "FAILED" and r["exit_code"] == 3 and r["restarts"] == 1 and r["retryable"] is True
    root = r["root_cause"]
    assert (root["rank"], root["exit_code"], root["reason"]) == (1, 3, "worker_failed")
    assert root["message"] == "ValueError: boom on rank 1"
    assert "raise ValueError" in root["traceback"]
    assert root["tail"][-1] == "ValueError: boom on rank 1"
    assert root["log_file"].endswith("attempt_1/1/stdout.log")
    assert "attempt 0: rank 1" in r["replicas"][0]["message"]
    assert list(a.log_dir.glob("*_*/attempt_0/1/stdout.log"))  # earlier attempts' logs are kept


@pytest.mark.parametrize(("mode", "code", "expected"), [("exit", 7, 7), ("selfkill", 9, 137), ("selfkill", 11, 139)])
def test_exit_code_keeps_the_worker_code_or_signal(agents: Agents, mode: str, code: int, expected: int) -> None:
    a = agents.run(["--nproc-per-node", "2", "--stop-timeout", "2", WORKER, "--mode", mode, "--code", str(code)])
    assert a.returncode == expected, a.diagnostics()
    r = a.result
    assert r["state"] == "FAILED" and r["exit_code"] == expected
    root = r["root_cause"]
    assert root["rank"] == 1
    if mode == "selfkill":
        assert root["signal"] == {9: "SIGKILL", 11: "SIGSEGV"}[code] and root["reason"] == "signal"
    other = next(k for k in r["replicas"][0]["ranks"] if k["rank"] == 0)
    assert other["reason"] == "stopped" and other["timestamp"] > root["timestamp"]


@pytest.mark.parametrize("variant", ["torchstep", "torch", "code"])
def test_non_retryable_stops_restarts_at_once(agents: Agents, variant: str) -> None:
    a = agents.run(
        [
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "5",
            "--stop-timeout",
            "2",
            WORKER,
            "--mode",
            f"nonretryable-{variant}",
        ]
    )
    assert a.returncode == NON_RETRYABLE_EXIT_CODE, a.diagnostics()
    r = a.result
    assert r["state"] == "FAILED" and r["retryable"] is False and r["restarts"] == 0
    assert not list(a.log_dir.glob("*_*/attempt_1"))
    root = r["root_cause"]
    assert root["rank"] == 1 and root["reason"] == "non_retryable"
    if variant != "code":
        assert "NonRetryableError: dataset missing" in root["message"]
        assert "NonRetryableError" in root["traceback"]


def test_a_non_retryable_rank_still_exiting_when_its_peers_fail_first_stops_restarts(
    agents: Agents, tmp_path: Path
) -> None:
    """Rank 1 raises NonRetryableError but takes long to exit; rank 0, its collective broken,
    exits 1 first. The group is non-retryable all the same (no restart, exit 82) and the root
    cause is rank 1's error, not its peer's consequence."""
    a = agents.run(
        [
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "3",
            "--stop-timeout",
            "2",
            WORKER,
            "--mode",
            "nonretryable-slow-exit",
            "--dir",
            str(tmp_path),
        ]
    )
    assert a.returncode == NON_RETRYABLE_EXIT_CODE, a.diagnostics()
    r = a.result
    assert r["state"] == "FAILED" and r["retryable"] is False and r["restarts"] == 0, r
    root = r["root_cause"]
    assert root["rank"] == 1 and "NonRetryableError: dataset missing" in root["message"], root


def test_failed_rank_has_its_last_50_lines_and_whole_log(agents: Agents) -> None:
    """Pipeline console (--log-prefix, as launchers run it): one ordered, prefixed log."""
    a = agents.run(
        ["--log-prefix", "--nproc-per-node", "2", "--stop-timeout", "2", WORKER, "--mode", "raise", "--lines", "200"]
    )
    assert a.returncode == 1, a.diagnostics()
    root = a.result["root_cause"]
    assert root["rank"] == 1 and root["message"] == "RuntimeError: bad thing on rank 1"
    assert len(root["tail"]) == 50 and root["tail"][-1] == "RuntimeError: bad thing on rank 1"
    log = open(root["log_file"]).read().splitlines()
    assert [f"line {i} of rank 1" for i in range(200)] == [x for x in log if x.startswith("line ")]
    printed = [x for x in a.stdout.splitlines() if x.startswith("[default/1] line ")]
    assert len(printed) == 200  # every line reached the console, none lost or split


def test_torchrun_console_keeps_streams_apart_and_the_tail_is_the_traceback(agents: Agents) -> None:
    a = agents.run(["--nproc-per-node", "2", "--stop-timeout", "2", WORKER, "--mode", "raise", "--lines", "200"])
    assert a.returncode == 1, a.diagnostics()
    root = a.result["root_cause"]
    assert root["tail"][-1] == "RuntimeError: bad thing on rank 1" and "Traceback" in "\n".join(root["tail"])
    assert [x for x in a.stdout.splitlines() if x.startswith("line ") and x.endswith("of rank 1")] == [
        f"line {i} of rank 1" for i in range(200)
    ]  # unprefixed, as torchrun prints them
    assert "RuntimeError: bad thing on rank 1" in a.stderr


def test_usage_error_exits_2_and_still_writes_a_result(agents: Agents, tmp_path) -> None:
    result = tmp_path / "r.json"
    a = agents.run(["--grace-period", "-1", WORKER], env={"TORCHSTEP_RESULT_FILE": str(result)}, files=False)
    assert a.returncode == 2 and "--grace-period must be >= 0" in a.stderr
    data = json.loads(result.read_text())
    assert data["state"] == "FAILED" and data["exit_code"] == 2 and data["retryable"] is False


def test_a_flag_torchrun_refuses_ends_with_torchruns_line_and_status_and_still_a_result(
    agents: Agents, tmp_path
) -> None:
    """torchrun's own checks end as under torchrun (its exception line last, exit 1); the
    launcher still finds a result (side by side with torchrun: test_torchrun_compat.py)."""
    result = tmp_path / "r.json"
    a = agents.run(["--nnodes", "x:y", WORKER], env={"TORCHSTEP_RESULT_FILE": str(result)}, files=False)
    assert a.returncode == 1
    assert a.stderr.strip().splitlines()[-1] == "ValueError: invalid literal for int() with base 10: 'x'"
    data = json.loads(result.read_text())
    assert data["state"] == "FAILED" and data["exit_code"] == 1 and data["retryable"] is False
    assert "ValueError: invalid literal" in data["message"]


def agent_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("[torchstep-agent ")]


def test_by_hand_the_console_gets_one_line_of_ours_and_loglevel_info_gets_the_rest(agents: Agents) -> None:
    """As quiet as torchrun: one settings line on stderr at the default level; the attempt,
    the outcome and the result's paths in agent.log, and on stderr with torchrun's LOGLEVEL=INFO."""
    quiet = agents.run(["--nproc-per-node", "1", WORKER, "--mode", "exit", "--code", "0", "--rank", "0"], name="quiet")
    loud = agents.run(
        ["--nproc-per-node", "1", WORKER, "--mode", "exit", "--code", "0", "--rank", "0"],
        name="loud",
        env={"LOGLEVEL": "INFO"},
    )
    assert quiet.returncode == loud.returncode == 0, quiet.diagnostics() + loud.diagnostics()
    (line,) = agent_lines(quiet.stderr)
    assert "effective settings: nnodes 1:1, nproc_per_node 1" in line and "agent.log" in line
    log = (quiet.log_dir / "agent.log").read_text()
    for said in ("attempt 0: ranks [0]", "SUCCEEDED (exit 0, restarts 0)", "result: "):
        assert said in log and said not in quiet.stderr
        assert said in loud.stderr
    assert "rdzv_conf.join_timeout" in loud.stderr and "rdzv_conf.join_timeout" not in quiet.stderr


def test_the_result_line_names_each_result_file_once(agents: Agents, tmp_path) -> None:
    """Under a launcher the result file is ``<log-dir>/result.json``: named (and written) once."""
    logs = tmp_path / "launcher-logs"
    a = agents.run(
        ["--nproc-per-node", "1", WORKER, "--mode", "exit", "--code", "0", "--rank", "0"],
        env={"TORCHSTEP_LOG_DIR": str(logs), "TORCHSTEP_RESULT_FILE": str(logs / "result.json"), "LOGLEVEL": "INFO"},
        files=False,
    )
    assert a.returncode == 0, a.diagnostics()
    (named,) = re.findall(r"result: (.*); logs: ", a.stderr)
    assert named == str(logs / "result.json")
    assert json.loads((logs / "result.json").read_text())["state"] == "SUCCEEDED"


def test_the_agents_last_line_names_the_ranks_last_meaningful_line(agents: Agents, tmp_path) -> None:
    """A missing script: the last line says python's "can't open file", not "exited with code 2"."""
    missing = tmp_path / "missing.py"
    a = agents.run(["--nproc-per-node", "1", str(missing)])
    assert a.returncode == 2, a.diagnostics()
    last = agent_lines(a.stderr)[-1]
    assert "FAILED (exit 2, restarts 0): rank 0 worker_failed (exit 2)" in last
    assert f"can't open file '{missing}'" in last
    assert f"can't open file '{missing}'" in a.result["message"]


def test_when_every_rank_fails_the_report_names_the_root_cause_the_result_names(agents: Agents, tmp_path) -> None:
    """Four ranks fail within milliseconds (the last rank first): torch's ChildFailedError
    table, the agent's last line and result.json name the same first failure."""
    marks = tmp_path / "marks"
    marks.mkdir()
    a = agents.run(["--nproc-per-node", "4", WORKER, "--mode", "all-fail", "--dir", str(marks), "--code", "3"])
    assert a.returncode == 3, a.diagnostics()
    root = a.result["root_cause"]["rank"]
    report = a.stderr.split("Root Cause (first observed failure):", 1)[1]
    assert re.search(r"rank +: (\d+) \(local_rank", report).group(1) == str(root), a.stderr[-3000:]
    assert f"rank {root} worker_failed (exit 3): failing on purpose: rank {root}" in agent_lines(a.stderr)[-1]
