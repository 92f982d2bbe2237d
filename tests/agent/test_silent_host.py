"""A host that goes silent (issue 36 goals 1 and 2): two hosts as network namespaces on a
bridge (``bench/silent_host.py``'s :class:`Bed`), c10d rendezvous on host 0 (where the store
lives), one gloo worker each in an all-reduce loop; then one host's link is set down while its
processes live (no reset is sent). Before: the other host stayed blocked in the all-reduce for
more than 150 s (gloo's 30-minute timeout). The bounds below are the goals (10 s elastic, 30 s
fixed) with slack for a loaded 2-core machine, far below the old hang; the measured figures are
in docs/performance.md.

Needs root and network namespaces: skipped where missing, a failure under CI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from silent_host import Bed, launch, steps, wait_for  # noqa: E402

pytestmark = pytest.mark.slow

#: The elastic goal is 10 s (measured ~5 s); the slack is for a loaded 2-core machine.
ELASTIC_BOUND_S = 20.0
#: The fixed-size goal: the step ends FAILED within 30 s.
FIXED_BOUND_S = 30.0


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    name = f"sgprobe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    return None


def _bed(count: int) -> Iterator[Bed]:
    reason = _missing()
    if reason is not None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run the silent-host tests: {reason}")
        pytest.skip(reason)
    b = Bed(count=count).up()
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def bed() -> Iterator[Bed]:
    yield from _bed(2)


@pytest.fixture
def bed3() -> Iterator[Bed]:
    yield from _bed(3)


def _start(bed: Bed, work: Path, nnodes: str, conf: str = "", max_restarts: int = 0) -> list[subprocess.Popen[bytes]]:
    run_id = f"sg{os.getpid()}{time.monotonic_ns() % 10**6}"
    procs = launch(bed, "torchstep-agent", nnodes, work, run_id=run_id, conf=conf, max_restarts=max_restarts)
    n = len(bed.hosts)
    together = wait_for(lambda: all(sum(1 for _, w in steps(work, h) if w == n) >= 5 for h in range(n)), 120)
    assert together, f"the {n} hosts did not train together within 120 s:\n{_logs(work)}"
    return procs


def _logs(work: Path) -> str:
    return "\n".join(
        f"--- agent {h}:\n" + (work / f"agent.{h}.log").read_text(errors="replace")[-3000:]
        for h in range(4)
        if (work / f"agent.{h}.log").exists()
    )


def _first_at_world(work: Path, host: int, world: int, after: float) -> float | None:
    return next((t for t, w in steps(work, host) if t > after and w == world), None)


def _result(work: Path, host: int) -> dict:
    return json.loads((work / f"result.{host}.json").read_text())


@pytest.mark.parametrize("cut", [1, 0], ids=["other-host-cut", "store-host-cut"])
def test_elastic_a_silent_host_costs_seconds(bed: Bed, tmp_path: Path, cut: int) -> None:
    """``--nnodes 1:2``: the host that still reaches the store trains again at world size 1 within
    the bound (no ``--max-restarts`` spent: it is 0), and the other one, once it can tell it is
    cut off, stops its worker within the same bound instead of waiting in the all-reduce."""
    _start(bed, tmp_path, "1:2")
    t_cut = time.time()
    bed.cut(cut)
    on = 0  # the store lives on host 0: it trains on whichever host was cut
    again = wait_for(lambda: _first_at_world(tmp_path, on, 1, t_cut), 60)
    assert again is not None, f"host {on} did not train again within 60 s of the cut:\n{_logs(tmp_path)}"
    assert again - t_cut < ELASTIC_BOUND_S, _logs(tmp_path)
    stopped = wait_for(lambda: not bed.workers(1), 60, interval=0.2)
    assert stopped, f"host 1's worker still runs 60 s after the cut:\n{_logs(tmp_path)}"
    assert time.time() - t_cut < ELASTIC_BOUND_S + 5, _logs(tmp_path)
    log0 = (tmp_path / "agent.0.log").read_text()
    if cut == 1:
        assert f"node {bed.ips[1]} (group rank 1" in log0 and "restarting the group at the new size" in log0
    log1 = (tmp_path / "agent.1.log").read_text()
    assert f"cut off from the rendezvous store at {bed.ips[0]}:29400" in log1


def test_a_partitioned_store_host_is_not_a_lost_one_the_store_does_not_move(bed: Bed, tmp_path: Path) -> None:
    """``store_takeover=on`` moves the store only when its process ended (its connections
    closed). A store host that goes silent is a partition: it trains on alone and host 1,
    cut off, stops its worker as without the option; the store stays (moving it would start
    a second run beside host 0's)."""
    _start(bed, tmp_path, "1:2", conf=f"store_takeover=on,store_candidates={bed.ips[1]}")
    t_cut = time.time()
    bed.cut(0)
    again = wait_for(lambda: _first_at_world(tmp_path, 0, 1, t_cut), 60)
    assert again is not None, f"host 0 did not train on alone within 60 s of the cut:\n{_logs(tmp_path)}"
    assert wait_for(lambda: not bed.workers(1), 60, interval=0.2), _logs(tmp_path)
    time.sleep(5)  # past the monitor's cut-off and the next rendezvous: nothing may move
    log1 = (tmp_path / "agent.1.log").read_text()
    assert f"cut off from the rendezvous store at {bed.ips[0]}:29400" in log1
    assert "moved to" not in log1 and not _first_at_world(tmp_path, 1, 1, t_cut), _logs(tmp_path)


def test_of_three_hosts_the_two_that_lose_the_silent_store_host_move_the_store(bed3: Bed, tmp_path: Path) -> None:
    """``--nnodes 1:3`` with ``store_takeover=on``: the store's host goes silent. The two
    others answer each other, a majority of the last round: they move the store to host 1
    and train on at world size 2 within the bound. Host 0 reaches one node of three (itself):
    it stops its worker instead of training on alone (two runs), waits for the moved store,
    and once its link heals it joins the run there: all three train at world size 3 again."""
    bed = bed3
    # one restart: a third agent that joins after the first round formed (a loaded machine)
    # restarts the two others' group, and a worker whose peer stopped first fails ("connection
    # closed by peer") before its agent sees the membership change; torch counts that as a
    # failure, so without a restart to spend the run would end there (as under torchrun)
    _start(bed, tmp_path, "1:3", conf=f"store_takeover=on,store_candidates={'|'.join(bed.ips)}", max_restarts=1)
    t_cut = time.time()
    bed.cut(0)
    again = wait_for(lambda: all(_first_at_world(tmp_path, h, 2, t_cut) for h in (1, 2)), 60)
    assert again, f"hosts 1 and 2 did not train again at world size 2 within 60 s:\n{_logs(tmp_path)}"
    took = max(_first_at_world(tmp_path, h, 2, t_cut) or 0.0 for h in (1, 2)) - t_cut
    assert took < ELASTIC_BOUND_S, f"{took:.1f}s\n{_logs(tmp_path)}"
    assert wait_for(lambda: not bed.workers(0), 60, interval=0.2), f"host 0's worker runs on:\n{_logs(tmp_path)}"
    assert time.time() - t_cut < ELASTIC_BOUND_S + 5, _logs(tmp_path)
    for h in (1, 2):
        assert f"moved to {bed.ips[1]}:29400" in (tmp_path / f"agent.{h}.log").read_text(), _logs(tmp_path)
    log0 = (tmp_path / "agent.0.log").read_text()
    assert "it is the one cut off" in log0, _logs(tmp_path)
    assert _first_at_world(tmp_path, 0, 1, t_cut) is None, f"host 0 trained on alone:\n{_logs(tmp_path)}"
    t_heal = time.time()
    bed.cut(0, down=False)
    back = wait_for(lambda: all(_first_at_world(tmp_path, h, 3, t_heal) for h in range(3)), 90, interval=0.2)
    assert back, f"host 0 did not rejoin within 90 s of its link coming back:\n{_logs(tmp_path)}"
    assert (
        f"rendezvous store moved to {bed.ips[1]}:29400: rejoining the run there"
        in (tmp_path / "agent.0.log").read_text()
    )


@pytest.mark.parametrize("cut", [1, 0], ids=["other-host-cut", "store-host-cut"])
def test_fixed_size_fails_fast_naming_the_silent_node(bed: Bed, tmp_path: Path, cut: int) -> None:
    """``--nnodes 2``: the other host's step ends FAILED and retryable within 30 s, its root cause
    naming the node that went silent (or, when the store's host went silent, the store)."""
    procs = _start(bed, tmp_path, "2")
    other = 1 - cut
    t_cut = time.time()
    bed.cut(cut)
    ended = wait_for(lambda: procs[other].poll() is not None, 90, interval=0.2)
    took = time.time() - t_cut
    assert ended, f"host {other}'s agent still runs 90 s after the cut:\n{_logs(tmp_path)}"
    assert took < FIXED_BOUND_S, f"{took:.1f}s\n{_logs(tmp_path)}"
    result = _result(tmp_path, other)
    assert (result["state"], result["retryable"]) == ("FAILED", True), result
    cause = result["root_cause"]["message"]
    if cut == 1:
        assert cause.startswith(f"node {bed.ips[1]} (group rank 1") and "went silent" in cause, cause
    else:
        assert cause.startswith(f"cut off from the rendezvous store at {bed.ips[0]}:29400"), cause
    assert result["root_cause"]["reason"] == "replica_lost"


@pytest.mark.parametrize("stalled", [1, 0], ids=["peer-agent", "store-host-agent"])
def test_a_stalled_agent_is_not_a_silent_host(bed: Bed, tmp_path: Path, stalled: int) -> None:
    """An agent stopped for 5 s (SIGSTOP: a loaded machine's stall; its host still answers) is
    no silent host: no restart, no failure, both hosts train on at world size 2."""
    procs = _start(bed, tmp_path, "1:2")
    agent = procs[stalled].pid
    assert b"torchstep-agent" in Path(f"/proc/{agent}/cmdline").read_bytes()
    t0 = time.time()
    os.kill(agent, signal.SIGSTOP)
    try:
        time.sleep(5)
    finally:
        os.kill(agent, signal.SIGCONT)
    # well past the monitor's suspicion (2 s) and its probe (1.5 s) after the stall
    time.sleep(8)
    assert all(p.poll() is None for p in procs), _logs(tmp_path)
    for host in (0, 1):
        assert _first_at_world(tmp_path, host, 1, t0) is None, _logs(tmp_path)
        assert any(t > time.time() - 3 and w == 2 for t, w in steps(tmp_path, host)), _logs(tmp_path)
    logs = _logs(tmp_path)
    assert "went silent" not in logs and "cut off" not in logs and "membership changed" not in logs, logs


def test_a_cut_host_rejoins_when_its_link_heals(bed: Bed, tmp_path: Path) -> None:
    """Elastic: the cut host stops its worker; once its link is up again it rejoins at the next
    membership change and both hosts train at world size 2 again."""
    _start(bed, tmp_path, "1:2")
    t_cut = time.time()
    bed.cut(1)
    assert wait_for(lambda: _first_at_world(tmp_path, 0, 1, t_cut), 60), _logs(tmp_path)
    assert wait_for(lambda: not bed.workers(1), 60, interval=0.2), _logs(tmp_path)
    t_heal = time.time()
    bed.cut(1, down=False)
    back = wait_for(lambda: all(_first_at_world(tmp_path, h, 2, t_heal) for h in (0, 1)), 90, interval=0.2)
    assert back, f"host 1 did not rejoin within 90 s of the link coming back:\n{_logs(tmp_path)}"
