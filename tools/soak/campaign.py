"""The seeded plan and its execution: every run is a surface x fault class x moment x rank
drawn from ``random.Random(seed)``, so the same seed replays the same campaign.

The plan first covers every (surface, fault class) pair once, in a seeded order, then draws
surface and class at random; the moment (the line before which the fault strikes) and the
faulty rank are drawn for every run.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from tools.soak import faults, invariants
from tools.soak import surfaces as _surfaces
from tools.soak.model import Observation, Run, Violation


def _discover() -> dict[str, ModuleType]:
    """Every module of tools/soak/surfaces with a ``NAME``, by name, in module-name order
    (``local`` and ``torchx`` first)."""
    found: dict[str, ModuleType] = {}
    names = sorted(m.name for m in pkgutil.iter_modules(_surfaces.__path__))
    for name in sorted(names, key=lambda n: (n not in ("local", "torchx"), n)):
        module = importlib.import_module(f"{_surfaces.__name__}.{name}")
        if hasattr(module, "NAME"):
            found[module.NAME] = module
    return found


#: The surfaces the campaign drives, by name. A surface module has ``NAME``, ``FAULTS``,
#: ``LINES`` and ``run(run, seed, workdir) -> Observation``; optionally ``EXPECT`` (fault
#: class -> faults.Expect where its outcome differs from the local target's, and for its own
#: fault classes), ``check(run, obs) -> [(invariant, detail)]`` (its own invariants, 7) and
#: ``unavailable() -> str | None`` (why this machine cannot run it: its runs are skipped
#: with that reason, never run some other way).
SURFACES: dict[str, ModuleType] = _discover()


def expect_of(surface: str, fault: str) -> faults.Expect:
    """The outcome ``fault`` must give on ``surface``."""
    if fault == "stop" and faults.hang_timeout_s() is not None:
        return STOP_UNDER_HANG_TIMEOUT
    own = getattr(SURFACES[surface], "EXPECT", {})
    return own[fault] if fault in own else faults.FAULTS[fault][1]


#: ``stop`` when the agents run with ``--hang-timeout`` (``python -m tools.soak --hang-timeout``):
#: the stopped rank is a real hang, which the hang stop ends as a timer would (the stopped
#: rank's agent and its peer, whose ranks wait in all_reduce, each fail their group once).
STOP_UNDER_HANG_TIMEOUT = dataclasses.replace(
    faults.FAULTS["stop_timer"][1],
    guarantee=(
        "a rank SIGSTOPs with no timer, the agents run with --hang-timeout: the hang stop takes the "
        "stacks and fails the group, which restarts and SUCCEEDS"
    ),
)


def pairs(surfaces: list[str]) -> list[tuple[str, str]]:
    """Every (surface, fault class) pair the given surfaces can inject."""
    return [(s, f) for s in surfaces for f in SURFACES[s].FAULTS]


#: The smoke campaign's seed (``make test``).
SMOKE_SEED = 27
#: Surfaces whose every fault class the smoke runs: cheap (no server), and together they hold
#: every class the campaign has (the agent's own on ``local``, the Kubernetes API's).
SMOKE_EVERY_CLASS = ("local", "kubernetes")
#: Pairs the smoke leaves out: a real-pod run costs 15-30 s; tests/soak/test_soak_kubernetes.py
#: runs ``node_loss`` on its own, ``partition`` is ``make soak``'s (``drain`` stays in the smoke).
SMOKE_ELSEWHERE = (("kubernetes", "node_loss"), ("kubernetes", "partition"))
#: Fault classes every surface implements its own way (which process watches the step, how
#: its orchestrator cancels it): the smoke runs them on every surface.
SMOKE_OWN_PATH = ("sigkill_watcher", "cancel")


def smoke_pairs(seed: int) -> list[tuple[str, str]]:
    """The (surface, fault class) pairs of the smoke campaign in ``make test``; not every pair
    (75 runs, 42 through an orchestrator: about 25 minutes on 2 cores, ``make soak``'s first
    75 runs do that). Every fault class and every surface at least once: every
    class of ``SMOKE_EVERY_CLASS`` (but ``SMOKE_ELSEWHERE``); ``SMOKE_OWN_PATH`` on every other surface; and each other
    class an orchestrator drives (none, exit, nonretryable, sigkill_agent, flood) on one
    surface beside those, one per surface, dealt in a seeded order.

    Args:
        seed: the smoke's seed (which surface gets which of the other classes).

    Returns:
        The pairs, in SURFACES order.
    """
    rng = random.Random(seed)
    chosen = [
        (s, f) for s in SURFACES if s in SMOKE_EVERY_CLASS for f in SURFACES[s].FAULTS if (s, f) not in SMOKE_ELSEWHERE
    ]
    rest = [s for s in SURFACES if s not in SMOKE_EVERY_CLASS]
    chosen += [(s, f) for s in rest for f in SMOKE_OWN_PATH if f in SURFACES[s].FAULTS]
    shared = set.intersection(*(set(SURFACES[s].FAULTS) for s in rest)) if rest else set()
    others = sorted(shared - set(SMOKE_OWN_PATH))  # what every orchestrator drives
    rng.shuffle(others)
    dealt = list(rest)
    rng.shuffle(dealt)
    if others:
        chosen += [(surface, others[i % len(others)]) for i, surface in enumerate(dealt)]
    return sorted(chosen, key=lambda p: list(SURFACES).index(p[0]))


def plan(
    seed: int, size: int, surfaces: list[str] | None = None, cover: list[tuple[str, str]] | None = None
) -> list[Run]:
    """The campaign ``seed`` gives: ``size`` runs.

    Args:
        seed: the campaign's seed.
        size: how many runs.
        surfaces: the surfaces to draw from (default all of SURFACES).
        cover: the pairs the first runs cover, in a seeded order (default every pair of
            ``surfaces``).

    Returns:
        The runs, in order.
    """
    names = surfaces or list(SURFACES)
    rng = random.Random(seed)
    cover = list(cover) if cover is not None else pairs(names)
    rng.shuffle(cover)
    runs = []
    for i in range(size):
        if i < len(cover):
            surface, fault = cover[i]
        else:
            surface = rng.choice(names)
            fault = rng.choice(SURFACES[surface].FAULTS)
        lines = SURFACES[surface].LINES
        runs.append(Run(i, surface, fault, rng.randint(1, lines - 2), rng.randrange(faults.WORLD)))
    return runs


@dataclass
class Outcome:
    """One executed run: what was observed and what did not hold."""

    run: Run
    observation: Observation
    violations: list[Violation] = field(default_factory=list)
    skipped: str | None = None  # why the run was not made (its surface cannot run here)


def unavailable(surface: str) -> str | None:
    """Why this machine cannot run ``surface`` (its ``unavailable()``), or None."""
    check = getattr(SURFACES[surface], "unavailable", None)
    return check() if check is not None else None


def execute(
    runs: list[Run], seed: int, say: Callable[[str], None] = print, keep: bool = False, root: Path | None = None
) -> list[Outcome]:
    """Run ``runs`` one after the other and check every invariant after each.

    Args:
        runs: the runs (from :func:`plan` or one ``--replay``).
        seed: the campaign's seed (for replay commands).
        say: where progress lines go.
        keep: keep every run's directory (by default only those of runs that broke something).
        root: where the runs' directories go (default: the temporary directory).

    Returns:
        One outcome per run.
    """
    outcomes = []
    missing: dict[str, str | None] = {}
    for run in runs:
        surface = SURFACES[run.surface]
        if run.surface not in missing:
            missing[run.surface] = unavailable(run.surface)
            if missing[run.surface]:
                say(
                    f"soak: surface {run.surface} cannot run on this machine, its runs are skipped: {missing[run.surface]}"
                )
        if missing[run.surface]:
            empty = Observation(rc=0, duration_s=0, result=None, result_source="none", console="", run_dir=None)
            outcomes.append(Outcome(run, empty, skipped=missing[run.surface]))
            say(f"soak run {run.index} {run.key}: skipped ({missing[run.surface]})")
            continue
        workdir = Path(tempfile.mkdtemp(prefix=f"soak-{run.index}-", dir=root))
        started = time.monotonic()
        try:
            obs = surface.run(run, seed, workdir / "run")
        except Exception as e:  # the harness itself broke: a violation to look at, not a crash
            obs = Observation(
                rc=-1,
                duration_s=time.monotonic() - started,
                result=None,
                result_source="none",
                console="",
                run_dir=None,
                notes=[f"harness error: {e!r}"],
            )
            outcomes.append(Outcome(run, obs, [Violation(run, "harness", f"{type(e).__name__}: {e}")]))
            say(f"soak run {run.index} {run.key}: harness error {e!r}; kept: {workdir}")
            continue
        bad = invariants.check(run, obs, surface.LINES, expect_of(run.surface, run.fault))
        extra = getattr(surface, "check", None)
        if extra is not None:
            bad += [Violation(run, invariants.NAMES.get(k, k), d) for k, d in extra(run, obs)]
        outcomes.append(Outcome(run, obs, bad))
        verdict = "held" if not bad else f"{len(bad)} VIOLATION(S)"
        hung = faults.hang_stops(obs.result, obs.console)
        say(
            f"soak run {run.index} {run.key}: rc {obs.rc}, "
            f"{(obs.result or {}).get('state', 'no result')}, {time.monotonic() - started:.1f} s: {verdict}"
            + (f" ({hung} rank(s) stopped by --hang-timeout)" if hung else "")
        )
        for note in obs.notes:
            say(f"    note: {note}")
        for violation in bad:
            say(f"    invariant {violation.invariant}: {violation.detail}")
        if bad or keep:
            say(f"    kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return outcomes
