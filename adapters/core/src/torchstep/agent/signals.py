"""Signal handling of the agent over its whole life, so a signal never skips the result.

* early (before torch is imported): a handled signal raises :class:`Cancelled`;
* running: torch's own handler (``SignalException``), which ``TorchstepAgent.run``
  forwards to the workers with the grace period;
* late (the run is over, the result is being written): signals are noted and ignored,
  so writing the result cannot be interrupted half-way.

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


def _raise_cancelled(signum: int, frame: FrameType | None) -> None:
    raise Cancelled(signum)


def install_early(names: str) -> None:
    """Handle ``names`` from the first line of ``main``: raise :class:`Cancelled`.

    Example: ``install_early("SIGTERM,SIGINT")`` (see the module example).
    """
    _handled[:] = parse(names)
    _set(_raise_cancelled)


def install_torch(names: str) -> None:
    """Switch to torch's handler (raises ``SignalException``), as ``PContext.start`` does.

    Example: ``install_torch(settings.config.signals_to_handle)`` once torch is imported.
    """
    from torch.distributed.elastic.multiprocessing.api import _terminate_process_handler

    _handled[:] = parse(names)
    _set(_terminate_process_handler)


def _late(signum: int, frame: FrameType | None) -> None:
    log.warning("received %s while writing the result: ignored", signal.Signals(signum).name)


def enter_late_mode() -> None:
    """The run is over: note signals, do not raise.

    Example: ``enter_late_mode()`` before writing the final result.
    """
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
