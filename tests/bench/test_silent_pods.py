"""bench/silent_pods.py (issue 36, goals 1 and 2 on the one-machine cluster's pods): the
torchrun variant runs the rendered Job's own rendezvous arguments, and one short run of the
benchmark measures what its figures claim — after a partition the survivor trains at world
size 1 and the cut side stops its worker (elastic), the survivor ends FAILED, retryable,
naming the cut (fixed size)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cluster.harness import require_cluster

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import silent_pods  # noqa: E402


def test_the_torchrun_variant_is_the_rendered_job_with_torchrun_as_its_launcher(tmp_path: Path) -> None:
    _, ours = silent_pods.objects("torchstep-agent", True, tmp_path)
    _, theirs = silent_pods.objects("torchrun", True, tmp_path)
    mine = next(o for o in ours if o["kind"] == "Job")["spec"]["template"]["spec"]["containers"][0]
    peer = next(o for o in theirs if o["kind"] == "Job")["spec"]["template"]["spec"]["containers"][0]
    assert mine["command"] == ["torchstep-agent"]
    assert peer["command"] == [sys.executable, "-m", "torch.distributed.run"]
    args = peer["args"]
    assert args[args.index("--nnodes") + 1] == "1:2" and args[args.index("--rdzv-backend") + 1] == "c10d"
    assert "readinessProbe" in mine and "readinessProbe" not in peer  # torchrun never writes the ready file
    # the same rendezvous flags as the rendered Job (its run id aside: each render draws one)
    flags = [a for a in args if a.startswith("--")]
    assert flags == [a for a in mine["args"] if a.startswith("--")]
    assert args[-2:] == mine["args"][-2:] == ["python", silent_pods.TRAIN]


@pytest.mark.slow
def test_one_short_run_measures_a_survivor_at_the_new_size_and_a_fixed_size_failing_fast(tmp_path: Path) -> None:
    require_cluster()
    window = 25  # the measured bounds are ~5 s; a loaded machine gets the rest
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "silent_pods.py"), "--runs", "1", "--window", str(window)]
        + ["--tools", "torchstep-agent", "--only", "elastic-cut1,fixed-cut0", "--json", "--work", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 2 and not any("error" in r for r in rows), done.stdout + done.stderr
    elastic = next(r for r in rows if r["elastic"])
    # replica 1's node cut: replica 0 (the store's) trained at world size 1 within the window,
    # and replica 1, cut off from the store, stopped its worker within it too
    assert elastic["again_replica"] == 0 and 0 < elastic["again_s"] < window, elastic
    assert elastic["stopped_replica"] == 1 and elastic["stopped_s"] is not None, elastic
    fixed = next(r for r in rows if not r["elastic"])
    # the store's node cut, --nnodes 2: replica 1 ended FAILED, retryable, and says why
    assert fixed["fail_s"] is not None and fixed["fail_s"] < window, fixed
    message = fixed["message"]
    assert message["state"] == "FAILED" and message["retryable"] is True, fixed
    assert "cut off from the rendezvous store" in message["root_cause"], fixed
    steps = sorted(tmp_path.glob("silent_pods.*/torchstep-agent-elastic-cut1-0/steps.0"))
    assert steps and any(line.split()[1] == "1" for line in steps[0].read_text().splitlines())
