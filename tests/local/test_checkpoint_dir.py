"""The step's checkpoint directory (local run option ``checkpoint_dir``): a crash of the
orchestrator's worker kills every process of a local step and the retry starts afresh —
with the checkpoint the first try saved (``TORCHSTEP_LAST_CHECKPOINT``,
``torchstep.last_checkpoint()``), so training resumes instead of starting over."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torchstep
from local_testlib import HERE, TOKEN_ENV, describe, pids_with
from proclib import wait_for
from torchstep.checkpoints import latest_checkpoint
from torchstep.local.options import cfg_table, resolve

RESUMABLE = str(HERE / "scripts" / "resumable.py")

STEP = r"""
import json, sys
from torchx import specs
from torchstep.plan.planner import build_plan
from torchstep.steps import LocalStep

script, ckpt, epochs, epoch_s, log_dir, out = sys.argv[1:7]
role = specs.Role("trainer", image="unused", entrypoint="python", args=[script, "--epochs", epochs, "--epoch-s", epoch_s],
                  num_replicas=1, resource=specs.Resource(cpu=-1, gpu=0, memMB=-1),
                  metadata={"torchstep": {"nproc_per_node": 2}})
step = LocalStep(build_plan(specs.AppDef("resume", roles=[role]), "local"), run_id="try", cfg={"checkpoint_dir": ckpt, "log_dir": log_dir})
result = step.run()
open(out, "w").write(json.dumps(result.to_dict()))
"""


def orchestrator_worker(tmp_path: Path, ckpt: Path, token: str, name: str, epochs: int, epoch_s: float):
    """A process standing for the orchestrator's worker that runs the step (LocalStep)."""
    script = tmp_path / "step.py"
    script.write_text(STEP)
    out = open(tmp_path / f"{name}.out", "wb")
    return subprocess.Popen(
        [
            sys.executable,
            str(script),
            RESUMABLE,
            str(ckpt),
            str(epochs),
            str(epoch_s),
            str(tmp_path / "logs"),
            str(tmp_path / f"{name}.json"),
        ],
        env={**os.environ, TOKEN_ENV: token},
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def test_a_killed_worker_leaves_no_process_and_the_retry_resumes_from_the_checkpoint(tmp_path: Path) -> None:
    token = uuid.uuid4().hex
    ckpt = tmp_path / "ckpt $(id) {{ ds }}"  # metacharacters are data: the path is passed as is
    first = orchestrator_worker(tmp_path, ckpt, token, "first", epochs=1000, epoch_s=0.3)
    wait_for(
        lambda: latest_checkpoint(ckpt) and int(Path(latest_checkpoint(ckpt)).read_text()) >= 2,
        120,
        "the first try to save epoch 2",
    )
    assert stat.S_IMODE(os.stat(ckpt).st_mode) == 0o700
    first.send_signal(signal.SIGKILL)  # the orchestrator's worker dies mid-step
    first.wait()
    wait_for(lambda: not pids_with(token), 30, "every process of the step to be gone")
    saved = int(Path(latest_checkpoint(ckpt)).read_text())
    second = orchestrator_worker(tmp_path, ckpt, token, "second", epochs=saved + 3, epoch_s=0.05)
    assert second.wait(180) == 0, (tmp_path / "second.out").read_text()[-3000:]
    result = json.loads((tmp_path / "second.json").read_text())
    assert result["state"] == "SUCCEEDED"
    assert result["outputs"] == {"first_epoch": saved + 1}  # resumed after the saved epoch
    text = (tmp_path / "second.out").read_text()
    assert f"resuming at epoch {saved + 1} from {ckpt}/epoch-{saved:03d}" in text
    assert f"env last checkpoint: '{ckpt}/epoch-{saved:03d}'" in text
    assert not pids_with(token), describe(pids_with(token))


def test_without_a_checkpoint_the_step_starts_at_the_beginning(tmp_path: Path) -> None:
    from torchx import specs

    role = specs.Role(
        "trainer",
        image="unused",
        entrypoint="python",
        args=[RESUMABLE, "--epochs", "2"],
        resource=specs.Resource(cpu=-1, gpu=0, memMB=-1),
    )
    ckpt = tmp_path / "new" / "ckpt"
    result = torchstep.run_local(
        specs.AppDef("fresh", roles=[role]), cfg={"checkpoint_dir": str(ckpt)}, log_dir=str(tmp_path / "logs")
    )
    assert result.state == "SUCCEEDED" and result.outputs == {"first_epoch": 0}
    assert sorted(os.listdir(ckpt)) == ["epoch-000", "epoch-001"]


def test_the_newest_complete_entry_is_the_last_checkpoint(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "missing") is None
    for i, name in enumerate(["step-10", "step-2", ".hidden", "step-11.tmp", "step-12.partial"]):
        (tmp_path / name).write_text("x")
        os.utime(tmp_path / name, ns=(10**18 + i, 10**18 + i))
    (tmp_path / "dir-ckpt").mkdir()
    os.utime(tmp_path / "dir-ckpt", ns=(10**18 - 1, 10**18 - 1))
    os.symlink(tmp_path / "step-10", tmp_path / "zz-link")  # never followed, never counted
    os.utime(tmp_path / "zz-link", ns=(2 * 10**18, 2 * 10**18), follow_symlinks=False)
    assert latest_checkpoint(tmp_path) == str(tmp_path / "step-2")  # newest mtime of the complete ones
    (tmp_path / "step-3").write_text("x")
    os.utime(tmp_path / "step-3", ns=(10**18 + 1, 10**18 + 1))  # same mtime as step-2: the name decides
    assert latest_checkpoint(tmp_path) == str(tmp_path / "step-3")


def test_the_option_is_listed_and_a_bad_value_names_the_field() -> None:
    assert "checkpoint_dir" in str(cfg_table())
    with pytest.raises(torchstep.SpecError) as err:
        resolve({"checkpoint_dir": "  "})
    assert "cfg['checkpoint_dir']" in str(err.value) and "non-blank" in str(err.value)
    assert resolve({"checkpoint_dir": "rel/ckpt"}).checkpoint_dir == os.path.abspath("rel/ckpt")


@pytest.mark.parametrize("kind", ["symlink", "file"])
def test_a_symlink_or_a_file_as_checkpoint_dir_is_refused_before_anything_starts(tmp_path: Path, kind: str) -> None:
    from torchx import specs

    real = tmp_path / "real"
    real.mkdir()
    ckpt = tmp_path / "ckpt"
    if kind == "symlink":
        ckpt.symlink_to(real)
    else:
        ckpt.write_text("not a directory")
    role = specs.Role(
        "trainer",
        image="unused",
        entrypoint="python",
        args=[RESUMABLE],
        resource=specs.Resource(cpu=-1, gpu=0, memMB=-1),
    )
    t0 = time.monotonic()
    with pytest.raises(torchstep.SpecError) as err:
        torchstep.run_local(
            specs.AppDef("x", roles=[role]), cfg={"checkpoint_dir": str(ckpt)}, log_dir=str(tmp_path / "logs")
        )
    assert "cfg['checkpoint_dir']" in str(err.value)
    assert ("symlink" if kind == "symlink" else "not a directory") in str(err.value)
    assert time.monotonic() - t0 < 30 and not os.listdir(real)


def test_the_worker_helpers_without_a_checkpoint_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TORCHSTEP_CHECKPOINT_DIR", raising=False)
    monkeypatch.delenv("TORCHSTEP_LAST_CHECKPOINT", raising=False)
    assert torchstep.checkpoint_dir() is None and torchstep.last_checkpoint() is None
    monkeypatch.setenv("TORCHSTEP_CHECKPOINT_DIR", str(tmp_path))
    (tmp_path / "a").write_text("1")
    assert torchstep.last_checkpoint() == str(tmp_path / "a")  # looked up at call time


def test_another_users_checkpoint_dir_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchx import specs

    ckpt = tmp_path / "theirs"
    ckpt.mkdir(mode=0o700)
    if os.geteuid() == 0:  # a real foreign owner (root may give the directory away)
        os.chown(ckpt, 65534, 65534)
    else:  # the seam torchstep.files checks against: the caller's effective uid
        uid = os.geteuid() + 1
        monkeypatch.setattr("torchstep.files.os.geteuid", lambda: uid)
    role = specs.Role(
        "trainer",
        image="unused",
        entrypoint="python",
        args=[RESUMABLE],
        resource=specs.Resource(cpu=-1, gpu=0, memMB=-1),
    )
    with pytest.raises(torchstep.SpecError) as err:
        torchstep.run_local(
            specs.AppDef("x", roles=[role]), cfg={"checkpoint_dir": str(ckpt)}, log_dir=str(tmp_path / "logs")
        )
    assert "cfg['checkpoint_dir']" in str(err.value) and "owned by uid" in str(err.value)
    assert not os.listdir(ckpt)


def test_macros_in_the_checkpoint_dir_are_not_expanded(tmp_path: Path) -> None:
    """The path must be the same for every try: ``${app_id}`` (new per run) stays text."""
    from torchx import specs

    role = specs.Role(
        "trainer",
        image="unused",
        entrypoint="python",
        args=[RESUMABLE, "--epochs", "1"],
        resource=specs.Resource(cpu=-1, gpu=0, memMB=-1),
    )
    ckpt = tmp_path / "ckpt-${app_id}-$replica_id"
    result = torchstep.run_local(
        specs.AppDef("lit", roles=[role]), cfg={"checkpoint_dir": str(ckpt)}, log_dir=str(tmp_path / "logs")
    )
    assert result.state == "SUCCEEDED"
    assert os.listdir(tmp_path / "ckpt-${app_id}-$replica_id") == ["epoch-000"]
    assert sorted(os.listdir(tmp_path)) == ["ckpt-${app_id}-$replica_id", "logs"]
