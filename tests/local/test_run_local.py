"""torchstep.run_local with real agents and real torch.distributed (CPU, gloo) processes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torchstep
from local_testlib import WORKER, BackgroundRun, rank_log_has, role
from proclib import wait_for
from torchstep.local import ReplicaEvent
from torchstep.steps import run_local
from torchx import specs


@pytest.mark.slow
def test_two_roles_each_form_their_own_world(tmp_path: Path, log_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """2 roles x 2 replicas x 2 processes: two worlds of 4; macros, mounts, cpu, image dir."""
    out = tmp_path / "out"
    out.mkdir()
    data = tmp_path / "data"
    data.mkdir()
    (data / "x.txt").write_text("mounted")
    image = tmp_path / "image"
    image.mkdir()
    args = [str(out), "${app_id}", "${replica_id}", "${img_root}", "${rank0_env}", "--data=/mnt/ds/x.txt"]
    mount = specs.BindMount(src_path=str(data), dst_path="/mnt/ds")
    app = specs.AppDef(
        name="two-roles",
        roles=[
            role(
                "alpha",
                ["report", *args],
                replicas=2,
                nproc=2,
                image=str(image),
                mounts=[mount],
                env={"DATA_DIR": "/mnt/ds"},
                resource=specs.Resource(cpu=1, gpu=0, memMB=64),
            ),
            role("beta", ["report", *args], replicas=2, nproc=2, image=str(image), mounts=[mount]),
        ],
    )
    events: list[ReplicaEvent] = []
    result = run_local(app, log_dir=str(log_dir), on_status=events.append)

    assert result.state == "SUCCEEDED", result.to_json()
    assert sorted((r.role, r.rank) for r in result.ranks) == [(n, k) for n in ("alpha", "beta") for k in range(4)]
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    assert len(reports) == 8
    for rep in reports:
        assert rep["world"] == 4 and rep["sum"] == 4.0, rep  # each role its own world of 4
        app_id, replica_id, img_root, rank0_env = rep["args"][:4]
        assert app_id == result.app_id and app_id.startswith("two-roles-")
        assert replica_id == rep["replica_env"]
        assert img_root == rep["cwd"] == str(image)  # a directory image is the working directory
        assert rank0_env == "TORCHX_RANK0_HOST" and rep["rank0_host"] == "127.0.0.1"
        assert rep["data"] == "mounted"  # /mnt/ds rewritten to the host path in argv...
        assert rep["data_env"] == (str(data) if rep["role"] == "alpha" else None)  # ...and in env
    for name in ("alpha", "beta"):
        assert sorted(r["replica_env"] for r in reports if r["role"] == name) == ["0", "0", "1", "1"]
    cores = sorted(os.sched_getaffinity(0))
    for rep in reports:
        if rep["role"] == "alpha" and len(cores) > 1:  # resource.cpu=1: one core per replica
            assert len(rep["affinity"]) == 1 and rep["omp"] == "1", rep
        if rep["role"] == "beta":  # no cpu requested: not pinned
            assert rep["affinity"] == cores

    status = result.app_status()
    assert status.state.name == "SUCCEEDED"
    assert {r.role: [x.state.name for x in r.replicas] for r in status.roles} == {
        "alpha": ["SUCCEEDED", "SUCCEEDED"],
        "beta": ["SUCCEEDED", "SUCCEEDED"],
    }
    saved = json.loads((log_dir / result.app_id / "result.json").read_text())
    assert saved["state"] == "SUCCEEDED" and len(saved["replicas"]) == 4
    for name in ("alpha", "beta"):
        for replica in (0, 1):
            assert list((log_dir / result.app_id / name / str(replica)).glob("attempt_0/rank*.log"))
    assert [(e.role, e.replica_id, e.state) for e in events if e.state != "PENDING"].count(
        ("beta", 1, "SUCCEEDED")
    ) == 1
    assert {(e.role, e.replica_id) for e in events if e.state == "RUNNING" and e.pid} == {
        (n, r) for n in ("alpha", "beta") for r in (0, 1)
    }
    printed = capsys.readouterr().out
    assert "hello from alpha rank 3 of 4" in printed and "[beta/" in printed  # prefixed output


@pytest.mark.slow
def test_a_replica_whose_workers_failed_on_their_own_is_failed_live_and_in_the_result(
    tmp_path: Path, log_dir: Path
) -> None:
    """Two roles whose workers both exit 2 at once: the supervisor ends the run on the first
    exit it sees, while the other agent has already failed on its own. One rule
    (``torchstep.result.replica_state``) names both in the live lines and in the result:
    FAILED (exit 2), never CANCELLED in one place and FAILED in the other."""
    roles = [role(name, ["attempts", str(tmp_path / name), "9", "2"]) for name in ("alpha", "beta")]
    events: list[ReplicaEvent] = []

    def final(ev: ReplicaEvent, name: str) -> bool:
        path = log_dir / ev.app_id / name / "0" / "result.json"
        return path.exists() and json.loads(path.read_text() or "{}").get("state") in ("FAILED", "CANCELLED")

    def on_status(ev: ReplicaEvent) -> None:
        events.append(ev)
        if ev.state == "FAILED" and sum(e.state == "FAILED" for e in events) == 1:
            # hold the supervisor until the other agent has failed by itself: the stop that
            # follows reaches an agent that is writing its own result, or already gone
            other = "beta" if ev.role == "alpha" else "alpha"
            wait_for(lambda: final(ev, other), 60, f"{other}'s own result")

    result = run_local(specs.AppDef("both-fail", roles=roles), log_dir=str(log_dir), on_status=on_status)
    assert result.state == "FAILED" and result.exit_code == 2 and result.retryable is True
    last = {(e.role, e.replica_id): e for e in events}  # each replica's last live line
    for rep in result.replicas:
        ev = last[(rep.role, rep.replica_id)]
        assert (ev.state, ev.exit_code) == (rep.state, rep.exit_code) == ("FAILED", 2), [e.describe() for e in events]


def test_torchx_builtins_run_unchanged(tmp_path: Path, log_dir: Path) -> None:
    """dist.ddp (its own torchrun, via the shim), utils.sh and utils.python, as TorchX builds them."""
    out = tmp_path / "out"
    out.mkdir()
    ddp = torchstep.materialize("dist.ddp", ["-j", "2x2", "--script", WORKER, "--", "report", str(out)])
    result = run_local(ddp, log_dir=str(log_dir))
    assert result.state == "SUCCEEDED", result.to_json()
    assert len(result.ranks) == 4
    assert sorted(json.loads(p.read_text())["world"] for p in out.glob("*.json")) == [4, 4, 4, 4]

    marker = tmp_path / "sh.txt"
    sh = run_local(torchstep.materialize("utils.sh", ["touch", str(marker)]), log_dir=str(log_dir))
    assert sh.state == "SUCCEEDED" and marker.exists()
    code = "import sys; sys.exit(7)"
    py = run_local(torchstep.materialize("utils.python", ["-c", code]), log_dir=str(log_dir))
    assert (py.state, py.exit_code, py.root_cause.exit_code) == ("FAILED", 7, 7)


def test_cancel_from_another_thread_stops_everything(log_dir: Path) -> None:
    """What an Airflow on_kill does: set the cancel event while run_local blocks elsewhere."""
    app = specs.AppDef("long", roles=[role("worker", ["loop", "600", "0.1"], replicas=2)])
    run = BackgroundRun(app, log_dir)
    wait_for(lambda: rank_log_has(log_dir, "worker", 1, "step 2"), 120, "the workers to train")
    run.stop(60)
    result = run.result(0)
    assert result.state == "CANCELLED" and not result.retryable
    assert json.loads((log_dir / result.app_id / "result.json").read_text())["state"] == "CANCELLED"


def test_timeout_fails_the_run(log_dir: Path) -> None:
    app = specs.AppDef("slow", roles=[role("worker", ["loop", "600", "0.1"])])
    result = run_local(app, log_dir=str(log_dir), cfg={"timeout": 5, "grace_period": 2, "tee": False})
    assert (result.state, result.exit_code) == ("FAILED", 124) and "timed out after 5 s" in (result.message or "")


def _port_in_use() -> tuple[object, int]:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


@pytest.mark.parametrize("case", ["mount", "gpu", "port", "secret"])
def test_bad_input_is_refused_before_anything_starts(case: str, log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    holder = None
    kw: dict[str, object] = {}
    if case == "mount":
        kw["mounts"] = [specs.BindMount(src_path="/nonexistent/torchstep-data", dst_path="/data")]
        field = "roles[0].mounts[0].src_path"
    elif case == "gpu":
        kw["resource"] = specs.Resource(cpu=1, gpu=1, memMB=64)
        monkeypatch.setattr("torchstep.local.resources.detect_gpus", lambda env=None: [])  # none here anyway
        field = "roles[0].resource.gpu"
    elif case == "port":
        holder, port = _port_in_use()
        kw["port_map"] = {"tb": port}
        field = "roles[0].port_map['tb']"
    else:
        monkeypatch.delenv("TORCHSTEP_TEST_SECRET", raising=False)
        kw["metadata"] = {"torchstep": {"secret_env": {"TORCHSTEP_TEST_SECRET": "creds/token"}}}
        field = "roles[0].metadata['torchstep']['secret_env']['TORCHSTEP_TEST_SECRET']"
    app = specs.AppDef("bad", roles=[role("worker", ["loop", "1", "0"], **kw)])
    events: list[ReplicaEvent] = []
    with pytest.raises(torchstep.SpecError) as err:
        run_local(app, log_dir=str(log_dir), on_status=events.append)
    assert err.value.field == field and err.value.target == "local" and err.value.fix
    assert events == [] and not log_dir.exists()  # nothing started, nothing written
    if holder is not None:
        holder.close()  # type: ignore[attr-defined]


def test_role_policy_restarts_the_role(tmp_path: Path, log_dir: Path) -> None:
    """ROLE (TorchX nightly; a policy name works with any TorchX): the supervisor restarts the role."""
    counter = tmp_path / "attempts.txt"
    app = specs.AppDef(
        "role-policy",
        roles=[role("main", ["attempts", str(counter), "2", "1"], max_retries=1, retry_policy="ROLE")],
    )
    events: list[ReplicaEvent] = []
    result = run_local(app, log_dir=str(log_dir), on_status=events.append, cfg={"tee": False})
    assert result.state == "SUCCEEDED", result.to_json()
    assert len(counter.read_text().splitlines()) == 2 and result.restarts == 1
    assert any("restarting role 'main' (1/1" in (e.message or "") for e in events)
