"""The seeded plan and its execution: every run is a surface x fault class x moment x rank
drawn from ``random.Random(seed)``, so the same seed replays the same campaign.

The plan first covers every (surface, fault class) pair once, in a seeded order, then draws
surface and class at random; the moment (the line before which the fault strikes) and the
faulty rank are drawn for every run.
"""

from __future__ import annotations

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
    (``local`` and ``torchx`` first: the smoke's seed keeps its first runs)."""
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
#: fault classes) and ``check(run, obs) -> [(invariant, detail)]`` (its own invariants, 7).
SURFACES: dict[str, ModuleType] = _discover()


def expect_of(surface: str, fault: str) -> faults.Expect:
    """The outcome ``fault`` must give on ``surface``."""
    own = getattr(SURFACES[surface], "EXPECT", {})
    return own[fault] if fault in own else faults.FAULTS[fault][1]


def pairs(surfaces: list[str]) -> list[tuple[str, str]]:
    """Every (surface, fault class) pair the given surfaces can inject."""
    return [(s, f) for s in surfaces for f in SURFACES[s].FAULTS]


def plan(seed: int, size: int, surfaces: list[str] | None = None) -> list[Run]:
    """The campaign ``seed`` gives: ``size`` runs.

    Args:
        seed: the campaign's seed.
        size: how many runs.
        surfaces: the surfaces to draw from (default all of SURFACES).

    Returns:
        The runs, in order.
    """
    names = surfaces or list(SURFACES)
    rng = random.Random(seed)
    cover = pairs(names)
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
    for run in runs:
        surface = SURFACES[run.surface]
        workdir = Path(tempfile.mkdtemp(prefix=f"soak-{run.index}-", dir=root))
        started = time.monotonic()
        try:
            obs = surface.run(run, seed, workdir / "run")
        except Exception as e:  # the harness itself broke: a violation to look at, not a crash
            obs = Observation(rc=-1, duration_s=time.monotonic() - started, result=None, result_source="none",
                              console="", run_dir=None, notes=[f"harness error: {e!r}"])  # fmt: skip
            outcomes.append(Outcome(run, obs, [Violation(run, "harness", f"{type(e).__name__}: {e}")]))
            say(f"soak run {run.index} {run.key}: harness error {e!r}; kept: {workdir}")
            continue
        bad = invariants.check(run, obs, surface.LINES, expect_of(run.surface, run.fault))
        extra = getattr(surface, "check", None)
        if extra is not None:
            bad += [Violation(run, invariants.NAMES.get(k, k), d) for k, d in extra(run, obs)]
        outcomes.append(Outcome(run, obs, bad))
        verdict = "held" if not bad else f"{len(bad)} VIOLATION(S)"
        say(f"soak run {run.index} {run.key}: rc {obs.rc}, "
            f"{(obs.result or {}).get('state', 'no result')}, {time.monotonic() - started:.1f} s: {verdict}")  # fmt: skip
        for note in obs.notes:
            say(f"    note: {note}")
        for violation in bad:
            say(f"    invariant {violation.invariant}: {violation.detail}")
        if bad or keep:
            say(f"    kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return outcomes
