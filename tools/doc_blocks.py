"""Run every code block of README.md, docs/*.md and adapters/*/README.md (the long
descriptions on PyPI) that claims to run, as written.

Per page, in the page's order, from a directory that stands for the clone's root (the
repository's ``.venv``, copies of ``components/`` and ``dags/``; its own HOME, state,
Airflow and Prefect homes):

- ``python`` blocks run in one interpreter per page and share its namespace, as a reader
  who pastes them one after the other would; a block of ``>>>`` lines runs as a doctest, so
  the outputs it shows are compared. A block after a line that ends with ```file.py`:`` is
  saved as that file instead (the tutorial's convention).
- ``bash`` / ``console`` / ``sh`` blocks run in bash (``set -euo pipefail``): a ``console``
  block's ``$ `` lines (and their ``\\`` continuations) are its commands, the rest is the
  output it shows, compared: each shown line must be in the real output, in order (``...``
  stands for anything, and for lines left out; a run id's random suffix for any).
- Other blocks (``text``, ``json``, ``yaml``, no language) are shown, not run.

``train.py`` in the clone is ``components/apps/train.py``: the docs' ``dist.ddp --script
train.py`` stands for the user's own training script. A page in ``RUN_BY`` has a test of
its own that runs it as written; its blocks count as skipped here ("elsewhere").

A block that cannot run here says why in the source, on the line before its fence::

    <!-- docs-test: skip cluster: kubectl apply needs a Kubernetes cluster -->

with one of the reasons of ``REASONS``. The runner lists how many blocks it ran, skipped
(per reason) and showed. Usage: ``python tools/doc_blocks.py [PAGE.md ...]`` (from the
repository root; all pages without arguments). ``tests/docs/test_doc_blocks.py`` runs it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("adapters/*/README.md"))]
REASONS = {
    "cluster": "needs a Kubernetes cluster (kubectl, a Job on a cluster, an image)",
    "server": "needs a running orchestrator server or endpoint (Airflow API, Prefect server, KFP)",
    "install": "installs from PyPI (tools/test_wheels.py installs the built wheels instead)",
    "long": "runs for minutes (a benchmark, the demo, a served flow): run by the test it names",
    "fragment": "an excerpt: it uses names that only the surrounding example or the user's code defines",
    "elsewhere": "run as written by the test it names",
    "transcript": "a recorded session: its handles and ids are that session's (the test it names runs the commands)",
}
RUN = {"python", "bash", "console", "sh", "shell"}
FENCE = re.compile(
    r"^(?:<!-- docs-test: (?P<directive>[^\n]*?) -->\n)?```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^```[ \t]*$",
    re.S | re.M,
)
SKIP = re.compile(r"skip (?P<reason>\w+): (?P<why>.+)")
SAVE_AS = re.compile(r"`([\w./-]+\.py)`:\s*$")
BLOCK_TIMEOUT = 600
# pages that a test of their own runs as written, block by block (not run twice)
RUN_BY = {"docs/tutorial.md": "tests/docs/test_tutorial.py"}


@dataclass
class Block:
    page: str
    line: int
    lang: str
    body: str
    skip: tuple[str, str] | None  # (reason, why)
    save_as: str | None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.lang in RUN and self.skip is None


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    found = []
    for m in FENCE.finditer(text):
        line = text[: m.start("lang")].count("\n") + 1
        skip = None
        if m.group("directive") is not None:
            s = SKIP.fullmatch(m.group("directive"))
            if not s or s.group("reason") not in REASONS:
                raise ValueError(
                    f"{path.name}:{line}: unknown docs-test marker {m.group('directive')!r}: "
                    f"write 'skip REASON: why' with a REASON of {sorted(REASONS)}"
                )
            skip = (s.group("reason"), s.group("why"))
        prose = text[: m.start()].rstrip().splitlines()
        saved = SAVE_AS.search(prose[-1]) if prose and m.group("lang") == "python" else None
        rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
        if rel in RUN_BY and skip is None and m.group("lang") in RUN:
            missing = "" if (ROOT / RUN_BY[rel]).exists() else " (NOT IN THIS TREE: nothing runs the page)"
            skip = ("elsewhere", f"the page runs as written in {RUN_BY[rel]}{missing}")
        found.append(Block(rel, line, m.group("lang"), m.group("body"), skip, saved.group(1) if saved else None))
    return found


def console_script(body: str) -> str:
    """The commands of a console block: ``$ `` lines and their continuation lines."""
    out, going_on = [], False
    for line in body.splitlines():
        if line.startswith("$ ") or going_on:
            out.append(line[2:] if line.startswith("$ ") and not going_on else line)
            going_on = line.rstrip().endswith("\\")
    return "\n".join(out) if out else body


def shown_output(body: str) -> list[str]:
    """The output lines a console block shows (what is not a command; a block without
    ``$ `` prompts is all commands)."""
    if not any(line.startswith("$ ") for line in body.splitlines()):
        return []
    shown, going_on = [], False
    for line in body.splitlines():
        if line.startswith("$ ") or going_on:
            going_on = line.rstrip().endswith("\\")
        elif line.strip() and line.strip() != "...":
            shown.append(line.strip())
    return shown


RUN_ID = re.compile(r"\b([a-z][a-z0-9]*)-[a-z0-9]{6}\b")


def unmatched(shown: list[str], out: str) -> str | None:
    """The first shown line that the real output lacks, in order (None: all there). ``...``
    in a line stands for anything; a run id's random suffix (``echo-pedkrf``) for any."""
    lines, at = [x.strip() for x in out.splitlines()], 0
    for want in shown:
        parts = [re.escape(RUN_ID.sub(lambda m: m.group(1) + "-\x00", s)) for s in want.split("...")]
        pattern = re.compile(".*".join(parts).replace("\x00", "[a-z0-9]{6}") + "$")
        found = next((i for i in range(at, len(lines)) if pattern.match(lines[i])), None)
        if found is None:
            return want
        at = found + 1
    return None


