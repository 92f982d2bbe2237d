"""The torch matrix (issue 32): the agent's compatibility suite (tests/torchmatrix/) against
each supported (Python, torch), each in a virtualenv of PyPI's own wheels.

A row's virtualenv holds torch (PyPI's default Linux wheel: the CUDA build users' images
carry), numpy, and torchx with its dependencies; torchstep itself comes from this checkout's
source tree (``PYTHONPATH``), so the code under test is the working tree and a built
virtualenv never changes. Virtualenvs are cached in
``${XDG_CACHE_HOME:-~/.cache}/torchstep/torch-matrix/`` (``TORCHSTEP_MATRIX_CACHE``
overrides), one folder per row keyed by the interpreter, the torch version and a hash of
what is installed: a change of any of them builds a new one and removes the stale one.
pip runs with ``PIP_CONFIG_FILE=/dev/null`` so a machine's own pip configuration (a local
CPU build, a cap on torch) cannot change what a row installs.

Usage::

    python tools/torch_matrix.py list                 # the rows, their interpreters and venvs
    python tools/torch_matrix.py ensure ends          # build (or check) the oldest and newest rows
    python tools/torch_matrix.py run all [-n 2]       # ensure + the suite for every row + the table
    python tools/torch_matrix.py table all            # the last run's table again

ROWS: ``all``, ``ends`` (the oldest and the newest: what ``make test`` runs), ``dev`` (the
repository's .venv), or row ids (``py3.12-torch2.11.0``), comma-separated. A row whose
interpreter is missing is skipped with its reason; under CI (``CI=true``) that is an error.
"""

from __future__ import annotations

import argparse
import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE_SRC = ROOT / "adapters" / "core" / "src"
DEV_PYTHON = ROOT / ".venv" / "bin" / "python"
#: bump to rebuild every cached virtualenv (a change of how they are made)
LAYOUT = 1
STAMP = "torchstep-matrix.json"


@dataclass(frozen=True)
class Row:
    """One (Python, torch) of the matrix.

    Args:
        python: ``3.X``.
        torch: the torch release installed from PyPI (for the dev row: the pin of .venv).
        dev: the repository's own .venv (the dev pin, a CPU build), not a cached virtualenv.
    """

    python: str
    torch: str
    dev: bool = False

    @property
    def id(self) -> str:
        return f"{'dev-' if self.dev else ''}py{self.python}-torch{self.torch}"


#: oldest first; ``ends`` = the first and the last
ROWS = (Row("3.10", "2.4.1"), Row("3.11", "2.6.0"), Row("3.12", "2.11.0"), Row("3.13", "2.15.0"))
DEV_ROW = Row("3.11", "2.13.0", dev=True)
ALL_ROWS = (*ROWS, DEV_ROW)


class RowSkipped(Exception):
    """A row cannot run on this machine (its interpreter is missing); the message says why."""


def select(spec: str) -> list[Row]:
    """The rows that ``spec`` names.

    Args:
        spec: ``all``, ``ends``, ``dev`` or row ids, comma-separated.

    Returns:
        The rows, in the matrix's order, each once.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    by_id = {r.id: r for r in ALL_ROWS}
    chosen: list[Row] = []
    for name in (n.strip() for n in spec.split(",") if n.strip()):
        if name == "all":
            chosen += ALL_ROWS
        elif name == "ends":
            chosen += [ROWS[0], ROWS[-1]]
        elif name == "dev":
            chosen.append(DEV_ROW)
        elif name in by_id:
            chosen.append(by_id[name])
        else:
            raise ValueError(f"unknown torch-matrix row {name!r}; fix: use all, ends, dev or one of {sorted(by_id)}")
    return [r for r in ALL_ROWS if r in chosen]


def cache_root() -> Path:
    """Where the rows' virtualenvs live (``TORCHSTEP_MATRIX_CACHE``, else the user's cache)."""
    if os.environ.get("TORCHSTEP_MATRIX_CACHE"):
        return Path(os.environ["TORCHSTEP_MATRIX_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "torchstep" / "torch-matrix"


def _runs(python: str, minor: str) -> bool:
    """``python`` starts and is Python ``minor`` (a pyenv shim without a version fails)."""
    try:
        done = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and done.stdout.strip() == minor


def find_python(minor: str) -> str:
    """An interpreter of Python ``minor``: pyenv's versions first, then ``python3.X`` on PATH.

    Args:
        minor: ``3.X``.

    Returns:
        Its path.

    Raises:
        RowSkipped: none found (the message names where it looked).
    """
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates = sorted(
        glob.glob(os.path.join(pyenv, "versions", f"{minor}.*", "bin", f"python{minor}")),
        key=lambda p: [int(x) for x in re.findall(r"\d+", Path(p).parts[-3])],
        reverse=True,
    )
    on_path = shutil.which(f"python{minor}")
    for python in [*candidates, *([on_path] if on_path else [])]:
        if _runs(python, minor):
            return python
    raise RowSkipped(
        f"no Python {minor}: none in {pyenv}/versions/{minor}.*, and python{minor} on PATH "
        f"{'does not run' if on_path else 'is missing'}; fix: install CPython {minor} (e.g. pyenv install {minor})"
    )


def _torchx_pin() -> str:
    """torchx's version of the dev lock: the rows run the torchx the repository is tested with."""
    lock = (ROOT / "requirements" / "dev.lock").read_text()
    m = re.search(r"^torchx==(\S+)", lock, re.M)
    return f"torchx=={m.group(1)}" if m else "torchx>=0.7"


