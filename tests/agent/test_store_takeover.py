"""The rendezvous store moves to a survivor when the agent that hosted it dies
(``--rdzv-conf store_takeover=on``, torchstep.agent.store_move): three real agents on
loopback, ``--nnodes 1:3``, the store hosted by the first; that agent and its workers are
SIGKILLed (a pod deleted, a node's agent killed) and the two others train again at world 2,
in the same processes, on a store the lowest-ranked survivor hosts. Without the option the
survivors fail as with torchrun."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from agent_testlib import Agents, any_ended, start_three_nodes, train_steps
from proclib import wait_for


@pytest.mark.slow(seconds=90)
@pytest.mark.timeout(400)
def test_the_survivors_train_on_when_the_store_hosts_agent_dies(agents: Agents, tmp_path: Path) -> None:
    nodes, logs, args_of = start_three_nodes(agents, tmp_path, "store_takeover=on")
    survivors = nodes[1:]
    pids = [n.pid for n in survivors]
    killed_at = time.time()
    nodes[0].kill()  # the agent and its workers: every connection to the store is reset

    def trained_at_two() -> bool:
        return all(any(t > killed_at and w == 2 for t, w in train_steps(p)) for p in logs[1:]) or any_ended(survivors)

    wait_for(trained_at_two, 180, "the survivors to train again at world 2")
    assert not any_ended(survivors), "\n\n".join(n.diagnostics() for n in survivors)
    assert [n.pid for n in survivors] == pids  # the same agents: nothing was replaced
    said = [n.stderr for n in survivors]
    moved = [s for s in said if "rendezvous store at 127.0.0.1:" in s and "moved to 127.0.0.2:" in s]
    assert len(moved) == 2, "\n\n".join(said)  # both survivors moved...
    assert sum("hosted by this node" in s for s in said) == 1, "\n\n".join(said)  # ...to one store
    # the new round keeps training: several all-reduces at world 2 on both survivors
    wait_for(
        lambda: all(sum(1 for t, w in train_steps(p) if t > killed_at and w == 2) >= 5 for p in logs[1:]),
        120,
        "five steps at world 2",
    )
    # the lost node's replacement (same address, same command line: the original endpoint,
    # hosting there) finds the moved store among store_candidates and joins the run: world 3
    log = tmp_path / "steps-replacement.log"
    joined_at = time.time()
    replacement = agents.start(args_of(0), name="replacement", env={"SILENT_LOG": str(log)})
    wait_for(
        lambda: any(w == 3 for _, w in train_steps(log)) or any_ended([*survivors, replacement]),
        180,
        "the replacement to train with the survivors at world 3",
    )
    assert not any_ended([*survivors, replacement]), replacement.diagnostics()
    assert "joining the run there" in replacement.stderr
    for p in logs[1:]:
        assert any(t > joined_at and w == 3 for t, w in train_steps(p))  # one run, not two
    assert [n.pid for n in survivors] == pids


def test_the_option_needs_the_candidates_where_a_late_agent_looks(agents: Agents) -> None:
    args = ["--nnodes", "1:2", "--rdzv-endpoint", "127.0.0.1:29400", "--rdzv-conf", "store_takeover=on", "x.py"]
    a = agents.run(args, timeout=60)
    assert a.proc.returncode == 2
    assert "store_takeover=on needs store_candidates" in a.stderr
    assert "Traceback" not in a.stderr


@pytest.mark.parametrize(
    ("conf", "said"),
    [
        ("store_takeover=on,store_candidates=h1,store_witness=etcd", "store_witness=etcd: unknown"),
        ("store_witness=kubernetes", "decides an even split for store_takeover, which is off"),
    ],
)
def test_a_bad_witness_is_refused_at_start_naming_the_fix(agents: Agents, conf: str, said: str) -> None:
    args = ["--nnodes", "1:2", "--rdzv-endpoint", "127.0.0.1:29400", "--rdzv-conf", conf, "x.py"]
    a = agents.run(args, timeout=60)
    assert a.proc.returncode == 2
    assert said in a.stderr and "fix:" in a.stderr
    assert "Traceback" not in a.stderr


@pytest.mark.slow(seconds=90)
@pytest.mark.timeout(400)
def test_without_the_option_the_survivors_lose_the_store_as_with_torchrun(agents: Agents, tmp_path: Path) -> None:
    nodes, logs, _ = start_three_nodes(agents, tmp_path, "store_takeover=off")
    survivors = nodes[1:]
    killed_at = time.time()
    nodes[0].kill()
    for n in survivors:  # each fails: its rendezvous store is gone (the step is retried or its pod replaced)
        assert n.wait(240) != 0, n.diagnostics()
        assert "moved to" not in n.stderr
        assert n.result["state"] == "FAILED", n.diagnostics()
    for p in logs[1:]:
        assert not any(t > killed_at and w == 2 for t, w in train_steps(p))


@pytest.mark.slow(seconds=90)
@pytest.mark.timeout(400)
def test_a_replacement_started_at_once_meets_the_survivors_in_one_run(agents: Agents, tmp_path: Path) -> None:
    """The lost node's replacement starts while the survivors may still be moving the store:
    whichever comes first (the survivors join the replacement's store at the original
    endpoint, the replacement finds the moved one, or it hosts one and then finds the moved
    one), the three meet in one run of world 3, never two runs side by side."""
    nodes, logs, args_of = start_three_nodes(agents, tmp_path, "store_takeover=on")
    nodes[0].kill()
    log = tmp_path / "steps-replacement.log"
    replacement = agents.start(args_of(0), name="replacement", env={"SILENT_LOG": str(log)})
    started = time.time()
    every = [*nodes[1:], replacement]
    wait_for(
        lambda: (
            all(sum(1 for t, w in train_steps(p) if t > started and w == 3) >= 5 for p in [*logs[1:], log])
            or any_ended(every)
        ),
        240,
        "the three to train as one run of world 3",
    )
    assert not any_ended(every), "\n\n".join(n.diagnostics() for n in every)
