"""Shared helpers of the throughput benchmarks (bench/train_throughput.py,
bench/log_throughput.py, bench/agent_cost.py): the two launch commands, a run with its
console captured, and the count of the numbered lines (bench/scripts/throughput_worker.py)
in the console and in the rank files."""

from __future__ import annotations

import io
import json
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from agent_bench import AGENT, BENCH, SCRIPTS, TORCHRUN, clean_env

WORKER = str(SCRIPTS / "throughput_worker.py")
NAMES = ("torchstep-agent", "torchrun")
RESULTS = BENCH / "results" / "throughput.md"
HEADER = """# Training and logging throughput

Written by `bench/train_throughput.py`, `bench/log_throughput.py` and `bench/agent_cost.py`
(each replaces its own section): torchstep-agent vs torchrun on the same worker
(`bench/scripts/throughput_worker.py`), both with `--tee 3 --log-dir`, runs alternated.
"""
# an intact line, with the console's `[default0]:` prefix (--tee 3, both tools) or without (rank files)
LINE = re.compile(rb"^(?:\[[^\]\n]*\]:)?TSLINE r=(\d+) i=(\d{9}) x{64}$", re.M)


def command(name: str, log_dir: Path, worker_args: list[str]) -> list[str]:
    """``name``'s command line: 2 workers, ``--tee 3 --log-dir`` (both tools write the same
    ``<log-dir>/<run>/attempt_<k>/<local_rank>/stdout.log`` layout)."""
    launcher = AGENT if name == "torchstep-agent" else TORCHRUN
    return [launcher, "--nproc-per-node", "2", "--tee", "3", "--log-dir", str(log_dir), WORKER, *worker_args]


@dataclass
class Tally:
    """How the numbered lines of each rank arrived in one place (console or rank files)."""

    counts: dict[int, bytearray] = field(default_factory=dict)
    torn: int = 0  # a TSLINE that is not a whole, intact line
    extra: int = 0  # a number the rank never printed

    def lost(self) -> int:
        return sum(c.count(0) for c in self.counts.values())

    def duplicated(self) -> int:
        return sum(n - 1 for c in self.counts.values() for n in c if n > 1)


def tally(chunks: list[bytes], printed: dict[int, int]) -> Tally:
    """Count the lines in ``chunks`` (whole files) against ``printed`` (rank -> lines)."""
    t = Tally(counts={r: bytearray(n) for r, n in printed.items()})
    for data in chunks:
        found = LINE.findall(data)
        t.torn += data.count(b"TSLINE") - len(found)
        for r, i in found:
            c, n = t.counts.get(int(r)), int(i)
            if c is None or n >= len(c):
                t.extra += 1
            elif c[n] < 255:
                c[n] += 1
    return t


def rank_files(log_dir: Path) -> list[bytes]:
    """Every rank's stdout file under ``log_dir`` (all runs and attempts)."""
    return [p.read_bytes() for p in sorted(log_dir.glob("*/attempt_*/*/stdout.log"))]


def printed(out: Path) -> dict[int, int]:
    """rank -> lines printed, from the worker's ``rank<N>.json``."""
    return {int(p.stem[4:]): json.loads(p.read_text())["lines"] for p in out.glob("rank*.json")}


def worker_info(out: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}


@dataclass
class Check:
    """The numbered lines of one run, in the console and in the rank files."""

    console: Tally
    files: Tally
    printed: dict[int, int]

    def intact(self, rank: int) -> int:
        """Lines of ``rank`` present exactly once both on the console and in its file."""
        c, f = self.console.counts[rank], self.files.counts[rank]
        return sum(1 for a, b in zip(c, f) if a == 1 and b == 1)

    def problems(self) -> str:
        out = []
        for where, t in (("console", self.console), ("rank files", self.files)):
            bad = {"lost": t.lost(), "duplicated": t.duplicated(), "torn": t.torn, "unknown": t.extra}
            if any(bad.values()):
                out.append(f"{where}: " + ", ".join(f"{v} {k}" for k, v in bad.items() if v))
        return "; ".join(out)


def check(console: bytes, log_dir: Path, out: Path) -> Check:
    p = printed(out)
    if len(p) != 2:
        raise SystemExit(f"the workers did not report (rank files in {out}: {sorted(p)})")
    return Check(tally([console], p), tally(rank_files(log_dir), p), p)


@dataclass
class Launch:
    """A launcher running under :func:`run`."""

    name: str
    proc: subprocess.Popen[bytes]
    reader: threading.Thread
    seen: dict[bytes, float]  # marker -> wall-clock time it first reached the console
    timeout: float


def run(argv: list[str], console: Path, *, timeout: float = 600, markers: tuple[bytes, ...] = ()) -> Launch:
    """Start ``argv`` with its stdout captured into ``console``, noting the wall-clock time
    each of ``markers`` first reaches it (the bench reads the pipe in 1 MiB chunks)."""
    proc = subprocess.Popen(argv, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    seen: dict[bytes, float] = {}

    def pump() -> None:
        stream = cast(io.BufferedReader, proc.stdout)
        tail = b""
        with open(console, "wb") as f:
            while chunk := stream.read1(1 << 20):
                now = time.time()
                f.write(chunk)
                window = tail + chunk
                for m in markers:
                    if m not in seen and m in window:
                        seen[m] = now
                tail = window[-64:]

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    return Launch(Path(argv[0]).name, proc, reader, seen, timeout)


def finish(launch: Launch) -> float:
    """Wait for ``launch`` and its console; returns the wall-clock time it exited.

    Raises:
        SystemExit: the launcher failed or timed out.
    """
    try:
        rc = launch.proc.wait(timeout=launch.timeout)
    except subprocess.TimeoutExpired:
        launch.proc.kill()
        raise SystemExit(f"{launch.name} timed out") from None
    end = time.time()
    launch.reader.join()
    if rc != 0:
        raise SystemExit(f"{launch.name} failed ({rc})")
    return end


def update_section(name: str, body: str) -> None:
    """Replace (or add) the section of benchmark ``name`` in bench/results/throughput.md."""
    text = RESULTS.read_text() if RESULTS.exists() else HEADER
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    block = f"{start}\n{body.strip()}\n{end}"
    if start in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
