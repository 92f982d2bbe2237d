"""Helpers of the local-launcher tests: the leak check, polling, AppDef builders."""

from __future__ import annotations

import glob
import os
import sys
import threading
from pathlib import Path
from typing import Any

from proclib import procs_with_env

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WORKER = str(HERE / "scripts" / "worker.py")
#: Set in the test's environment: every process a test starts inherits it.
TOKEN_ENV = "TORCHSTEP_TEST_TOKEN"


def pids_with(token: str) -> list[int]:
    """Live processes (not zombies) started with ``TORCHSTEP_TEST_TOKEN=token``."""
    return procs_with_env(f"{TOKEN_ENV}={token}")


def describe(pids: list[int]) -> str:
    lines = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            lines.append(f"{pid}: {cmd[:200]}")
        except OSError:
            pass
    return "\n".join(lines)


def rank_log_has(log_dir: Path, role: str, replica: int, text: str, *, newer_than: float = 0.0) -> bool:
    for path in glob.glob(str(log_dir / "*" / role / str(replica) / "attempt_*" / "rank*.log")):
        try:
            if os.path.getmtime(path) >= newer_than and text in Path(path).read_text(errors="replace"):
                return True
        except OSError:
            pass
    return False


def role(name: str, args: list[str], *, replicas: int = 1, nproc: int = 1, **kw: Any) -> Any:
    """A Role running ``python worker.py ARGS`` under the agent."""
    from torchx import specs

    metadata = kw.pop("metadata", {})
    if nproc != 1:
        metadata.setdefault("torchstep", {})["nproc_per_node"] = nproc
    return specs.Role(
        name=name,
        image=kw.pop("image", "unused"),
        entrypoint="python",
        args=[WORKER, *args],
        num_replicas=replicas,
        resource=kw.pop("resource", specs.Resource(cpu=-1, gpu=0, memMB=-1)),
        metadata=metadata,
        **kw,
    )


def cli(*args: str) -> list[str]:
    """The argv of ``torchstep run ARGS`` with this interpreter."""
    return [sys.executable, "-m", "torchstep.cli", "run", *args]


class BackgroundRun:
    """``run_local(app)`` blocking in a thread of its own while the test acts from another,
    as an orchestrator's worker runs a step while its ``on_kill`` may cancel it."""

    def __init__(self, app: Any, log_dir: Path, grace_period: float = 5) -> None:
        from torchstep.steps import run_local

        self.cancel = threading.Event()
        self._result: list[Any] = []
        self.thread = threading.Thread(
            target=lambda: self._result.append(
                run_local(app, log_dir=str(log_dir), cancel=self.cancel, cfg={"grace_period": grace_period})
            )
        )
        self.thread.start()

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self, timeout: float) -> None:
        """Cancel the run (a no-op once it ended) and wait at most ``timeout`` s for it."""
        self.cancel.set()
        self.thread.join(timeout)

    def result(self, timeout: float) -> Any:
        """The run's ``StepResult`` once it ended within ``timeout`` s (AssertionError if not)."""
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"run_local still running after {timeout:g} s"
        return self._result[0]
