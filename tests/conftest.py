"""Suite-wide: the tests' child processes start with SIGINT and SIGQUIT at their defaults.

A shell that starts ``make test`` as a background job (``make test &``, a CI step run by a
non-interactive shell) starts it with SIGINT and SIGQUIT ignored, and every child inherits
that: a test that sends SIGINT to a child (Ctrl-C of ``torchstep run``, of a flow, the
demo's cancel) would wait for a process that never hears it. Handling them here resets
each child to the default (an exec resets a handled signal; an ignored one stays ignored).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def _signal_handlers() -> Iterator[None]:
    """Each test leaves SIGINT and SIGTERM as it found them. A test that builds torchx's
    LocalScheduler in the main thread installs torchx's handlers, which raise its
    ``SignalException``; a later test of the same worker that plays Ctrl-C
    (``_thread.interrupt_main``) would otherwise get that instead of KeyboardInterrupt."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in saved.items():
        if signal.getsignal(s) is not handler and handler is not None:
            signal.signal(s, handler)


@pytest.fixture(scope="session", autouse=True)
def _shared_tmp(tmp_path_factory: pytest.TempPathFactory) -> None:
    """TORCHSTEP_TESTS_SHARED_TMP: a directory every xdist worker of this run shares (the
    parent of the workers' own temp roots), for what is built once per run — the Airflow
    harness's migrated databases. Pytest keeps and cleans it like any temp root."""
    base = tmp_path_factory.getbasetemp()
    os.environ["TORCHSTEP_TESTS_SHARED_TMP"] = str(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)
