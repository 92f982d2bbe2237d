"""The detached process of one ``torchstep_local`` app: ``python -m
torchstep.schedulers.supervisor APP_ID``.

It reads the record ``schedule`` wrote, runs the app with the local target (retrying the
whole app as ``torchstep run`` does, :func:`torchstep.steps.run_tries`: ``cfg["retries"]``,
else the AppDef's APPLICATION ``max_retries``), and keeps ``<app_id>.status`` current: the state, each replica's state,
the current attempt's run directory, and at the end the step result. SIGTERM, SIGINT or
SIGHUP (``torchx cancel``) stops every process of the run within the grace period; the
app ends CANCELLED. Its agents die with it (``PR_SET_PDEATHSIG``) if it is SIGKILLed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

from torchstep.files import write_private
from torchstep.local.status import PlainDisplay, ReplicaEvent
from torchstep.result import FAILED, PENDING, RUNNING
from torchstep.schedulers import local, records


class StatusWriter:
    """Keeps the status file of one app current (atomically rewritten on every change).

    A write that fails (a full disk) never stops the run: the status stays complete in
    memory, :attr:`lost` says why the file is behind (also on stderr, once), and the next
    change rewrites the whole file.
    """

    def __init__(self, app_id: str, log_dir: str) -> None:
        self.app_id = app_id
        self.path = local.status_path(app_id)
        self.lock = threading.Lock()
        self.status: dict[str, Any] = {"state": PENDING, "replicas": {}, "restarts": 0}
        self.log_dir = log_dir
        self.lost: str | None = None

    def update(self, **fields: Any) -> None:
        with self.lock:
            self.status.update(fields)
            self._save()

    def on_status(self, ev: ReplicaEvent) -> None:
        with self.lock:
            run_dir = os.path.join(self.log_dir, ev.app_id)
            if self.status.get("run_dir") != run_dir:  # a new attempt: only its replicas count
                self.status["replicas"] = {}
                self.status["run_dir"] = run_dir
            self.status["replicas"][f"{ev.role}/{ev.replica_id}"] = ev.state
            if ev.state == RUNNING:
                self.status["state"] = RUNNING
            self._save()

    def _save(self) -> None:
        try:
            write_private(self.path, json.dumps(self.status, default=str))
            self.lost = None
        except OSError as e:
            first = self.lost is None
            self.lost = f"status not written: {self.path}: {e.strerror or e}"
            if first:
                try:  # the console file may be on the same full disk
                    print(f"torchstep_local: {self.lost}", file=sys.stderr, flush=True)
                except (OSError, ValueError):
                    pass


def main(argv: Sequence[str] | None = None) -> int:
    from torchstep.components.appjson import app_from_dict
    from torchstep.local.options import resolve
    from torchstep.plan.planner import build_plan
    from torchstep.steps import run_tries

    app_id = records.check_app_id(next(iter(sys.argv[1:] if argv is None else argv)))
    record = records.load(local.BACKEND, app_id)
    if record is None:
        print(f"torchstep_local: no record of {app_id}", file=sys.stderr)
        return 2
    writer = StatusWriter(app_id, record["log_dir"])
    cancel = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        writer.update(message=f"cancelled ({signal.Signals(signum).name})")
        cancel.set()

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    try:
        plan = build_plan(app_from_dict(record["app"]), "local")
        opts = resolve(record["cfg"])
        writer.update(state=PENDING, started=time.time())
        # the run directory is <log_dir>/<app_id> (<app_id>-try<n> for a retry): torchx knows it
        result = run_tries(
            plan,
            attempt=None,
            cfg=record["cfg"],
            cancel=cancel,
            on_status=writer.on_status,
            display=PlainDisplay(show_output=opts.tee),
            app_id=app_id,
        )
    except Exception as e:  # a SpecError on this machine, or a bug: the app FAILED, said why
        writer.update(state=FAILED, message=f"{type(e).__name__}: {e}", ended=time.time())
        print(f"torchstep_local: {app_id} FAILED before it started: {e}", file=sys.stderr)
        return 1
    msg = result.message or ""
    if result.root_cause is not None and not result.succeeded:
        from torchstep.result import root_cause_line

        rc = result.root_cause
        msg = (
            f"root cause rank {rc.rank} ({rc.role} replica {rc.replica_id}) exit {rc.exit_code}: {root_cause_line(rc)}"
        )
    writer.update(
        state=result.state,
        message=msg or writer.status.get("message", ""),
        restarts=result.restarts + result.attempts - 1,
        run_dir=result.log_dir,
        result=json.loads(result.to_json()),
        ended=time.time(),
    )
    return 0 if result.succeeded else 1


if __name__ == "__main__":
    sys.exit(main())
