"""Suite-wide: the tests' child processes start with SIGINT and SIGQUIT at their defaults.

A shell that starts ``make test`` as a background job (``make test &``, a CI step run by a
non-interactive shell) starts it with SIGINT and SIGQUIT ignored, and every child inherits
that: a test that sends SIGINT to a child (Ctrl-C of ``torchstep run``, of a flow, the
demo's cancel) would wait for a process that never hears it. Handling them here resets
each child to the default (an exec resets a handled signal; an ignored one stays ignored).
"""

from __future__ import annotations

import signal

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
