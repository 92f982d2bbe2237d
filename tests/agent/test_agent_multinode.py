"""Several agents (nodes) on loopback: c10d rendezvous, elasticity under churn, launcher
overrides, rendezvous timeout and the no-progress watchdog."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from agent_testlib import TRAIN, WORKER, Agents, StoreHost, alive
from netlib import free_port
from proclib import wait_for


def test_two_agents_form_one_world_of_four(agents: Agents) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    args = [
        "--nnodes",
        "2",
        "--nproc-per-node",
        "2",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        "world4",
        WORKER,
        "--mode",
        "env",
    ]
    pair = [agents.start(args, name=f"node{i}") for i in range(2)]
    for a in pair:
        assert a.wait(120) == 0, a.diagnostics()
    ranks = {}
    for a in pair:
        r = a.result
        assert r["state"] == "SUCCEEDED"
        (rep,) = r["replicas"]
        for k in rep["ranks"]:
            env = json.loads(next(x for x in open(k["log_file"]) if x.startswith("ENV "))[4:])
            ranks[k["rank"]] = (env["WORLD_SIZE"], env["GROUP_RANK"], rep["replica_id"])
    assert sorted(ranks) == [0, 1, 2, 3]
    assert {w for w, _, _ in ranks.values()} == {"4"}
    assert {(g, str(rid)) for _, g, rid in ranks.values()} == {("0", "0"), ("1", "1")}  # replica id = node rank
    with_outputs = [a.result["outputs"] for a in pair if a.result["outputs"]]
    assert with_outputs == [{"rank_seen": 0, "metrics": {"acc": 0.5, "world": 4}}]


def test_elastic_single_agent_starts_after_last_call(agents: Agents, tmp_path) -> None:
    t0 = time.monotonic()
    a = agents.run(
        [
            "--nnodes",
            "1:2",
            "--nproc-per-node",
            "1",
            "--rdzv-endpoint",
            f"127.0.0.1:{free_port()}",
            "--rdzv-conf",
            "last_call_timeout=3",
            TRAIN,
            "--dir",
            str(tmp_path),
            "--steps",
            "3",
        ]
    )
    assert a.returncode == 0, a.diagnostics()
    assert time.monotonic() - t0 >= 3
    (first,) = [json.loads(p.read_text()) for p in tmp_path.glob("first.*.json")]
    assert first["world"] == 1


def _node_loss(agents: Agents, store: StoreHost, tmp_path, i: int) -> None:
    marks = tmp_path / f"marks{i}"
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
        f"churn{i}",
        TRAIN,
        "--dir",
        str(marks),
    ]
    survivor = agents.start(args, env=env, name=f"survivor{i}")
    victim = agents.start(args, env=env, name=f"victim{i}")

    def firsts() -> list[dict]:
        return [json.loads(p.read_text()) for p in marks.glob("first.*.json")]

    wait_for(lambda: len([f for f in firsts() if f["world"] == 2]) == 2, 90, "both nodes training together")
    victim_pids = victim.worker_pids()
    os.kill(victim.pid, signal.SIGKILL)  # the node is gone: its reaper takes the workers along
    t_kill = time.time()
    assert survivor.wait(90) == 0, survivor.diagnostics()
    r = survivor.result
    assert (r["state"], r["restarts"]) == ("SUCCEEDED", 1), f"run {i}: {r['replicas'][0]['message']}"
    # after the kill (on a loaded machine one node may also have started alone, before the
    # other joined and the two trained together: a first group of world 1 at attempt 0)
    again = [f for f in firsts() if f["world"] == 1 and f["time"] > t_kill]
    assert len(again) == 1 and again[0]["time"] - t_kill < 30
    assert victim_pids and not any(alive(p) for p in victim_pids)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_survivor_re_forms_the_group_after_node_loss_10_times(agents: Agents, store: StoreHost, tmp_path) -> None:
    for i in range(10):
        _node_loss(agents, store, tmp_path, i)


def test_launcher_env_overrides_the_command_line(agents: Agents, store: StoreHost) -> None:
    # a torchrun line as written in an AppDef; the launcher's environment redirects it
    a = agents.run(
        [
            "--nnodes",
            "1",
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "static",
            "--rdzv-endpoint",
            "10.255.255.1:1",
            "--rdzv-id",
            "ignored",
            "--role",
            "trainer",
            WORKER,
            "--mode",
            "env",
        ],
        env={
            "TORCHSTEP_RDZV_BACKEND": "c10d",
            "TORCHSTEP_RDZV_ENDPOINT": store.endpoint,
            "TORCHSTEP_RDZV_ID": "from-launcher",
            "TORCHSTEP_RDZV_CONF": "is_host=false",
            "TORCHSTEP_ROLE": "worker",
            "TORCHSTEP_REPLICA_ID": "7",
            "TORCHSTEP_APP_ID": "app-1",
        },
    )
    assert a.returncode == 0, a.diagnostics()
    r = a.result
    assert r["app_id"] == "app-1" and r["replicas"][0]["role"] == "worker" and r["replicas"][0]["replica_id"] == 7
    assert "[worker/1]" in a.stdout
    settings = (a.log_dir / "agent.log").read_text()  # every setting and its source
    assert "rdzv_endpoint            " + store.endpoint in settings and "env TORCHSTEP_RDZV_ENDPOINT" in settings


def test_rendezvous_timeout_is_an_agent_error(agents: Agents) -> None:
    a = agents.run(
        [
            "--nnodes",
            "2",
            "--rdzv-endpoint",
            f"127.0.0.1:{free_port()}",
            "--rdzv-conf",
            "join_timeout=2",
            WORKER,
            "--mode",
            "exit",
        ],
        timeout=60,
    )
    assert a.returncode == 83, a.diagnostics()
    r = a.result
    assert r["state"] == "FAILED" and r["exit_code"] == 83 and "RendezvousTimeoutError" in r["message"]


def test_watchdog_fails_a_wedged_agent_instead_of_hanging(agents: Agents, store: StoreHost, tmp_path) -> None:
    # the rendezvous store stops answering (SIGSTOP) while the agent must re-rendezvous after
    # a crash: torch would block in a store call for read_timeout (300 s here)
    a = agents.start(
        [
            "--nproc-per-node",
            "1",
            "--max-restarts",
            "1",
            "--watchdog-timeout",
            "3",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            store.endpoint,
            "--rdzv-conf",
            "is_host=false,join_timeout=3,read_timeout=300",
            "--rdzv-id",
            "wedge",
            WORKER,
            "--mode",
            "exit",
            "--rank",
            "0",
            "--code",
            "5",
            "--lines",
            "1",
        ]
    )
    wait_for(lambda: a.worker_pids(), 60, "the worker started")
    os.kill(store.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        assert a.wait(60) == 83, a.diagnostics()
        assert time.monotonic() - t0 < 30
    finally:
        os.kill(store.proc.pid, signal.SIGCONT)
    r = a.result
    assert r["state"] == "FAILED" and r["exit_code"] == 83 and r["message"].startswith("watchdog: ")
