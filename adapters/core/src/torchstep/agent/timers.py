"""Stuck-worker detection: torch's file timer server (without its self-kill) and the
heartbeat watch.

* :class:`ReapingTimerServer` is torch's ``FileTimerServer`` with one change: an expired
  ``timer.expires()`` kills the stuck worker's *process group* through a callback and
  never the agent (the stock server SIGKILLs its own process too, pytorch#141060, so
  torchrun dies and ignores ``--max-restarts``).
* :class:`HeartbeatWatch` finds workers whose heartbeat file (touched by
  ``torchstep.heartbeat()``) is older than ``--heartbeat-timeout``.

Example::

    server = ReapingTimerServer("/run/timer.fifo", run_id="r1", on_expired=agent.kill_stuck)
    server.start()     # workers get TORCHELASTIC_TIMER_FILE=/run/timer.fifo
    ...
    server.stop()
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from torch.distributed.elastic.timer import FileTimerRequest, FileTimerServer

log = logging.getLogger("torchstep.agent")


class ReapingTimerServer(FileTimerServer):
    """``FileTimerServer`` that hands expired timers to ``on_expired(pid, scope, signal)``.

    ``on_expired`` runs in the server's thread; it must kill the worker (the agent kills
    the whole process group, so e.g. dataloader children die too).

    Example: see the module docstring.
    """

    def __init__(self, file_path: str, run_id: str, on_expired: Callable[[int, str, int], None]) -> None:
        super().__init__(file_path, run_id, max_interval=0.1, daemon=True, log_event=self._on_event)
        self._on_expired = on_expired
        self._scopes: dict[int, str] = {}

    def _on_event(self, name: str, request: FileTimerRequest | None) -> None:
        if name == "timer expired" and request is not None:
            self._scopes[request.worker_pid] = request.scope_id

    def _reap_worker(self, worker_pid: int, signal: int) -> bool:
        if worker_pid == os.getpid():
            return True  # pytorch#141060: the stock server kills itself (the agent) here
        scope = self._scopes.pop(worker_pid, "?")
        try:
            self._on_expired(worker_pid, scope, signal)
        except Exception:
            log.exception("could not reap worker pid %s (timer %s)", worker_pid, scope)
            return False
        return True

    def stop(self) -> None:
        self._stop_signaled = True
        # the watchdog thread may still block in open() of the FIFO (no worker used a
        # timer): opening the write end wakes it so the thread really ends
        try:
            fd = os.open(self._file_path, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        except OSError as e:
            if e.errno not in (errno.ENXIO, errno.ENOENT):
                log.debug("timer FIFO poke failed: %s", e)
        super().stop()


@dataclass
class StaleHeartbeat:
    """A worker whose heartbeat is older than the timeout.

    Example: ``StaleHeartbeat(local_rank=1, age_s=12.3)``.
    """

    local_rank: int
    age_s: float


class HeartbeatWatch:
    """Checks heartbeat files' modification times (one ``stat`` per worker per call).

    Example::

        >>> import tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> w = HeartbeatWatch(timeout_s=60)
        >>> w.reset({0: os.path.join(d, "hb0")})
        >>> w.stale(alive={0})
        []
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._files: dict[int, str] = {}

    def reset(self, files: dict[int, str]) -> None:
        """New worker group: create each file now (the clock starts at worker start)."""
        self._files = dict(files)
        for path in files.values():
            with open(path, "w"):
                pass

    def stale(self, *, alive: set[int]) -> list[StaleHeartbeat]:
        now = time.time()
        found = []
        for local_rank, path in self._files.items():
            if local_rank not in alive:
                continue
            try:
                age = now - os.stat(path).st_mtime
            except FileNotFoundError:  # removed by the worker? count from now
                with open(path, "w"):
                    pass
                continue
            if age > self.timeout_s:
                found.append(StaleHeartbeat(local_rank, age))
        return found
