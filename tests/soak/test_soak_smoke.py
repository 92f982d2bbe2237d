"""The smoke campaign of ``make soak`` (issue 27) in ``make test``: a fixed-seed plan that
covers every fault class and every surface the campaign drives (``campaign.smoke_pairs``:
every class on the surfaces without a server, and on every surface the classes it implements
itself), every invariant held (a test per run, or per server for the surfaces that start
one); plus the plan's determinism. ``make soak`` covers every (surface, class) pair."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from tools.soak import campaign, closing, invariants  # noqa: E402
from tools.soak.model import Observation, Run  # noqa: E402

SEED = campaign.SMOKE_SEED
SMOKE = campaign.plan(SEED, len(campaign.smoke_pairs(SEED)), cover=campaign.smoke_pairs(SEED))


def _server_group(run: Run) -> str | None:
    """The server a run's surface starts (``SERVER = True``: Prefect, Airflow...; surfaces that
    share one name it in ``GROUP``), or None."""
    module = campaign.SURFACES[run.surface]
    return getattr(module, "GROUP", run.surface) if getattr(module, "SERVER", False) else None


#: Runs of surfaces without a server: a test each (pytest-xdist spreads them).
ALONE = [r for r in SMOKE if _server_group(r) is None]
#: Runs of a server's surfaces: one test per server, its runs one after the other on one
#: worker, so that the server starts once (xdist_group marks do not group under pytest 9:
#: an item's node id can no longer be given the group's suffix).
SERVED: dict[str, list[Run]] = {}
for _run in SMOKE:
    if (_group := _server_group(_run)) is not None:
        SERVED.setdefault(_group, []).append(_run)


def _execute(run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[str]]:
    """Run ``run``; what went wrong (empty: every invariant held and the fault struck) and what
    it said. The run's directory, state and temp files are private to it, and short (a deep
    TMPDIR leaves no room for the worker zygote's Unix socket path: workers would start by exec)."""
    short = Path(tempfile.mkdtemp(prefix="soak", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(short))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state" / str(run.index)))
    said: list[str] = []
    try:
        (outcome,) = campaign.execute([run], SEED, say=said.append, root=short)
    finally:
        shutil.rmtree(short, ignore_errors=True)
    if outcome.skipped:  # the surface cannot run on this machine (the one-machine cluster: root...)
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run the {run.surface} surface: {outcome.skipped}")
        pytest.skip(f"{run.surface}: {outcome.skipped}")
    wrong = [f"{run.key}: {v.invariant}: {v.detail}" for v in outcome.violations]
    no_disk = any("no tmpfs" in note for note in outcome.observation.notes)
    if not wrong and not no_disk and not outcome.observation.injected and run.fault != "none":
        wrong.append(f"{run.key}: the fault never struck")
    return wrong, said


@pytest.fixture(scope="module", autouse=True)
def _stop_what_surfaces_started():
    """Servers and deployments of the server surfaces: stopped here, since pytest-xdist's
    workers end without running atexit handlers (they were left running before)."""
    yield
    closing.close_all()


def test_the_smoke_plan_covers_every_fault_class_and_every_surface() -> None:
    every = set(campaign.pairs(list(campaign.SURFACES))) - set(campaign.SMOKE_ELSEWHERE)
    smoke = {(r.surface, r.fault) for r in SMOKE}
    assert len(smoke) == len(SMOKE) and smoke <= every  # no pair twice, none a surface cannot inject
    assert {f for _, f in smoke} == {f for _, f in every}
    for surface in campaign.SURFACES:
        own = {f for s, f in every if s == surface}
        want = own if surface in campaign.SMOKE_EVERY_CLASS else own & set(campaign.SMOKE_OWN_PATH)
        assert want and want <= {f for s, f in smoke if s == surface}, surface
        assert len({f for s, f in smoke if s == surface}) > len(want & set(campaign.SMOKE_OWN_PATH)), surface


def test_make_soak_covers_every_pair_before_it_draws_at_random() -> None:
    every = campaign.pairs(list(campaign.SURFACES))
    runs = campaign.plan(11, len(every) + 5)
    assert {(r.surface, r.fault) for r in runs[: len(every)]} == set(every)


def test_the_same_seed_replays_the_same_campaign() -> None:
    assert campaign.plan(5, 40) == campaign.plan(5, 40)
    assert campaign.plan(5, 40) != campaign.plan(6, 40)
    run = campaign.plan(5, 40)[17]
    assert Run.parse(run.key, run.index) == run


def test_a_gap_or_a_repeated_line_is_a_violation() -> None:
    lines = [f"[soak/1] soak rank=1 attempt=0 pid=7 line={n}" for n in (0, 1, 1, 3)]
    obs = Observation(rc=0, duration_s=1, result=None, result_source="none", console="\n".join(lines), run_dir=None)
    (bad,) = invariants.check_lines(obs, 4, complete=False)
    assert "pid 7 printed lines [0, 1, 1, 3]" in bad


def _units() -> list[object]:
    """The smoke's tests: the lone runs, with each server's runs as one test among them, spread
    out (pytest-xdist hands out consecutive tests in chunks: adjacent servers would queue on one
    worker)."""
    units: list[object] = [pytest.param(r, id=r.key) for r in ALONE]
    step = max(1, len(units) // max(1, len(SERVED)))
    for i, group in enumerate(SERVED):
        units.insert(i * (step + 1), pytest.param(group, id=f"server-{group}", marks=pytest.mark.timeout(1500)))
    return units


@pytest.mark.slow
@pytest.mark.parametrize("unit", _units())
def test_soak_smoke_holds_every_invariant(unit: Run | str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One run of a surface without a server, or every run of the surfaces of one server (a
    Prefect server, an Airflow deployment...) one after the other: each run is made, then every
    violation told."""
    runs = [unit] if isinstance(unit, Run) else SERVED[unit]
    wrong: list[str] = []
    said: list[str] = []
    for run in runs:
        bad, lines = _execute(run, tmp_path, monkeypatch)
        wrong += bad
        said += lines
    assert not wrong, "\n".join(wrong) + "\n\n" + "\n".join(said)
    if isinstance(unit, Run) and any("no tmpfs" in line for line in said):
        pytest.skip("a full log disk needs a tmpfs (root, CAP_SYS_ADMIN): " + "\n".join(said))


def test_a_non_retryable_error_whose_workers_ran_again_is_a_violation(tmp_path: Path) -> None:
    run_dir = tmp_path / "soak-abc"
    (run_dir / "soak" / "1" / "attempt_1").mkdir(parents=True)
    for d in (run_dir, run_dir / "soak", run_dir / "soak" / "1", run_dir / "soak" / "1" / "attempt_1"):
        d.chmod(0o700)
    result = {
        "state": "FAILED",
        "exit_code": 82,
        "restarts": 1,
        "attempts": 1,
        "retryable": False,
        "root_cause": {"rank": 3},
    }
    obs = Observation(rc=82, duration_s=1, result=result, result_source="result.json", console="", run_dir=run_dir)
    (bad,) = invariants.check(Run(0, "local", "nonretryable", 3, 3), obs, 10)
    assert bad.invariant == invariants.NAMES["4"] and "soak/1/attempt_1" in bad.detail


def test_a_killed_agents_console_may_stop_short_but_never_differ(tmp_path: Path) -> None:
    """A SIGKILLed agent takes what its tee had read but not yet copied to the console along
    (found by the smoke: the rank log had line 1, the console not); anything else the
    console holds must still be the rank log's lines, in order."""
    log = tmp_path / "soak-abc" / "soak" / "1" / "attempt_0" / "rank3.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"soak rank=3 attempt=0 pid=9 line={n}\n" for n in (0, 1)))

    def bad(console_lines: tuple[int, ...], agent_killed: bool) -> list[str]:
        console = "\n".join(f"[soak/3] soak rank=3 attempt=0 pid=9 line={n}" for n in console_lines)
        obs = Observation(
            rc=0,
            duration_s=1,
            result=None,
            result_source="none",
            console=console,
            run_dir=tmp_path / "soak-abc",
            agent_killed=agent_killed,
        )
        return invariants.check_lines(obs, 2, complete=False)

    assert bad((0,), agent_killed=True) == []
    assert bad((0,), agent_killed=False) != []  # only a killed agent loses its tee's tail
    assert bad((1,), agent_killed=True) != []  # not a prefix: a line lost in the middle


@pytest.mark.slow
def test_an_interrupt_reaches_the_kfp_driver_of_a_campaign_started_with_sigint_ignored() -> None:
    """A campaign started as a job of a non-interactive shell (``make soak &``) inherits SIGINT
    ignored: the kfp surface's "SIGINT to the driver alone" did nothing, and the step ran on
    (found by the 100-run campaign, seed 20261127, run 50). The driver now takes Ctrl-C as in a
    terminal, and the step is cancelled."""
    import os
    import subprocess

    short = tempfile.mkdtemp(prefix="soakint", dir="/tmp")
    code = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); from tools.soak.__main__ import main; "
        "sys.exit(main(['--replay', 'kfp:cancel:6:2', '--report', '']))"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env={**os.environ, "TMPDIR": short},
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "kfp:cancel:6:2: rc 143, CANCELLED" in done.stdout
