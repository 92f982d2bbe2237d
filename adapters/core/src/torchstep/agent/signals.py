"""Signal handling of the agent over its whole life, so a signal never skips the result.

* early (before torch is imported): a handled signal raises :class:`Cancelled`;
* running: torch's own handler (``SignalException``), which ``TorchstepAgent.run``
  forwards to the workers with the grace period;
* late (the run is over, the result is being written): signals are noted and ignored,
  so writing the result cannot be interrupted half-way.

A handler raises in whatever code runs at that moment, and code the agent does not own
(torch's import, an ``except Exception`` of a library) may swallow that exception: the
agent would then run on as if nothing had arrived, and a SIGTERM that was sent once (a
parent's ``PR_SET_PDEATHSIG``) would never come again. So every handler also notes the
signal, and :func:`check` (called between the agent's phases and on every monitor tick)
raises it again until the agent has acted on it.

Example::

    >>> import signal
    >>> from torchstep.agent import signals
    >>> signals.install_early("SIGUSR2")
    >>> try:
    ...     signal.raise_signal(signal.SIGUSR2)
    ... except signals.Cancelled as e:
    ...     e.signum == signal.SIGUSR2
    True
    >>> signals.restore()
"""

from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import Any

log = logging.getLogger("torchstep.agent")

_handled: list[signal.Signals] = []
_previous: dict[signal.Signals, Any] = {}
_pending: list[signal.Signals] = []  # the first handled signal not acted on yet
_mode = "early"  # early | torch | late: what :func:`check` raises


class Cancelled(BaseException):
    """A handled signal arrived before the elastic agent was running.

    Example: ``Cancelled(15).signum`` is 15 (see the module example).
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"cancelled by {signal.Signals(signum).name}")
        self.signum = signum


def parse(names: str) -> list[signal.Signals]:
    """``"SIGTERM,SIGINT"`` -> signals (unknown names are skipped).

    Example::

        >>> [s.name for s in parse("SIGTERM, SIGNOPE,SIGUSR1")]
        ['SIGTERM', 'SIGUSR1']
    """
    found = []
    for name in names.split(","):
        sig = getattr(signal, name.strip(), None)
        if isinstance(sig, signal.Signals):
            found.append(sig)
    return found


def _set(handler: Any) -> None:
    for sig in _handled:
        try:
            previous = signal.signal(sig, handler)
            _previous.setdefault(sig, previous)
        except (ValueError, OSError):  # not the main thread, or not settable
            pass


def _note(signum: int) -> None:
    if not _pending:
        _pending.append(signal.Signals(signum))


def _raise_cancelled(signum: int, frame: FrameType | None) -> None:
    _note(signum)
    raise Cancelled(signum)


def _raise_torch(signum: int, frame: FrameType | None) -> None:
    from torchstep.agent import compat

    _note(signum)
    compat.terminate_process_handler(signum, frame)


def pending() -> int | None:
    """The handled signal that arrived and was not acted on yet (None: none).

    Example: ``signals.pending()`` is ``15`` once a SIGTERM arrived and until
    :func:`acted_on` or :func:`enter_late_mode`.
    """
    return int(_pending[0]) if _pending else None


def check() -> None:
    """Raise again a handled signal that arrived and was not acted on (its first exception
    was swallowed by code the agent does not own): :class:`Cancelled` before the agent runs,
    torch's ``SignalException`` while it does, nothing once the run is over.

    Example: ``signals.check()`` between two phases of the agent (see the module docstring).
    """
    if not _pending or _mode == "late":
        return
    if _mode == "early":
        raise Cancelled(_pending[0])
    _raise_torch(_pending[0], None)


def acted_on() -> None:
    """The agent is acting on the pending signal (it shuts the workers down): :func:`check`
    raises nothing for it any more.

    Example: ``signals.acted_on()`` where the agent catches ``SignalException``.
    """
    _pending.clear()


def install_early(names: str) -> None:
    """Handle ``names`` from the first line of ``main``: raise :class:`Cancelled`.

    Example: ``install_early("SIGTERM,SIGINT")`` (see the module example).
    """
    global _mode
    _mode = "early"
    _pending.clear()
    _handled[:] = parse(names)
    _set(_raise_cancelled)


def install_torch(names: str) -> None:
    """Switch to torch's handler (raises ``SignalException``), as ``PContext.start`` does,
    noting the signal too; again after each ``PContext.start`` (it sets torch's own).

    Example: ``install_torch(settings.config.signals_to_handle)`` once torch is imported.
    """
    global _mode
    _mode = "torch"
    _handled[:] = parse(names)
    _set(_raise_torch)


def _late(signum: int, frame: FrameType | None) -> None:
    log.warning("received %s while writing the result: ignored", signal.Signals(signum).name)


def enter_late_mode() -> None:
    """The run is over: note signals, do not raise.

    Example: ``enter_late_mode()`` before writing the final result.
    """
    global _mode
    _mode = "late"
    _pending.clear()
    _set(_late)


def restore() -> None:
    """Put back the handlers that were there before (tests, embedding).

    Example: ``restore()`` at the end of an embedded :func:`torchstep.agent.cli.run`.
    """
    for sig, previous in _previous.items():
        try:
            signal.signal(sig, previous)
        except (ValueError, OSError, TypeError):
            pass
    _previous.clear()
    _pending.clear()
