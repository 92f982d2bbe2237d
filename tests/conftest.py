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


#: The longest tests (a CI-like run on 2 cores, 4 workers: the demo 7 min, the tutorial 3, each
#: server's soak smoke 1-2), started first. pytest-xdist deals the first quarter of the suite
#: out one test at a time to each worker in turn, so these start at once, each on its own
#: worker; collected in place (the soak smoke is near the end), one ran on alone after every
#: other worker had finished.
LONGEST_FIRST = (
    "tests/e2e/test_demo.py::test_the_quick_demo_survives",
    "tests/docs/test_tutorial.py::test_the_tutorial_runs_as_written",
    "tests/soak/test_soak_smoke.py::test_soak_smoke_holds_every_invariant[server-",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return next((i for i, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)), len(LONGEST_FIRST))

    items.sort(key=rank)  # stable: every other test keeps its place
