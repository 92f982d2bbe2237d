"""The local target inside an Airflow worker: ``torchstep.run_local`` in a helper thread.

The task's main thread only waits, so whatever Airflow raises there — the
``execution_timeout`` alarm, a SIGTERM when the task is cleared or marked failed — lands
in the wait, never inside the launcher's own cleanup. Either way the run is cancelled
(SIGTERM to every agent, SIGKILL after the grace period) and waited for before the
exception goes on: no process outlives the task. Every rank's ``[role/rank]``-prefixed
output is printed by ``run_local`` as it happens, which the task log captures.

Example::

    step = LocalStep(app, run_id="train.fit.manual__1.try1", cfg={}, log=logging.getLogger())
    result = step.run(context)   # blocks; step.cancel() from another thread stops it
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchstep.result import StepResult

#: Seconds to wait, after a cancel, beyond the run's own grace period (the launcher sends
#: SIGTERM, waits ``grace_period``, then SIGKILLs and reaps everything).
CANCEL_MARGIN_S = 30.0
POLL_S = 0.2


class LocalStep:
    """One try of an AppDef on the local target (see the module docstring)."""

    def __init__(self, app: Any, *, run_id: str, cfg: Mapping[str, Any], log: logging.Logger | Any) -> None:
        from torchstep.errors import SpecError

        if cfg.get("run_id") not in (None, run_id):
            raise SpecError("cfg['run_id']", "local", "the run id is set by Airflow (per task try)", fix="remove it")
        self.app = app
        self.run_id = run_id
        # the app id (${app_id}, the log directory) derives from the Airflow run and try
        self.cfg = {**cfg, "run_id": run_id}
        self.log = log
        self._cancel = threading.Event()
        #: the step result once the run ended (also when the wait was interrupted)
        self.result: StepResult | None = None

    def run(self, context: Any = None) -> StepResult:
        """Run to the end and return the step result (re-raises what interrupts the wait)."""
        from torchstep.local import run_local

        box: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                self.result = run_local(self.app, cfg=self.cfg, cancel=self._cancel)
            except BaseException as e:  # handed to the waiting thread
                box["error"] = e
            finally:
                done.set()

        # Wait on an Event, not Thread.join: a signal handler raising inside join() makes
        # Python 3.11 mark the still-running thread as stopped (bpo-45274's fix misfires).
        threading.Thread(target=target, name=f"torchstep-local-{self.run_id}", daemon=True).start()
        try:
            while not done.wait(POLL_S):
                pass
        except BaseException:  # execution_timeout, SIGTERM, Ctrl-C: stop everything first
            self.cancel()
            if not done.wait(float(self.cfg.get("grace_period") or 10.0) + CANCEL_MARGIN_S):
                self.log.error("torchstep: the local run did not stop within the grace period")
            raise
        if "error" in box:
            raise box["error"]
        assert self.result is not None
        return self.result

    def cancel(self) -> None:
        """Stop every process of the run (from any thread); ``run`` then returns CANCELLED."""
        self._cancel.set()
