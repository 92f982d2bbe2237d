"""The agent's compatibility suite, run against every (Python, torch) row of the matrix
(tools/torch_matrix.py): the real agent, with the row's interpreter and PyPI's torch wheel
(a CUDA build on a machine without a GPU), real worker processes, gloo.

Each test is one thing a user of that torch would notice: a run that starts, a crash and
its restart, a lost node of an elastic ``1:2`` job, SIGTERM and a cancel, an expired timer,
the result and its root cause, the zygote on and off, torchrun's flags and ``--log-dir``.
Regressions of issue 32: the agent exited 1 with ``'Namespace' object has no attribute
'shutdown_timeout'`` on torch 2.6 and 2.11 (every test here failed); on the CUDA builds of
2.14/2.15 every worker fell back from the zygote (test_start_forks_workers_from_the_zygote).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from agent_testlib import alive, any_ended, start_three_nodes, train_steps
from matrixlib import ENVDUMP, PROBE, TRAIN, WORKER, MatrixAgents, RowPython, RowStore, no_traceback, probes
from proclib import wait_for

# a row's virtualenv may be built on first use (several minutes): the fixture runs under this too
pytestmark = pytest.mark.timeout(900)


def settings_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if "effective settings" in line]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def test_start_forks_workers_from_the_zygote(agents: MatrixAgents, row: RowPython) -> None:
    """Two ranks start, train (gloo) and succeed, forked from one zygote that had imported
    the row's torch; nothing falls back, nothing initialises CUDA."""
    a = agents.run(["--nproc-per-node", "2", PROBE, str(agents.tmp_path / "agent0" / "probe")], timeout=240)
    assert a.returncode == 0, a.diagnostics()
    no_traceback(a)
    assert "shutdown_timeout" not in a.stderr  # the 2.6/2.11 AttributeError
    assert "worker zygote not used" not in a.stderr, a.stderr[-3000:]  # the 2.14/2.15 CUDA-build fallback
    assert "workers exec'd" not in settings_line(a.stderr)
    r = a.result
    assert (r["schema"], r["state"], r["exit_code"], r["restarts"]) == (1, "SUCCEEDED", 0, 0)
    assert r["outputs"] == {"world": 2}
    ranks = probes(a)
    assert [(p["rank"], p["world"], p["local_rank"]) for p in ranks] == [(0, 2, "0"), (1, 2, "1")]
    assert all(p["torch"].split("+")[0] == row.row.torch for p in ranks)  # the row's torch ran the workers
    assert all(p["preloaded"] for p in ranks), ranks  # forked after the zygote's import of torch
    parents = {p["ppid"] for p in ranks}
    assert len(parents) == 1 and a.pid not in parents, (a.pid, ranks)  # one zygote forked both
    assert not any(p["cuda_initialized"] for p in ranks)


def test_no_zygote_execs_each_worker(agents: MatrixAgents, row: RowPython) -> None:
    """``--no-zygote``: each worker is a fresh interpreter and says so in the settings line."""
    a = agents.run(
        ["--no-zygote", "--nproc-per-node", "2", PROBE, str(agents.tmp_path / "agent0" / "probe")], timeout=240
    )
    assert a.returncode == 0, a.diagnostics()
    no_traceback(a)
    assert a.result["state"] == "SUCCEEDED"
    ranks = probes(a)
    assert len(ranks) == 2 and not any(p["preloaded"] for p in ranks), ranks
    assert "workers exec'd" in settings_line(a.stderr)


def test_crash_is_restarted_within_the_budget(agents: MatrixAgents) -> None:
    a = agents.run(["--nproc-per-node", "2", "--max-restarts", "1", WORKER, "--mode", "crash-once"], timeout=240)
    assert a.returncode == 0, a.diagnostics()
    r = a.result
    assert (r["state"], r["restarts"]) == ("SUCCEEDED", 1), a.diagnostics()
    assert "attempt 0: rank 1 worker_failed (exit 3)" in r["replicas"][0]["message"]
    assert sorted(p.name for p in a.log_dir.glob("*_*/attempt_*")) == ["attempt_0", "attempt_1"]


def test_result_names_the_root_cause(agents: MatrixAgents) -> None:
    """The budget spent: the worker's exit code (torchrun says 1), the failing rank, its
    exception and traceback from the error file, its log."""
    a = agents.run(
        ["--nproc-per-node", "2", "--stop-timeout", "2", WORKER, "--mode", "crash-always", "--code", "3"], timeout=240
    )
    assert a.returncode == 3, a.diagnostics()
    r = a.result
    assert (r["state"], r["exit_code"], r["restarts"], r["retryable"]) == ("FAILED", 3, 0, True)
    root = r["root_cause"]
    assert (root["rank"], root["exit_code"], root["reason"]) == (1, 3, "worker_failed")
    assert root["message"] == "ValueError: boom on rank 1"
    assert "raise ValueError" in root["traceback"]
    assert root["log_file"].endswith("attempt_0/1/stdout.log") and Path(root["log_file"]).exists()
    assert "Root Cause (first observed failure)" in a.stderr  # torch's own report, as under torchrun


