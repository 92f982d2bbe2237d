"""The soak's ``kubernetes`` surface on the one-machine cluster's real pods (issue 35 item 3,
issue 36's "the soak's node faults hold every invariant"): a lost node's run holds every
invariant; the campaign's cluster is gone when the campaign ends and when it is killed
(its reaper); a machine that cannot run the cluster skips the surface with the reason,
never runs it some other way; a campaign of one surface updates only its part of
docs/reliability.md."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from tools.soak import campaign, closing, report  # noqa: E402
from tools.soak.model import Observation, Run, Violation  # noqa: E402
from tools.soak.surfaces import kubernetes  # noqa: E402


def _netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _gone(prefix: str, server: int, timeout: float = 90.0) -> list[str]:
    """What of the cluster ``prefix`` is still there after up to ``timeout`` seconds."""
    from cluster.kubelet import memory_cgroup_root

    deadline = time.monotonic() + timeout
    while True:
        left = [f"netns {n}" for n in _netns() if n.startswith(prefix)]
        if (memory_cgroup_root() / f"{prefix}pods").exists():
            left.append(f"cgroup {prefix}pods")
        if _alive(server):
            left.append(f"API server {server}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


@pytest.mark.slow
def test_a_lost_node_holds_every_invariant_and_the_cluster_goes_with_the_campaign(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node of rank 3's pod is lost at its line 5 (its pod's processes SIGKILLed, its link
    cut, NotReady after 2 s): the survivor finds the silent peer, the replacements resume
    after the checkpoint and the step SUCCEEDS, every line there once per worker, nothing
    left; closing the campaign removes the cluster (namespaces, cgroups, API server)."""
    from cluster.harness import require_cluster

    require_cluster()
    short = Path(tempfile.mkdtemp(prefix="soakk", dir="/tmp"))  # short paths: the zygote's socket
    monkeypatch.setenv("TMPDIR", str(short))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    said: list[str] = []
    try:
        (outcome,) = campaign.execute([Run(0, "kubernetes", "node_loss", 5, 3)], 1, say=said.append, root=short)
        pods = kubernetes._pods
        assert pods is not None
        prefix, server = pods.prefix, pods.cluster.server.process.pid
        kinds = {o["kind"] for o in pods.cluster.server.state()["objects"]}
        assert not kinds & {"Job", "Pod", "Service"}, kinds  # the run deleted everything it made
    finally:
        closing.close_all()
        shutil.rmtree(short, ignore_errors=True)
    obs = outcome.observation
    assert outcome.violations == [], "\n".join(said)
    assert obs.injected and obs.result is not None and obs.result["state"] == "SUCCEEDED", "\n".join(said)
    assert any("node_loss: node-" in note for note in obs.notes), obs.notes
    assert obs.extra["after_fault_s"] <= kubernetes.NODE_BOUND_S
    assert "went silent" in obs.console or "cut off from the rendezvous store" in obs.console
    assert _gone(prefix, server) == []


@pytest.mark.slow
def test_a_killed_campaigns_cluster_is_removed_by_its_reaper(tmp_path: Path) -> None:
    """A campaign process SIGKILLed with its cluster up (a pytest-xdist worker ended at the
    session's end runs no exit handler): the reaper stops the API server and removes the
    pods' processes, dnsmasq, the namespaces and cgroups."""
    from cluster.harness import require_cluster

    require_cluster()
    code = (
        "import sys; sys.path.insert(0, '.'); from tools.soak.surfaces import kubernetes as k; "
        "p = k._cluster(); print(p.prefix, p.cluster.server.process.pid, p.reaper.pid, flush=True); "
        "import time; time.sleep(600)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        prefix, server, reaper = proc.stdout.readline().split()
        assert [n for n in _netns() if n.startswith(prefix)], "the cluster did not start"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert _gone(prefix, int(server)) == []
    deadline = time.monotonic() + 30
    while _alive(int(reaper)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(int(reaper))


def test_a_surface_that_cannot_run_here_is_skipped_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the cluster cannot run (not root, a tool missing) the kubernetes runs are skipped
    and say why, once; they are never run some other way (the fake API of old) nor counted
    as held."""

    def never(*args: object) -> Observation:
        raise AssertionError("a surface that cannot run here was run")

    monkeypatch.setattr(kubernetes, "unavailable", lambda: "the one-machine cluster needs root on Linux")
    monkeypatch.setattr(kubernetes, "run", never)
    said: list[str] = []
    runs = [Run(0, "kubernetes", "drain", 4, 1), Run(1, "kubernetes", "none", 3, 0)]
    outcomes = campaign.execute(runs, 7, say=said.append)
    assert [o.skipped for o in outcomes] == ["the one-machine cluster needs root on Linux"] * 2
    assert all(o.violations == [] for o in outcomes)
    assert sum("cannot run on this machine" in line for line in said) == 1
    assert "soak run 0 kubernetes:drain:4:1: skipped (the one-machine cluster needs root on Linux)" in said
    page = report.render(outcomes, 7, 2, 1.0)
    assert "**0 of 0 runs held every invariant**; 2 skipped: the one-machine cluster needs root" in page


def _outcome(index: int, surface: str, fault: str, bad: bool = False) -> campaign.Outcome:
    run = Run(index, surface, fault, 4, 1)
    obs = Observation(rc=0, duration_s=21.0, result=None, result_source="none", console="", run_dir=None)
    return campaign.Outcome(run, obs, [Violation(run, "7 kubernetes: one gang, nothing left", "x")] if bad else [])


def test_a_campaign_of_one_surface_rewrites_its_part_of_the_page_and_keeps_the_rest() -> None:
    full = report.render([_outcome(0, "local", "exit"), _outcome(1, "kubernetes", "none")], 11, 100, 60.0)
    assert "| local | exit | 1 | 1 | - |" in full
    mine = [_outcome(0, "kubernetes", "drain"), _outcome(1, "kubernetes", "node_loss", bad=True)]
    page = report.update(full, mine, 42, 2, 90.0, ["kubernetes"])
    assert "- Campaign: 2 runs, seed `11`" in page  # the full campaign's figures stay
    assert "| local | exit | 1 | 1 | - |" in page
    assert "| kubernetes | drain | 1 (seed 42) | 1 | - |" in page
    assert "| kubernetes | none | 0 (seed 42) | 0 | - |" in page
    assert page.count("## A campaign of `kubernetes` alone") == 1
    assert "`SOAK_FAULTS=2 SOAK_SEED=42 .venv/bin/python -m tools.soak --surface kubernetes`" in page
    assert "**1 of 2 runs held every invariant**" in page
    assert "--seed 42 --only 1 --surface kubernetes" in page
    assert "| node_loss | SUCCEEDED |" in page  # the node faults' guarantees, from the code
    again = report.update(page, mine[:1], 43, 1, 30.0, ["kubernetes"])
    assert again.count("## A campaign of `kubernetes` alone") == 1 and "SOAK_SEED=43" in again
    assert "SOAK_SEED=42" not in again and "| kubernetes | drain | 1 (seed 43) | 1 | - |" in again
