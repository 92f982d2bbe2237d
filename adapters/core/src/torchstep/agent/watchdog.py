"""The no-progress watchdog: the agent fails (exit 83) instead of hanging.

The elastic loop reports each phase it enters with the longest time the phase may take
(rendezvous: join + last-call timeouts; stopping workers: the shutdown wait; exit
barrier: its timeout) and ticks on every monitor pass. The watchdog fires when

* a bounded phase overruns its bound by more than ``timeout_s`` (e.g. a store call that
  hangs on an unresponsive rendezvous store far beyond the join timeout), or
* in the monitoring phase no tick came for ``timeout_s`` while no worker is alive (the
  loop is wedged and nothing is running).

Firing calls ``on_fire(reason)`` from the watchdog thread; the agent kills its workers,
writes its result and exits with ``AGENT_ERROR_EXIT_CODE``.

Example::

    >>> import time
    >>> fired = []
    >>> wd = ProgressWatchdog(0.2, on_fire=fired.append, any_alive=lambda: False, period=0.05)
    >>> wd.start(); wd.phase("rendezvous", bound_s=0.1); time.sleep(0.6); wd.stop()
    >>> fired[0].startswith("rendezvous")
    True
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("torchstep.agent")


def stuck_in(thread_id: int | None = None) -> str | None:
    """Where in ``torch.distributed`` a thread is blocked: its outermost and innermost frames
    there (``DynamicRendezvousHandler.num_nodes_waiting -> C10dRendezvousBackend.get_state``), or
    ``None`` when it is not inside ``torch.distributed`` (or is gone).

    Args:
        thread_id: the thread's ident (default: the main thread's).

    Returns:
        The call chain's two ends, or None.

    Example::

        >>> stuck_in() is None  # the doctest's main thread is not in torch.distributed
        True
    """
    ident = threading.main_thread().ident if thread_id is None else thread_id
    frame: FrameType | None = sys._current_frames().get(ident or -1)
    inside: list[str] = []
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if "/torch/distributed/" in name:
            owner = frame.f_locals.get("self")
            inside.append(
                f"{type(owner).__name__}.{frame.f_code.co_name}" if owner is not None else frame.f_code.co_name
            )
        frame = frame.f_back
    if not inside:
        return None
    return inside[-1] if len(inside) == 1 else f"{inside[-1]} -> {inside[0]}"


class ProgressWatchdog:
    """See the module docstring.

    Example: ``ProgressWatchdog(60, on_fire=fail_fast, any_alive=agent.any_worker_alive).start()``.
    """

    def __init__(
        self,
        timeout_s: float,
        *,
        on_fire: Callable[[str], None],
        any_alive: Callable[[], bool],
        period: float = 0.5,
    ) -> None:
        self.timeout_s = timeout_s
        self._on_fire = on_fire
        self._any_alive = any_alive
        self._period = period
        self._lock = threading.Lock()
        self._phase = "starting"
        self._deadline: float | None = None  # monotonic; None = monitoring (tick based)
        self._last_tick = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired: str | None = None

    def start(self) -> None:
        if self.timeout_s <= 0:
            return
        self._thread = threading.Thread(target=self._run, name="torchstep-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def phase(self, name: str, bound_s: float | None = None) -> None:
        """Enter a phase; ``bound_s=None`` means the tick-based monitoring phase."""
        now = time.monotonic()
        with self._lock:
            self._phase = name
            self._deadline = None if bound_s is None else now + bound_s
            self._last_tick = now

    def tick(self) -> None:
        self._last_tick = time.monotonic()

    def _check(self) -> str | None:
        now = time.monotonic()
        with self._lock:
            phase, deadline, last = self._phase, self._deadline, self._last_tick
        if deadline is not None:
            late = now - deadline
            if late > self.timeout_s:
                return f"{phase} overran its bound by {late:.0f}s (watchdog timeout {self.timeout_s:g}s)"
            return None
        idle = now - last
        if idle > self.timeout_s and not self._any_alive():
            return (
                f"{phase}: the elastic loop made no progress for {idle:.0f}s with no live worker "
                f"(watchdog timeout {self.timeout_s:g}s)"
            )
        return None

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            reason = self._check()
            if reason is None:
                continue
            where = stuck_in()
            if where is not None:  # the likely cause: a store call that never returns
                reason += f"; the agent's main thread is blocked in torch.distributed: {where}"
                if "endezvous" in where or "Store" in where:
                    reason += " (the rendezvous store does not answer)"
            self.fired = reason
            log.error("watchdog: %s", reason)
            try:
                self._on_fire(reason)
            except Exception:
                log.exception("watchdog: the fail-fast handler failed")
            return