# The page's Python session: requests (JSON lines) on stdin, one answer per line on the fd argv[1].
WORKER = r"""
import doctest, json, linecache, os, sys, traceback
answers = os.fdopen(int(sys.argv[1]), "w")
ns = {"__name__": "__main__"}
for request in sys.stdin:
    block = json.loads(request)
    ok, detail = True, ""
    try:
        if block["body"].lstrip().startswith(">>>"):
            test = doctest.DocTestParser().get_doctest(block["body"], ns, block["where"], block["where"], 0)
            report = []
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
            runner.run(test, out=report.append, clear_globs=False)
            ns.update(test.globs)  # a DocTest runs in a copy of the namespace
            ok, detail = runner.failures == 0, "".join(report)
        else:  # its source in linecache: inspect.getsource works (KFP's @dsl.component reads it)
            name = "<" + block["where"] + ">"
            linecache.cache[name] = (len(block["body"]), None, block["body"].splitlines(True), name)
            exec(compile(block["body"], name, "exec"), ns)
    except BaseException:
        ok, detail = False, traceback.format_exc()
    sys.stdout.flush(); sys.stderr.flush()
    answers.write(json.dumps({"ok": ok, "detail": detail}) + "\n"); answers.flush()
"""


class Page:
    def __init__(self, clone: Path, env: dict[str, str], log: Path) -> None:
        self.clone, self.env, self.log = clone, env, log
        self.worker: subprocess.Popen[str] | None = None
        self.answers = None

    def python(self, block: Block) -> tuple[bool, str]:
        if self.worker is None:
            read, write = os.pipe()
            with open(self.log, "a") as logf:
                self.worker = subprocess.Popen(
                    [str(self.clone / ".venv" / "bin" / "python"), "-u", "-c", WORKER, str(write)],
                    cwd=self.clone,
                    env=self.env,
                    stdin=subprocess.PIPE,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    text=True,
                    pass_fds=(write,),
                    start_new_session=True,
                )
            os.close(write)
            self.answers = os.fdopen(read)
        assert self.worker.stdin is not None and self.answers is not None
        self.worker.stdin.write(json.dumps({"body": block.body, "where": block.where}) + "\n")
        self.worker.stdin.flush()
        answer = self.answers.readline()
        if not answer:
            return False, f"the page's Python session died (exit {self.worker.wait()})"
        got = json.loads(answer)
        return got["ok"], got["detail"]

    def shell(self, block: Block) -> tuple[bool, str]:
        script = console_script(block.body) if block.lang == "console" else block.body
        proc = subprocess.Popen(
            ["bash", "-c", "set -euo pipefail\n" + script],
            cwd=self.clone,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            out = f"timed out after {BLOCK_TIMEOUT} s"
        finally:
            stop_group(proc)
        with open(self.log, "a") as logf:
            logf.write(f"--- {block.where}\n{out}")
        if proc.returncode == 0 and block.lang == "console":
            missing = unmatched(shown_output(block.body), out)
            if missing is not None:
                return False, f"the output has no line like {missing!r} (in the page's order)\n{out[-6000:]}"
        return proc.returncode == 0, f"exit {proc.returncode}\n{out[-6000:]}"

    def close(self) -> None:
        if self.worker is not None:
            assert self.worker.stdin is not None
            self.worker.stdin.close()
            try:
                self.worker.wait(timeout=60)
            finally:
                stop_group(self.worker)


def stop_group(proc: subprocess.Popen[str]) -> None:
    """Nothing a block started outlives it (a served flow, a detached run, a server)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def make_clone(tmp: Path) -> tuple[Path, dict[str, str]]:
    clone = tmp / "clone"  # stands for the clone's root
    clone.mkdir()
    (clone / ".venv").symlink_to(ROOT / ".venv")
    for d in ("components", "dags"):
        shutil.copytree(ROOT / d, clone / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for f in ("prefect.toml",):
        if (ROOT / f).exists():
            shutil.copy(ROOT / f, clone / f)
    # `dist.ddp --script train.py`: the docs' stand-in for the user's training script
    shutil.copy(ROOT / "components" / "apps" / "train.py", clone / "train.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PREFECT_", "VIRTUAL_ENV", "KF_"))}
    env.update(
        {
            "HOME": str(tmp),
            "XDG_STATE_HOME": str(tmp / "state"),
            "TMPDIR": str(tmp),
            "PATH": f"{clone / '.venv' / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
            "AIRFLOW_HOME": str(tmp / "airflow"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "PREFECT_HOME": str(tmp / "prefect"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    return clone, env


def run_page(path: Path) -> tuple[list[Block], list[tuple[Block, str]], float]:
    """Run one page's blocks in order; the failures with their output."""
    found = blocks(path)
    failures: list[tuple[Block, str]] = []
    t0 = time.monotonic()
    if not any(b.runs for b in found):
        return found, failures, 0.0
    with tempfile.TemporaryDirectory(prefix="torchstep-docs-", ignore_cleanup_errors=True) as tmp:
        clone, env = make_clone(Path(tmp))
        page = Page(clone, env, Path(tmp) / "page.log")
        try:
            for b in found:
                if not b.runs:
                    continue
                if b.save_as:
                    (clone / b.save_as).parent.mkdir(parents=True, exist_ok=True)
                    (clone / b.save_as).write_text(b.body)
                    continue
                ok, detail = page.python(b) if b.lang == "python" else page.shell(b)
                if not ok:
                    log = (Path(tmp) / "page.log").read_text()
                    failures.append((b, f"{detail}\n--- the page's output so far (tail):\n{log[-3000:]}"))
        finally:
            page.close()
    return found, failures, time.monotonic() - t0


def main(argv: list[str]) -> int:
    pages = [ROOT / a for a in argv] or PAGES
    ran, skipped, shown, failed = 0, Counter(), 0, []
    for path in pages:
        found, failures, took = run_page(path)
        n_run = sum(b.runs for b in found)
        n_skip = sum(b.skip is not None for b in found)
        ran += n_run
        shown += sum(b.lang not in RUN for b in found)
        skipped.update(b.skip[0] for b in found if b.skip)
        status = f"{len(failures)} FAILED" if failures else "ok"
        print(
            f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {n_run} run, {n_skip} skipped — {status} ({took:.0f} s)",
            flush=True,
        )
        for b, detail in failures:
            print(f"\n=== FAILED {b.where} ({b.lang})\n{b.body}\n--- output:\n{detail}\n", flush=True)
        failed += failures
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(skipped.items()))
    print(
        f"\ndocs code blocks: {ran} run, {sum(skipped.values())} skipped ({reasons or 'none'}), {shown} shown "
        f"(output, data), {len(failed)} failed"
    )
    for r in sorted(skipped):
        print(f"  skipped, {r}: {REASONS[r]}")
    for page, test in RUN_BY.items():
        if not (ROOT / test).exists():
            print(f"  WARNING: {page} is left to {test}, which this tree does not have")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