def test_elastic_job_survives_a_lost_node(agents: MatrixAgents, row: RowPython, tmp_path: Path) -> None:
    """``--nnodes 1:2``: one node is killed (agent and workers); the other re-forms the group
    alone from the same restart budget and finishes."""
    store = RowStore(tmp_path, row)
    try:
        marks = tmp_path / "marks"
        marks.mkdir()
        env = {"TORCHSTEP_RDZV_ENDPOINT": store.endpoint, "TORCHSTEP_RDZV_CONF": "is_host=false"}
        args = [
            "--nnodes",
            "1:2",
            "--nproc-per-node",
            "1",
            "--max-restarts",
            "3",
            "--rdzv-backend",
            "c10d",
            "--rdzv-id",
            "lostnode",
            TRAIN,
            "--dir",
            str(marks),
        ]
        survivor = agents.start(args, env=env, name="survivor")
        victim = agents.start(args, env=env, name="victim")

        def firsts() -> list[dict]:
            return [json.loads(p.read_text()) for p in marks.glob("first.*.json")]

        wait_for(lambda: len([f for f in firsts() if f["world"] == 2]) == 2, 180, "both nodes training together")
        victim_pids = victim.worker_pids()
        os.kill(victim.pid, signal.SIGKILL)
        t_kill = time.time()
        assert survivor.wait(180) == 0, survivor.diagnostics()
        r = survivor.result
        assert (r["state"], r["restarts"]) == ("SUCCEEDED", 1), r["replicas"][0]["message"]
        assert [f for f in firsts() if f["world"] == 1 and f["time"] > t_kill]  # trained alone after the loss
        wait_for(lambda: not any(alive(p) for p in victim_pids), 30, "the lost node's workers gone")
    finally:
        store.stop()


def test_the_store_moves_to_a_survivor_when_its_agent_dies(agents: MatrixAgents, tmp_path: Path) -> None:
    """``--rdzv-conf store_takeover=on``: the agent hosting the rendezvous store is killed with
    its workers; the two others rebuild the rendezvous on a store the lowest-ranked survivor
    hosts (the handler's private names, torchstep.agent.compat) and train on at world 2. On
    torch 2.4 the move is off, said once (the first group after a move hung there in
    ``init_process_group``, its restarts too): the survivors fail as under torchrun."""
    nodes, logs, _ = start_three_nodes(agents, tmp_path, "store_takeover=on")
    killed_at = time.time()
    nodes[0].kill()
    if str(agents.row.row.torch).startswith("2.4."):
        wait_for(lambda: all(n.proc.poll() is not None for n in nodes[1:]), 180, "the survivors to end")
        assert all("store_takeover is off on torch 2.4" in n.stderr for n in nodes[1:])
        assert not any("moved to" in n.stderr for n in nodes[1:])
        return
    wait_for(
        lambda: all(any(t > killed_at and w == 2 for t, w in train_steps(p)) for p in logs[1:]) or any_ended(nodes[1:]),
        180,
        "the survivors to train at world 2",
    )
    assert not any_ended(nodes[1:]), "\n\n".join(n.diagnostics() for n in nodes[1:])
    assert sum("hosted by this node" in n.stderr for n in nodes[1:]) == 1


def test_sigterm_forwards_waits_the_grace_period_and_cancels(agents: MatrixAgents, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    ready.mkdir()
    a = agents.start(["--nproc-per-node", "2", "--grace-period", "2", WORKER, "--mode", "linger", "--dir", str(ready)])
    wait_for(lambda: len(list(ready.iterdir())) == 2, 180, "both workers ready")
    pids = a.worker_pids()
    assert len(pids) == 4 and all(alive(p) for p in pids)  # two workers, each with a grandchild
    os.kill(a.pid, signal.SIGTERM)  # everything ignores it: SIGKILL of the groups after the grace period
    assert a.wait(120) == 143, a.diagnostics()
    r = a.result
    assert (r["state"], r["exit_code"]) == ("CANCELLED", 143) and "SIGTERM" in r["message"]
    wait_for(lambda: not any(alive(p) for p in pids), 10, "workers and grandchildren gone")


def test_cancel_while_waiting_for_peers(agents: MatrixAgents) -> None:
    """Ctrl-C (SIGINT) while the agent waits in the rendezvous for a node that never comes."""
    a = agents.start(["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:0", WORKER, "--mode", "exit"])
    wait_for(lambda: "effective settings" in a.stderr, 180, "the agent started")
    time.sleep(0.5)
    os.kill(a.pid, signal.SIGINT)
    assert a.wait(120) == 130, a.diagnostics()
    r = a.result
    assert (r["state"], r["exit_code"]) == ("CANCELLED", 130)


def test_expired_timer_kills_only_the_worker_and_restarts(agents: MatrixAgents) -> None:
    """torch's own ``timer.expires()``: the stuck rank is killed, the agent lives on
    (torchrun's stock file timer would kill the agent too) and restarts the group."""
    a = agents.run(
        ["--nproc-per-node", "2", "--max-restarts", "1", "--stop-timeout", "2", WORKER, "--mode", "timer-torch"],
        timeout=240,
    )
    assert a.returncode == 0, a.diagnostics()
    r = a.result
    assert (r["state"], r["restarts"]) == ("SUCCEEDED", 1)
    assert "attempt 0: rank 1 timer_expired (SIGKILL): timer 'stuck-step' expired" in r["replicas"][0]["message"]


VOLATILE = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "MASTER_ADDR"}
#: an intended difference (docs/agent.md): the agent hosts a fresh workers' store per group
#: start on every torch; torchrun 2.4 lets worker rank 0 host it (False), later ones say True
AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"


