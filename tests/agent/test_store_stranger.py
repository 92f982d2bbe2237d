"""A stranger who reaches a run's rendezvous store cannot run code in its agents (issue 33).

torch unpickles the dynamic rendezvous state from an unauthenticated store; the agent checks
every state it reads first (:mod:`torchstep.agent.rdzv_guard`). The stranger is another user
(uid 65534) writing a forged state into a live run's store: the command in its pickle must
never run, and the run fails with a root cause that says the state was refused.
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from agent_testlib import SCRIPTS, Agents, StoreHost, clean_env
from listeners import descendants, external_ip, listening
from netlib import free_port
from proclib import wait_for
from torchstep.agent.rdzv_guard import StateRefused, check_state

STRANGER = str(SCRIPTS / "stranger.py")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="playing another user needs root (setuid)")


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def _genuine_state() -> bytes:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

    state = _RendezvousState()
    a, b = _NodeDesc("host-a", 10, 0), _NodeDesc("host-b", 11, 0)
    state.round = 3
    state.participants[a] = 0
    state.wait_list.add(b)
    state.last_heartbeats[a] = datetime.datetime.now(datetime.timezone.utc)
    state.last_heartbeats[b] = datetime.datetime.utcnow()  # torch's own (naive) timestamps
    state.deadline = datetime.datetime.utcnow()
    state.complete = True
    return pickle.dumps(state)


def test_a_genuine_state_passes() -> None:
    check_state(_genuine_state(), "h:1")  # no exception
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState

    check_state(pickle.dumps(_RendezvousState()), "h:1")


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_a_state_that_would_run_code_is_refused_without_running_it(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "pwned"
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState

    # the payload hidden inside a genuine-looking state, where torch would unpickle it
    state = _RendezvousState()
    state.participants = {"x": _Evil(marker)}  # type: ignore[dict-item]
    with pytest.raises(StateRefused, match=r"rendezvous state from 10\.0\.0\.1:29500 refused: forged or corrupt") as e:
        check_state(pickle.dumps(state, protocol=protocol), "10.0.0.1:29500")
    assert not marker.exists()
    # protocol 0 names copyreg's reconstructor first (torch itself pickles with protocol >= 2)
    assert str(e.value).endswith("(class posix.system)" if protocol >= 2 else "(class copy_reg._reconstructor)")


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (pickle.dumps(eval), "class builtins.eval"),
        (pickle.dumps(subprocess.Popen), "class subprocess.Popen"),
        (b"\x80\x04K\x01.", "a int, not a rendezvous state"),
        (b"not a pickle", "not a pickle"),
        (b"(" * 100_000, "not a pickle"),
    ],
)
def test_what_is_not_a_state_is_refused(payload: bytes, why: str) -> None:
    with pytest.raises(StateRefused, match="forged or corrupt") as e:
        check_state(payload, "h:1")
    assert why in str(e.value)


def test_a_state_of_the_wrong_shape_is_refused() -> None:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState

    state = _RendezvousState()
    state.participants = "everyone"  # type: ignore[assignment]
    with pytest.raises(StateRefused, match="field participants is a str"):
        check_state(pickle.dumps(state), "h:1")
    state = _RendezvousState()
    state.wait_list = {("host", 1, 0)}  # type: ignore[arg-type]
    with pytest.raises(StateRefused, match="field wait_list holds something that is not a node"):
        check_state(pickle.dumps(state), "h:1")


SLEEPER = textwrap.dedent(
    """
    import os, sys, time
    open(os.path.join(sys.argv[1], "started." + os.environ["RANK"]), "w").close()
    time.sleep(120)
    """
)


@needs_root
def test_a_stranger_who_forges_the_state_of_a_live_run_runs_nothing(
    agents: Agents, store: StoreHost, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    started = tmp_path / "started"
    started.mkdir()
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    agent = agents.start(
        [
            "--nnodes",
            "1",
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            store.endpoint,
            "--rdzv-conf",
            "is_host=false",
            str(script),
            str(started),
        ],
        env={"TORCHSTEP_RDZV_ID": "run-under-attack"},
    )
    wait_for(lambda: any(started.iterdir()) or agent.returncode is not None, 120, "the worker to start")
    assert agent.returncode is None, agent.diagnostics()

    stranger = subprocess.run(
        [sys.executable, STRANGER, store.endpoint, str(marker)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert stranger.returncode == 0, stranger.stderr
    assert stranger.stdout.startswith("uid=65534 wrote torch.rendezvous.run-under-attack"), stranger.stdout

    # the agent reads the state within its next sync (about a second): it fails closed
    assert agent.wait(120) != 0, agent.diagnostics()
    assert not marker.exists(), "the forged state ran a command in the agent"
    result = agent.result
    assert result["state"] == "FAILED"
    text = str(result)
    assert f"rendezvous state from {store.endpoint} refused: forged or corrupt (class posix.system)" in text, text
    assert "refused: forged or corrupt" in agent.stderr


WORLD_SLEEPER = textwrap.dedent(
    """
    import os, sys, time
    import torch.distributed as dist
    dist.init_process_group("gloo")
    open(os.path.join(sys.argv[1], "started." + os.environ["RANK"]), "w").close()
    time.sleep(120)
    """
)


@pytest.mark.parametrize("nnodes", ["1", "1-localhost", "2"])
def test_the_stores_of_a_run_on_one_machine_listen_on_loopback_only(
    agents: Agents, store: StoreHost, tmp_path: Path, nnodes: str
) -> None:
    """A one-node run (torchrun's --standalone default) and a two-node run on one machine
    (the local target's way: a store host, ``PET_LOCAL_ADDR=127.0.0.1``): every store the
    agents and their workers serve listens on 127.0.0.1, never on every interface."""
    started = tmp_path / "started"
    started.mkdir()
    script = tmp_path / "sleeper.py"
    script.write_text(WORLD_SLEEPER)
    if nnodes == "1":
        args, env = ["--nnodes", "1", "--nproc-per-node", "2"], {}
    elif nnodes == "1-localhost":  # a one-replica Kubernetes pod's rendezvous
        args = ["--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d"]
        args += ["--rdzv-endpoint", f"localhost:{free_port()}"]
        env = {}
    else:
        args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", store.endpoint]
        env = {"TORCHSTEP_RDZV_CONF": "is_host=false", "TORCHSTEP_RDZV_ID": "loopback", "PET_LOCAL_ADDR": "127.0.0.1"}
    count = int(nnodes[0])
    run = [agents.start([*args, str(script), str(started)], env=env, name=f"node{i}") for i in range(count)]
    wait_for(
        lambda: len(list(started.iterdir())) == 2 or any(a.returncode is not None for a in run), 120, "the workers"
    )
    assert all(a.returncode is None for a in run), "\n".join(a.diagnostics() for a in run)
    pids: set[int] = set()
    for a in run:
        pids |= descendants(a.pid)
    sockets = listening(pids)
    # the agent's rendezvous store (one node), the workers' store and gloo's own listeners
    assert sockets, "no listening socket found"
    assert all(addr == "127.0.0.1" for addr, _ in sockets), sockets
    ip = external_ip()
    if ip is not None:  # what a stranger on another machine (or another address) would dial
        for _, port in sockets:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((ip, port), timeout=5).close()
    for a in run:
        a.kill()
