"""The checkpoint directory trusts nothing another user could have written (issue 24,
section 3): a checkpoint is loaded as code (a pickle), so the directory, every directory
above it (OpenSSH's StrictModes) and the chosen entry are checked on every look, and an
existing directory's mode is never changed behind the user's back.

Tests run as root; "another user" is uid 65534 (``os.chown``)."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import pytest
import torchstep
from local_testlib import HERE
from torchstep.checkpoints import CheckpointWarning, latest_checkpoint, prepare_checkpoint_dir
from torchstep.files import UnsafePathError
from torchx import specs

RESUMABLE = str(HERE / "scripts" / "resumable.py")
OTHER = 65534

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another user")

#: Saves epoch-000, waits for the test to plant a newer entry, then asks torchstep.last_checkpoint().
LATE = r"""
import os, sys, time, torchstep
directory = torchstep.checkpoint_dir()
with open(os.path.join(directory, "epoch-000.tmp"), "w") as f:
    f.write("0")
os.replace(os.path.join(directory, "epoch-000.tmp"), os.path.join(directory, "epoch-000"))
deadline = time.time() + 60
while not os.path.exists(sys.argv[1]) and time.time() < deadline:
    time.sleep(0.05)
torchstep.output("last", os.path.basename(torchstep.last_checkpoint() or ""))
"""


def app(args: list[str], entry: str = RESUMABLE) -> specs.AppDef:
    role = specs.Role(
        "trainer",
        image="unused",
        entrypoint="python",
        args=[entry, *args],
        resource=specs.Resource(cpu=-1, gpu=0, memMB=-1),
    )
    return specs.AppDef("ckpt", roles=[role])


def plant(directory: Path, name: str, *, owner: int = OTHER, mode: int = 0o644) -> Path:
    """Another user's file, newer than everything else in ``directory``."""
    path = directory / name
    path.write_text("999")
    path.chmod(mode)
    os.chown(path, owner, owner)
    future = time.time() + 3600
    os.utime(path, (future, future))
    return path


@needs_root
@pytest.mark.parametrize("parent_mode", [0o777, 0o1777])
def test_a_checkpoint_dir_under_a_parent_another_user_owns_and_anyone_writes_is_refused(
    tmp_path: Path, parent_mode: int
) -> None:
    parent = tmp_path / "shared"
    parent.mkdir()
    parent.chmod(parent_mode)
    os.chown(parent, OTHER, OTHER)  # its owner can rename anything in it, sticky or not
    ckpt = parent / "ckpt"
    ckpt.mkdir(mode=0o700)  # even the user's own directory: the parent's owner can swap it
    with pytest.raises(torchstep.SpecError) as err:
        torchstep.run_local(app(["--epochs", "1"]), cfg={"checkpoint_dir": str(ckpt)}, log_dir=str(tmp_path / "logs"))
    text = str(err.value)
    assert "cfg['checkpoint_dir']" in text and str(parent) in text and f"owned by uid {OTHER}" in text
    assert os.listdir(ckpt) == []  # nothing started


@pytest.mark.parametrize("parent_mode, ok", [(0o777, False), (0o770, False), (0o1777, True), (0o755, True)])
def test_every_directory_above_the_checkpoint_dir_follows_strictmodes(
    tmp_path: Path, parent_mode: int, ok: bool
) -> None:
    parent = tmp_path / "parent"
    parent.mkdir()
    parent.chmod(parent_mode)
    ckpt = parent / "a" / "ckpt"
    run = lambda: torchstep.run_local(  # noqa: E731
        app(["--epochs", "1"]), cfg={"checkpoint_dir": str(ckpt)}, log_dir=str(tmp_path / "logs")
    )
    if ok:  # root's (the caller's) and not writable by others, or sticky like /tmp
        assert run().state == "SUCCEEDED" and os.listdir(ckpt) == ["epoch-000"]
        return
    with pytest.raises(torchstep.SpecError) as err:
        run()
    assert str(parent) in str(err.value) and "not sticky" in str(err.value) and "chmod go-w" in str(err.value)
    assert not (parent / "a").exists()  # refused before anything was created under it