def test_torchrun_flags_and_log_dir_as_under_torchrun(agents: MatrixAgents, tmp_path: Path) -> None:
    """The row's torchrun and the agent over the same flags: the same worker environment,
    the same ``--log-dir`` layout; the agent adds only agent.log and result.json."""
    seen = {}
    for launcher in ("torchrun", "agent"):
        out, logs = tmp_path / launcher, tmp_path / f"{launcher}-logs"
        done = agents.launch(
            launcher,
            [
                "--standalone",
                "--nproc-per-node",
                "2",
                "--redirects",
                "3",
                "--log-dir",
                str(logs),
                "-m",
                "envdump",
                str(out),
            ],
            out,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        ranks = {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}
        if launcher == "agent":
            assert {e.pop(AGENT_STORE) for e in ranks.values()} == {"True"}
        else:
            assert {e.pop(AGENT_STORE) for e in ranks.values()} <= {"True", "False"}
        envs = {r: {k: (v is not None) if k in VOLATILE else v for k, v in e.items()} for r, e in ranks.items()}
        (run_dir,) = [p for p in logs.iterdir() if p.is_dir()]
        layout = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*.log"))
        seen[launcher] = (envs, layout)
        assert "err rank 1" in (run_dir / "attempt_0" / "1" / "stderr.log").read_text()
    assert seen["agent"] == seen["torchrun"]
    assert sorted(seen["agent"][0]) == [0, 1]
    assert sorted(p.name for p in (tmp_path / "agent-logs").iterdir() if p.is_file()) == ["agent.log", "result.json"]


def test_a_flag_torchrun_refuses_ends_as_under_torchrun(agents: MatrixAgents, tmp_path: Path) -> None:
    """The row's torchrun's own exception line and status, no traceback of ours."""
    lasts = {}
    for launcher in ("torchrun", "agent"):
        done = agents.launch(launcher, ["--nnodes", "x:y", ENVDUMP, str(tmp_path / launcher)], tmp_path / launcher)
        assert done.returncode == 1, done.stderr[-2000:]
        lasts[launcher] = done.stderr.strip().splitlines()[-1]
        if launcher == "agent":
            assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert re.match(r"ValueError: ", lasts["torchrun"]) and lasts["agent"] == lasts["torchrun"]


IMPORT_ALL = r"""
import importlib, json, pkgutil, sys, tempfile, os
import torchstep
from torchstep.result import StepState
OPTIONAL = {"rich", "kubernetes", "airflow", "kfp", "prefect", "etcd", "python_etcd"}
broken = {}
for m in pkgutil.walk_packages(torchstep.__path__, "torchstep."):
    try:
        importlib.import_module(m.name)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in OPTIONAL:
            broken[m.name] = repr(e)
    except Exception as e:
        broken[m.name] = repr(e)
from torchstep import policy
from torchstep.schedulers.prefect import _parse_time
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "policy.toml")
    with open(path, "w") as f:
        f.write('targets = ["kubernetes"]\nnamespaces = ["ml"]\n')
    loaded = policy.load(path).namespaces
print(json.dumps({
    "broken": broken,
    "state": [str(StepState.FAILED), f"{StepState.CANCELLED:>10}", json.dumps([StepState.SUCCEEDED])],
    "time": _parse_time("2026-11-27T10:55:12.929000Z").isoformat(),
    "policy": loaded,
}))
"""


def test_every_torchstep_module_imports_on_the_rows_python(row: RowPython) -> None:
    """Python 3.10-3.13: every module of the core imports (those needing an optional extra
    aside), and what differs from 3.11 (tomllib, StrEnum, a ``Z`` time) behaves as there."""
    import subprocess

    done = subprocess.run([row.python, "-c", IMPORT_ALL], capture_output=True, text=True, timeout=300, env=row.env())
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["broken"] == {}
    assert got["state"] == ["FAILED", " CANCELLED", '["SUCCEEDED"]']
    assert got["time"] == "2026-11-27T10:55:12.929000+00:00"
    assert got["policy"] == ["ml"]  # a TOML policy file: tomllib, or its backport on 3.10
