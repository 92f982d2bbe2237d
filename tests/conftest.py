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

#: SIGINT's and SIGTERM's handlers as the session began (see ``_signal_handlers``).
_BASELINE: dict[signal.Signals, object] = {}


def pytest_configure(config: pytest.Config) -> None:
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    _BASELINE.update({s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)})


@pytest.fixture(autouse=True)
def _signal_handlers() -> Iterator[None]:
    """Each test leaves SIGINT and SIGTERM as it found them. A test that builds torchx's
    LocalScheduler in the main thread installs torchx's handlers, which raise its
    ``SignalException``; a later test of the same worker that plays Ctrl-C
    (``_thread.interrupt_main``) would otherwise get that instead of KeyboardInterrupt. A
    module or session fixture that built one before this test began left them too (a CI
    simulation: tests/steps/test_runner.py after such a module on the same worker): a test
    starts with the session's own handlers in their place."""
    for s, handler in list(_BASELINE.items()):
        if str(getattr(signal.getsignal(s), "__module__", "")).startswith("torchx"):
            signal.signal(s, handler)  # type: ignore[arg-type]
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


# -- how pytest-xdist shares the suite among its workers (`make unit`: --dist loadscope) ------
#: Modules whose tests share no module- or class-scoped fixture and run long: each test is a
#: work unit of its own, so that several workers share them. Every other module is one unit,
#: run by one worker, so that its module fixtures (an Airflow deployment, a Prefect server,
#: a cluster, a browser) start once instead of once per worker that ran one of its tests.
SPREAD_MODULES = frozenset(
    {
        "tests/agent/test_agent_multinode.py",
        "tests/agent/test_agent_restarts.py",
        "tests/agent/test_hang.py",
        "tests/agent/test_silent_host.py",
        "tests/agent/test_store_takeover.py",
        "tests/airflow/test_batch_training.py",
        "tests/bench/test_airflow_parse.py",
        "tests/cluster/test_kueue.py",
        "tests/cluster/test_preemption.py",
        "tests/e2e/test_batch_components.py",
        "tests/e2e/test_example_output.py",
        "tests/local/test_cli.py",
        "tests/local/test_replica_policy.py",
        "tests/local/test_run_local.py",
        "tests/prefect/test_torchx_policy.py",
        "tests/soak/test_soak_kubernetes.py",
        "tests/soak/test_soak_smoke.py",  # its module fixture only stops what its runs started
    }
)
#: A test's expected seconds when it does not say: ``@pytest.mark.slow`` or ``slow(seconds=N)``.
SLOW_S, QUICK_S = 60.0, 1.0


def work_unit(nodeid: str) -> str:
    """The xdist work unit of a test: its module (or class), or the test itself in a
    :data:`SPREAD_MODULES` module."""
    module = nodeid.split("::", 1)[0]
    return nodeid if module in SPREAD_MODULES else nodeid.rsplit("::", 1)[0]


def expected_s(item: pytest.Item) -> float:
    slow = item.get_closest_marker("slow")
    return float(slow.kwargs.get("seconds", SLOW_S)) if slow is not None else QUICK_S


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest work units first (a unit keeps its tests' order): the workers start on
    the demo, the deployments and the clusters, and the suite does not end waiting on one
    of them started last. Every worker sorts alike, as xdist requires."""
    units: dict[str, float] = {}
    for item in items:
        unit = work_unit(item.nodeid)
        units[unit] = units.get(unit, 0.0) + expected_s(item)
    order = {unit: i for i, unit in enumerate(sorted(units, key=lambda u: -units[u]))}
    items.sort(key=lambda item: order[work_unit(item.nodeid)])  # stable: a unit's order stays


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under ``--dist loadscope``: :func:`work_unit`'s units, in collection order."""
    if config.getoption("dist", None) != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return WorkUnitScheduling(config, log)