def requirements(row: Row) -> list[str]:
    """What a row's virtualenv gets from PyPI (torchstep's own runtime needs and torch).

    Args:
        row: the row.

    Returns:
        pip requirement strings.
    """
    reqs = [f"torch=={row.torch}", "numpy", _torchx_pin(), "pyyaml>=6"]
    if row.python == "3.10":
        reqs.append("tomli>=1.1")  # torchstep's dependency there (tomllib's backport)
    return reqs


def venv_dir(row: Row, python: str) -> Path:
    """The cached virtualenv of ``row`` built with ``python`` (its name carries the key)."""
    version = subprocess.run([python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True)
    key = json.dumps(
        {"layout": LAYOUT, "python": python, "version": version.stdout.strip(), "requirements": requirements(row)},
        sort_keys=True,
    )
    return cache_root() / f"{row.id}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


@contextmanager
def _locked(path: Path, blocking: bool = True) -> Iterator[bool]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure(row: Row, log=print) -> str:
    """The Python of ``row``'s virtualenv, built first if missing, incomplete or stale.

    Several processes may call this at once (pytest-xdist workers): one builds, the others
    wait for it under a file lock.

    Args:
        row: the row.
        log: where progress lines go.

    Returns:
        The path of the interpreter to run the agent with.

    Raises:
        RowSkipped: the row's interpreter is missing on this machine.
        RuntimeError: the virtualenv could not be built (pip's output tail in the message).
    """
    if row.dev:
        if not DEV_PYTHON.exists():
            raise RowSkipped(f"no {DEV_PYTHON.relative_to(ROOT)}; fix: make env")
        return str(DEV_PYTHON)
    base = find_python(row.python)
    venv = venv_dir(row, base)
    python = venv / "bin" / "python"
    with _locked(cache_root() / f".{row.id}.lock"):
        if not (venv / STAMP).exists():
            _build(row, base, venv, python, log)
        compile_source(str(python))
    return str(python)


def _build(row: Row, base: str, venv: Path, python: Path, log) -> None:
    """Build ``row``'s virtualenv at ``venv`` from PyPI's wheels (under the row's lock)."""
    for stale in cache_root().glob(f"{row.id}-*"):
        log(f"torch-matrix: {row.id}: removing the stale {stale.name}")
        shutil.rmtree(stale, ignore_errors=True)
    log(f"torch-matrix: {row.id}: building {venv} ({base}; {' '.join(requirements(row))})")
    t0 = time.monotonic()
    # PyPI's own wheels: neither pip's configuration files nor the environment's local
    # wheel folders, extra indexes or constraints of this machine choose them
    skip = (
        "PYTHONPATH",
        "PIP_FIND_LINKS",
        "PIP_INDEX_URL",
        "PIP_EXTRA_INDEX_URL",
        "PIP_CONSTRAINT",
        "PIP_NO_INDEX",
    )
    env = {k: v for k, v in os.environ.items() if k not in skip}
    env.update(PIP_CONFIG_FILE="/dev/null", PIP_DISABLE_PIP_VERSION_CHECK="1")
    steps = [
        [base, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "-q", *requirements(row)],
        [str(python), "-c", f"import torch, torchx; assert torch.__version__.split('+')[0] == {row.torch!r}"],
    ]
    for cmd in steps:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            raise RuntimeError(
                f"torch-matrix: {row.id}: {' '.join(cmd[:4])} ... failed (exit {done.returncode}):\n"
                f"{(done.stdout + done.stderr)[-3000:]}"
            )
    freeze = subprocess.run([str(python), "-m", "pip", "freeze"], capture_output=True, text=True, env=env)
    stamp = {"row": row.id, "python": base, "requirements": requirements(row), "installed": freeze.stdout.split()}
    (venv / STAMP).write_text(json.dumps(stamp, indent=1))
    log(f"torch-matrix: {row.id}: built in {time.monotonic() - t0:.0f} s")


def compile_source(python: str) -> None:
    """The source tree's byte code for ``python``, as ``pip install`` writes it for a user.

    The rows import torchstep from the working tree, where ``PYTHONDONTWRITEBYTECODE`` (the
    Makefile's) keeps every process from caching it: each agent compiled its own modules
    again (about 0.1 CPU-s, on the critical path of a start). ``compileall`` writes only what
    is stale; a file changed later is compiled in memory as before (the byte code records the
    source's size and time)."""
    subprocess.run(
        [python, "-m", "compileall", "-q", "-j", "0", str(CORE_SRC)],
        capture_output=True,
        check=False,  # a file that does not compile fails where it is imported, with its own error
    )


def in_ci() -> bool:
    """``True`` under CI (``CI=true``), where a skipped row is a failure."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _table(junit: Path, rows: list[Row], skipped: dict[str, str]) -> tuple[str, bool]:
    """A markdown table from pytest's JUnit XML: a row per scenario, a column per (Python,
    torch), each cell ``pass``, ``FAIL`` or ``skip``; and whether every cell passed."""
    cells: dict[str, dict[str, str]] = {r.id: {} for r in rows}
    scenarios: list[str] = []
    for case in ET.parse(junit).iter("testcase"):
        m = re.match(r"(test_\w+)\[(.+)\]$", case.get("name", ""))
        if not m or m.group(2) not in cells:
            continue
        name = m.group(1).removeprefix("test_").replace("_", " ")
        if name not in scenarios:
            scenarios.append(name)
        if case.find("failure") is not None or case.find("error") is not None:
            cells[m.group(2)][name] = "FAIL"
        elif case.find("skipped") is not None:
            cells[m.group(2)][name] = "skip"
        else:
            cells[m.group(2)][name] = "pass"
    heads = [f"{r.python} + {r.torch} ({'dev pin, CPU build' if r.dev else 'PyPI, CUDA build'})" for r in rows]
    lines = ["| scenario | " + " | ".join(heads) + " |", "|---|" + "---|" * len(rows)]
    for name in scenarios:
        got = [f"skipped: {skipped[r.id]}" if r.id in skipped else cells[r.id].get(name, "missing") for r in rows]
        lines.append(f"| {name} | " + " | ".join(got) + " |")
    ok = all(cells[r.id].get(s) == "pass" for r in rows if r.id not in skipped for s in scenarios)
    ok = ok and bool(scenarios) and not (skipped and in_ci())
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring).

    Args:
        argv: arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 when every selected row passed (or, outside CI, was skipped).
    """
    p = argparse.ArgumentParser(prog="torch_matrix", description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["list", "ensure", "run", "table"])
    p.add_argument("rows", nargs="?", default="all", help="all | ends | dev | row ids, comma-separated")
    p.add_argument("-n", "--workers", default="2", help="pytest-xdist workers for `run` (default 2)")
    p.add_argument("--table", type=Path, help="`run`: also write the markdown table to this file")
    a = p.parse_args(argv)
    try:
        rows = select(a.rows)
    except ValueError as e:
        p.error(str(e))
    if a.command == "table":  # the last run's table again (its rows: ROWS)
        last = cache_root() / "junit-last.xml"
        if not last.is_file():
            print(
                f"torch-matrix: no run recorded yet ({last} is missing): run 'make test-torch' first", file=sys.stderr
            )
            return 1
        print(_table(last, rows, {})[0])
        return 0
    skipped: dict[str, str] = {}
    for row in rows:
        try:
            if a.command == "list":
                python = str(DEV_PYTHON) if row.dev else find_python(row.python)
                where = "" if row.dev else f" -> {venv_dir(row, python)}"
                print(f"{row.id}: {python}{where}")
            else:
                ensure(row)
        except RowSkipped as e:
            skipped[row.id] = str(e)
            print(f"torch-matrix: {row.id}: {'FAILED' if in_ci() else 'skipped'}: {e}", file=sys.stderr)
        except RuntimeError as e:
            print(e, file=sys.stderr)
            return 1
    if a.command != "run":
        return 1 if skipped and in_ci() else 0
    runnable = [r for r in rows if r.id not in skipped]
    junit = cache_root() / "junit-last.xml"  # kept: `table` renders it again
    env = {**os.environ, "TORCHSTEP_TORCH_ROWS": ",".join(r.id for r in runnable) or "none"}
    cmd = [str(DEV_PYTHON), "-m", "pytest", "-n", a.workers, f"--junitxml={junit}", "tests/torchmatrix"]
    t0 = time.monotonic()
    subprocess.run(cmd, cwd=ROOT, env=env)
    table, ok = _table(junit, rows, skipped)
    print(f"\ntorch matrix ({time.monotonic() - t0:.0f} s):\n{table}")
    if a.table:
        a.table.write_text(table + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