def test_an_existing_checkpoint_dir_keeps_its_mode_refused_if_others_can_write_it(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    ckpt.chmod(0o775)
    with pytest.raises(torchstep.SpecError) as err:
        torchstep.run_local(app(["--epochs", "1"]), cfg={"checkpoint_dir": str(ckpt)}, log_dir=str(tmp_path / "logs"))
    assert f"chmod go-w {ckpt}" in str(err.value) and stat.S_IMODE(ckpt.stat().st_mode) == 0o775
    ckpt.chmod(0o755)  # readable by others: the user's choice, kept, and said
    result = torchstep.run_local(
        app(["--epochs", "1"]), cfg={"checkpoint_dir": str(ckpt)}, log_dir=str(tmp_path / "logs")
    )
    assert result.state == "SUCCEEDED" and stat.S_IMODE(ckpt.stat().st_mode) == 0o755
    assert any("readable by others (mode 0755)" in w and "chmod 700" in w for w in result.warnings), result.warnings
    assert prepare_checkpoint_dir(tmp_path / "new") == [] and stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700


@needs_root
def test_a_file_planted_by_another_user_is_never_the_last_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "epoch-001").write_text("1")
    os.utime(tmp_path / "epoch-001", (1, 1))
    planted = plant(tmp_path, "epoch-999")
    seen: list[str] = []
    assert latest_checkpoint(tmp_path, warn=seen.append) == str(tmp_path / "epoch-001")
    assert seen == [
        f"checkpoint {planted} skipped: owned by uid {OTHER}, not by you (uid 0): another user may have "
        f"planted it; fix: remove it (and check who can write {tmp_path})"
    ]
    os.chown(planted, 0, 0)
    planted.chmod(0o666)  # the caller's, but anyone who reaches it could have rewritten it
    tmp_path.chmod(0o701)
    assert latest_checkpoint(tmp_path, warn=seen.append) == str(tmp_path / "epoch-001")
    assert "writable by others (mode 0666)" in seen[-1]
    tmp_path.chmod(0o700)  # nobody else can reach it: its mode does not matter
    assert latest_checkpoint(tmp_path, warn=seen.append) == str(planted)
    with pytest.warns(CheckpointWarning, match="owned by uid"):  # the default: a warning in the worker's log
        os.chown(planted, OTHER, OTHER)
        assert latest_checkpoint(tmp_path) == str(tmp_path / "epoch-001")


@needs_root
def test_last_checkpoint_checks_again_on_every_call_inside_a_running_worker(tmp_path: Path) -> None:
    """The entry is planted *after* the supervisor checked the directory and started the
    worker: the worker's own torchstep.last_checkpoint() still refuses it, and says why."""
    ckpt = tmp_path / "ckpt"
    script = tmp_path / "late.py"
    script.write_text(LATE)
    marker = tmp_path / "planted"

    def attacker() -> None:
        deadline = time.time() + 60
        while not (ckpt / "epoch-000").exists() and time.time() < deadline:
            time.sleep(0.05)
        plant(ckpt, "epoch-999")
        marker.write_text("")

    t = threading.Thread(target=attacker)
    t.start()
    result = torchstep.run_local(
        app([str(marker)], entry=str(script)), cfg={"checkpoint_dir": str(ckpt)}, log_dir=str(tmp_path / "logs")
    )
    t.join()
    assert result.state == "SUCCEEDED", result.message
    assert result.outputs == {"last": "epoch-000"}  # the genuine one, not the planted newer one
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").rglob("*.log"))
    assert "CheckpointWarning" in logs and f"{ckpt}/epoch-999 skipped: owned by uid {OTHER}" in logs


@needs_root
def test_a_retry_resumes_from_the_genuine_checkpoint_not_a_planted_newer_one(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    first = torchstep.run_local(
        app(["--epochs", "2"]), cfg={"checkpoint_dir": str(ckpt)}, log_dir=str(tmp_path / "logs")
    )
    assert first.state == "SUCCEEDED" and sorted(os.listdir(ckpt)) == ["epoch-000", "epoch-001"]
    plant(ckpt, "epoch-999")  # between the tries
    second = torchstep.run_local(
        app(["--epochs", "3"]), cfg={"checkpoint_dir": str(ckpt)}, log_dir=str(tmp_path / "logs")
    )
    assert second.state == "SUCCEEDED" and second.outputs == {"first_epoch": 2}
    assert any(f"{ckpt}/epoch-999 skipped: owned by uid {OTHER}" in w for w in second.warnings), second.warnings


def test_a_checkpoint_dir_others_can_write_is_refused_when_looked_at(tmp_path: Path) -> None:
    (tmp_path / "epoch-000").write_text("0")
    tmp_path.chmod(0o777)
    with pytest.raises(UnsafePathError, match="writable by its group and others"):
        latest_checkpoint(tmp_path)
    tmp_path.chmod(0o700)
    assert latest_checkpoint(tmp_path) == str(tmp_path / "epoch-000")
