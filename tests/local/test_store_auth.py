"""A stranger who reaches a local run's rendezvous store cannot decide its outcome (issue 33).

torch's TCPStore has no authentication: another local user reaches the loopback store and
lists its keys. A forged state made only of the classes a genuine state has passes the
restricted unpickler; ``closed=True`` with the agents among the spares would make torch end
each agent as a graceful exit. The local launcher hands its agents a per-run key in the
environment, and the agents refuse every state not signed with it: the run fails closed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torchstep
from listeners import listening
from local_testlib import BackgroundRun, pids_with, rank_log_has, role
from proclib import proc_cmdline, proc_environ, wait_for
from torchstep.local.options import LocalOptions
from torchstep.local.supervisor import Supervisor
from torchstep.steps import run_local
from torchx import specs

STRANGER = str(Path(__file__).resolve().parents[1] / "agent" / "scripts" / "stranger.py")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="playing another user needs root (setuid)")
KEY_ENV = "TORCHSTEP_RDZV_KEY"


def _stranger_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("TORCHSTEP_", "PET_"))}


@needs_root
@pytest.mark.parametrize("replicas", [1, 2])
def test_a_forged_closed_state_makes_a_live_local_run_fail_not_succeed(
    log_dir: Path, no_leftovers: str, tmp_path: Path, replicas: int
) -> None:
    """uid 65534 reads the live state, closes it with every agent among the spares and
    writes it back unsigned: no agent accepts it, the run is FAILED with the refusal as its
    root cause, and the key was never on a command line nor in a file of the run."""
    marker = tmp_path / "marker"
    app = specs.AppDef("auth", roles=[role("train", ["loop", "6000", "0.1"], replicas=replicas)])
    run = BackgroundRun(app, log_dir)
    try:
        wait_for(
            lambda: all(rank_log_has(log_dir, "train", i, "step 2") for i in range(replicas)) or not run.is_alive(),
            180,
            "every replica to train",
        )
        assert run.is_alive(), run.result(0).to_dict()
        pids = set(pids_with(no_leftovers))
        keys = {env[KEY_ENV] for env in map(proc_environ, pids) if KEY_ENV in env}
        assert len(keys) == 1, keys  # every agent of the run holds the same key
        key = keys.pop()
        assert len(key) >= 32
        for pid in pids:
            assert key not in proc_cmdline(pid), proc_cmdline(pid)
        sockets = listening(pids)
        endpoints = ",".join(f"{addr}:{port}" for addr, port in sockets)
        stranger = subprocess.run(
            [sys.executable, STRANGER, endpoints, str(marker), "graceful"],
            env=_stranger_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert stranger.returncode == 0, stranger.stderr
        assert stranger.stdout.startswith("uid=65534 wrote torch.rendezvous."), stranger.stdout
        run.thread.join(180)  # the agents read the state within their next sync (seconds)
        assert not run.is_alive(), "the run went on after its state was forged"
        for path in log_dir.rglob("*"):  # logs, results, console: none holds the key
            if path.is_file() and not path.is_symlink():
                assert key.encode() not in path.read_bytes(), path
    finally:
        run.stop(120)
    result = run.result(0)
    assert result.state == "FAILED", result.to_dict()
    assert result.root_cause is not None
    text = str(result.to_dict())
    assert "refused: not signed with this run's key" in text, text
    assert "rendezvous state from 127.0.0.1:" in text, text
    assert not marker.exists()


def test_each_run_gets_its_own_key_of_256_bits(tmp_path: Path) -> None:
    app = specs.AppDef("auth", roles=[role("train", ["loop", "1", "0.1"])])
    plan = torchstep.build_plan(app, target="local")
    opts = LocalOptions(log_dir=str(tmp_path))
    a, b = Supervisor(plan, opts), Supervisor(plan, opts)
    assert a.rdzv_key != b.rdzv_key
    assert len(bytes.fromhex(a.rdzv_key)) == 32


def test_the_key_is_not_passed_on_to_the_workers(log_dir: Path) -> None:
    """The agent takes the key out of its environment first: a worker (user code, maybe a
    subprocess of its own) never sees it."""
    probe = log_dir.parent / "probe.py"
    probe.write_text(f"import os\nprint('key seen' if {KEY_ENV!r} in os.environ else 'no key', flush=True)\n")
    app = specs.AppDef(
        "auth", roles=[specs.Role("w", image="unused", entrypoint="python", args=[str(probe)], num_replicas=2)]
    )
    result = run_local(app, log_dir=str(log_dir))
    assert result.state == "SUCCEEDED", result.to_dict()
    logs = [p.read_text() for p in log_dir.rglob("rank*.log")]
    assert len(logs) == 2 and all("no key" in text for text in logs), logs
