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
    'torchstep: trainer replica 0 RUNNING (pid 42)\\n'
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

    Args:
        app_id: the run's id.
        role: the role's name.
        replica_id: the replica's index in the role.
        state: the new state (a TorchX ``AppState`` name).
        exit_code: the agent process's exit code once it ended; ``None`` before.
        ts: unix time of the change.
        pid: the agent process's pid, once started.
        incarnation: replacements of a lost agent so far (0: the first agent).
        message: why, when there is more to say (a signal, a lost replica).
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
        """One line for people: ``train replica 0 FAILED (exit 1): message`` (a replica is
        ``role replica N``; ``[role/N]`` is rank N's line prefix)."""
        extra = []
        if self.pid is not None and self.state == "RUNNING":
            extra.append(f"pid {self.pid}")
        if self.exit_code is not None:
            extra.append(f"exit {self.exit_code}")
        if self.incarnation:
            extra.append(f"replacement {self.incarnation}")
        text = f"{self.role} replica {self.replica_id} {self.state}"
        if extra:
            text += f" ({', '.join(extra)})"
        if self.message:
            text += f": {self.message}"
        return text


#: ``on_status`` callbacks take one event.
StatusCallback = Callable[[ReplicaEvent], None]


class PlainDisplay:
    """Plain lines on a stream (thread-safe).

    Args:
        stream: where the lines go; ``None``: ``sys.stdout``.
        show_output: whether the workers' output lines are shown too (events always are).
    """

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
        """A run (one attempt) starts.

        Args:
            app_id: the run's id.
            log_dir: where its logs and result go.
        """
        self.note(f"{app_id}: logs and result under {log_dir}")

    def event(self, ev: ReplicaEvent) -> None:
        """Show a replica's change of state.

        Args:
            ev: the change.
        """
        self._write(f"torchstep: {ev.describe()}")

    def note(self, text: str) -> None:
        """Show a line of torchstep's own (prefixed ``torchstep:``).

        Args:
            text: the line.
        """
        self._write(f"torchstep: {text}")

    def line(self, text: str) -> None:
        """Show a line of the workers' output (when ``show_output``).

        Args:
            text: the line, as the agent prefixed it.
        """
        if self.show_output:
            self._write(text)

    def close(self) -> None:
        """The run is over: release the display."""
        pass


_STYLE = {"SUCCEEDED": "green", "FAILED": "red", "CANCELLED": "yellow", "RUNNING": "cyan", "PENDING": "dim"}


class RichDisplay(PlainDisplay):
    """A live table (role, replica, state, pid, exit) above the scrolling output; the
    methods are :class:`PlainDisplay`'s.

    Args:
        title: the table's title until :meth:`begin` names the run.
        show_output: whether the workers' output lines are shown too.

    Raises:
        ImportError: ``rich`` (the ``[cli]`` extra) is not installed.
    """

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
        """A run (one attempt) starts: the table is emptied and titled with it.

        Args:
            app_id: the run's id.
            log_dir: where its logs and result go.
        """
        with self._lock:
            self.title = f"{app_id} — logs: {log_dir}"
            self.rows = {}
            self.live.update(self._table())

    def event(self, ev: ReplicaEvent) -> None:
        """Update the replica's row; an event with a message is printed too.

        Args:
            ev: the change.
        """
        with self._lock:
            self.rows[(ev.role, ev.replica_id)] = ev
            self.live.update(self._table())
            if ev.message:
                self.console.print(f"torchstep: {ev.describe()}", markup=False, highlight=False)

    def note(self, text: str) -> None:
        """Print a line of torchstep's own above the table.

        Args:
            text: the line.
        """
        with self._lock:
            self.console.print(f"torchstep: {text}", markup=False, highlight=False)

    def line(self, text: str) -> None:
        """Print a line of the workers' output above the table (when ``show_output``).

        Args:
            text: the line.
        """
        if self.show_output:
            with self._lock:
                self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        """Draw the table a last time and stop refreshing it."""
        with self._lock:
            self.live.update(self._table())
            self.live.stop()


def make_display(*, show_output: bool = True, live: bool | None = None) -> PlainDisplay:
    """A :class:`RichDisplay` when stdout is a terminal (or ``live=True``), else plain lines.

    Args:
        show_output: whether the workers' output lines are shown too.
        live: ``True``/``False`` forces the live table on or off; ``None``: when stdout is a terminal.

    Returns:
        The display (plain lines when ``rich`` is not installed).
    """
    if live is None:
        live = sys.stdout.isatty()
    if live:
        try:
            return RichDisplay(show_output=show_output)
        except ImportError:  # rich is the optional [cli] extra
            pass
    return PlainDisplay(sys.stdout, show_output=show_output)
