"""The figures of ``make bench``: every benchmark records its rows here, in
``bench/results.json``, and ``bench/report.py`` renders them into docs/performance.md.

A figure is one comparison: what is measured, our median, the peer's median (both with
min/max and the samples' count), the ratio ours/peer, and the goal on that ratio (or on our
absolute value, ``goal_on="ours"``, e.g. node-loss recovery < 5 s); the goal is a ceiling
unless ``better="higher"`` makes it a floor (throughput: steps/s, lines/s). Curves (``curve``) are
series of (x, seconds) points per variant, plotted by the report.

Quick mode is the default (few runs); ``BENCH_FULL=1`` asks every benchmark for its long
run. ``runs(quick, full)`` picks the count.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent.parent
RESULTS_JSON = BENCH / "results.json"


def full() -> bool:
    """Whether ``BENCH_FULL=1`` asked for the long run."""
    return os.environ.get("BENCH_FULL", "") not in ("", "0")


def runs(quick: int, long: int) -> int:
    """The number of runs of the current mode (``BENCH_RUNS`` overrides both)."""
    if os.environ.get("BENCH_RUNS"):
        return int(os.environ["BENCH_RUNS"])
    return long if full() else quick


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
    }
    try:
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    if os.environ.get("BENCH_TORCH"):  # the torch the figure ran (bench/scripts/agent_bench.py)
        info["torch"] = os.environ["BENCH_TORCH"]
    try:
        info["load_1m"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    return info


def stats(samples: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(samples) if samples else None,
        "min": min(samples, default=None),
        "max": max(samples, default=None),
        "n": len(samples),
    }


def _update(key: str, section: str, value: dict[str, Any]) -> None:
    data = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}
    data.setdefault(section, {})[key] = value
    tmp = RESULTS_JSON.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(RESULTS_JSON)


def record(
    fig: str,
    what: str,
    ours: list[float],
    peer: list[float],
    *,
    peer_name: str,
    goal: float,
    goal_on: str = "ratio",
    unit: str = "s",
    command: str = "",
    note: str = "",
    better: str = "lower",
    valid: bool = True,
) -> dict[str, Any]:
    """Record figure ``fig`` (``"1"``...``"11"``, or ``"5b"``); returns the stored row.

    ``better="higher"`` for a throughput: the goal is then met when the judged value is at
    least ``goal``. ``valid=False`` when the run broke a condition of the goal (a lost log
    line): the figure is not met whatever the ratio.
    """
    o, p = stats(ours), stats(peer)
    ratio = o["median"] / p["median"] if o["median"] is not None and p["median"] else None
    judged = ratio if goal_on == "ratio" else o["median"]
    met = judged is not None and (judged >= goal if better == "higher" else judged <= goal) and valid
    cmp = ">=" if better == "higher" else "<="
    row = {
        "what": what,
        "ours": o,
        "peer": p,
        "peer_name": peer_name,
        "ratio": ratio,
        "goal": goal,
        "goal_on": goal_on,
        "better": better,
        "met": met,
        "unit": unit,
        "command": command,
        "note": note,
        "mode": "full" if full() else "quick",
        "machine": machine(),
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    _update(fig, "figures", row)
    print(
        f"[figure {fig}] {what}: ours {o['median']:.3g} {unit} vs {peer_name} "
        f"{p['median'] if p['median'] is not None else float('nan'):.3g} {unit} -> "
        f"ratio {ratio if ratio is not None else float('nan'):.2f} (goal {goal_on} {cmp} {goal}: "
        f"{'met' if row['met'] else 'MISSED'})",
        flush=True,
    )
    return row


def drop(fig: str) -> None:
    """Forget figure ``fig`` (a benchmark that no longer records it, e.g. after a rename)."""
    data = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}
    if data.get("figures", {}).pop(fig, None) is not None:
        tmp = RESULTS_JSON.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        tmp.replace(RESULTS_JSON)


def curve(name: str, title: str, xlabel: str, series: dict[str, list[tuple[float, float]]]) -> None:
    """Record a scaling curve: ``series`` maps a variant to its (x, median seconds) points."""
    _update(name, "curves", {"title": title, "xlabel": xlabel, "series": series, "machine": machine()})


def growth(points: list[tuple[float, float]]) -> str:
    """How ``points`` grow: "linear or better" when time per unit of x does not rise by more
    than half from the smallest to the largest x, else "worse than linear"."""
    pts = sorted(p for p in points if p[0] > 0 and p[1] > 0)
    if len(pts) < 2:
        return "n/a"
    (x0, y0), (x1, y1) = pts[0], pts[-1]
    # compare the marginal cost of the last segment with the average cost of the first
    per_first = y0 / x0
    per_last = (y1 - pts[-2][1]) / (x1 - pts[-2][0]) if x1 != pts[-2][0] else per_first
    return "linear or better" if per_last <= 1.5 * max(per_first, 1e-9) else "worse than linear"
