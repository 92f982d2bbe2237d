"""Status of a local run: per-replica state-change events, and how they are shown — a live
``rich`` table when stdout is a terminal, plain lines otherwise. Process output (already
prefixed ``[role/rank]`` by the agent) goes through the same display so the two never
garble each other.

Example::

    >>> import io
    >>> from torchstep.local.status import PlainDisplay, ReplicaEvent
    >>> out = io.StringIO()
    >>> PlainDisplay(out).event(ReplicaEvent("demo-1a2b", "trainer", 0, "RUNNING", None, 0.0, pid=42))
    >>> out.getvalue()
    'torchstep: trainer/0 RUNNING (pid 42)\\n'
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO


@dataclass(frozen=True)
class ReplicaEvent:
    """A replica (one agent process) changed state.

    ``state`` is a TorchX ``AppState`` name: ``PENDING`` (about to start), ``RUNNING`` (its
    agent process is up), ``SUCCEEDED``, ``FAILED`` or ``CANCELLED``. ``incarnation`` counts
    replacements of a lost agent (0 = the first agent of this replica).
    """

    app_id: str
    role: str
    replica_id: int
    state: str
    exit_code: int | None
    ts: float
    pid: int | None = None
    incarnation: int = 0
    message: str | None = None

    def describe(self) -> str:
        extra = []
        if self.pid is not None and self.state == "RUNNING":
            extra.append(f"pid {self.pid}")
        if self.exit_code is not None:
            extra.append(f"exit {self.exit_code}")
        if self.incarnation:
            extra.append(f"replacement {self.incarnation}")
        text = f"{self.role}/{self.replica_id} {self.state}"
        if extra:
            text += f" ({', '.join(extra)})"
        if self.message:
            text += f": {self.message}"
        return text


#: ``on_status`` callbacks take one event.
StatusCallback = Callable[[ReplicaEvent], None]


class PlainDisplay:
    """Plain lines on a stream (thread-safe)."""

    def __init__(self, stream: TextIO | None = None, *, show_output: bool = True) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.show_output = show_output
        self._lock = threading.Lock()

    def _write(self, text: str) -> None:
        with self._lock:
            try:
                self.stream.write(text + "\n")
                self.stream.flush()
            except (OSError, ValueError):  # closed or broken stdout must not stop the run
                pass

    def begin(self, app_id: str, log_dir: str) -> None:
        """A run (one attempt) starts."""
        self.note(f"{app_id}: logs and result under {log_dir}")

    def event(self, ev: ReplicaEvent) -> None:
        self._write(f"torchstep: {ev.describe()}")

    def note(self, text: str) -> None:
        self._write(f"torchstep: {text}")

    def line(self, text: str) -> None:
        if self.show_output:
            self._write(text)

    def close(self) -> None:
        pass


_STYLE = {"SUCCEEDED": "green", "FAILED": "red", "CANCELLED": "yellow", "RUNNING": "cyan", "PENDING": "dim"}


class RichDisplay(PlainDisplay):
    """A live table (role, replica, state, pid, exit) above the scrolling output."""

    def __init__(self, title: str = "torchstep", *, show_output: bool = True) -> None:
        from rich.console import Console
        from rich.live import Live

        super().__init__(sys.stdout, show_output=show_output)
        self.title = title
        self.rows: dict[tuple[str, int], ReplicaEvent] = {}
        self.console = Console()
        self.live = Live(self._table(), console=self.console, refresh_per_second=4, transient=False)
        self.live.start()

    def _table(self) -> Any:
        from rich.table import Table

        t = Table(title=self.title, expand=False)
        for col in ("role", "replica", "state", "pid", "exit"):
            t.add_column(col)
        for _, ev in sorted(self.rows.items()):
            style = _STYLE.get(ev.state, "")
            t.add_row(
                ev.role,
                str(ev.replica_id) + (f" (#{ev.incarnation})" if ev.incarnation else ""),
                f"[{style}]{ev.state}[/]" if style else ev.state,
                str(ev.pid or ""),
                "" if ev.exit_code is None else str(ev.exit_code),
            )
        return t

    def begin(self, app_id: str, log_dir: str) -> None:
        with self._lock:
            self.title = f"{app_id} — logs: {log_dir}"
            self.rows = {}
            self.live.update(self._table())

    def event(self, ev: ReplicaEvent) -> None:
        with self._lock:
            self.rows[(ev.role, ev.replica_id)] = ev
            self.live.update(self._table())
            if ev.message:
                self.console.print(f"torchstep: {ev.describe()}", markup=False, highlight=False)

    def note(self, text: str) -> None:
        with self._lock:
            self.console.print(f"torchstep: {text}", markup=False, highlight=False)

    def line(self, text: str) -> None:
        if self.show_output:
            with self._lock:
                self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        with self._lock:
            self.live.update(self._table())
            self.live.stop()


def make_display(*, show_output: bool = True, live: bool | None = None) -> PlainDisplay:
    """A :class:`RichDisplay` when stdout is a terminal (or ``live=True``), else plain lines."""
    if live is None:
        live = sys.stdout.isatty()
    if live:
        try:
            return RichDisplay(show_output=show_output)
        except ImportError:  # rich is the optional [cli] extra
            pass
    return PlainDisplay(sys.stdout, show_output=show_output)
