"""``make demo``: the batch-training pipeline (prepare → train → evaluate, ``components/``)
on Airflow, KFP and Prefect — each on its embedded default (``dag.test`` with SQLite,
``kfp.local``, Prefect's ephemeral server) — with faults injected and survived.

On each orchestrator:

1. faults: ``prepare`` fails once (retryable: the orchestrator retries it exactly once) and
   rank 1 of ``train`` is killed mid-epoch 1 (the agent restarts the group, training resumes
   from the checkpoint: the epoch counter continues); the model must beat chance;
2. a non-retryable error in ``train``: the run fails at once, no retry, root cause shown;
3. a run cancelled mid-epoch (SIGINT to the orchestrator's process): no process left.

Every process of a run carries ``TORCHSTEP_DEMO_MARK`` in its environment; /proc is checked
for survivors after each run. Ends with a summary table and a legend of its columns; exits 1
if any expectation fails. When the output is not a terminal, a long wait prints a progress
line every 10 s.

The logs of every run go under ``<state>/logs/``: ``<orchestrator>/<scenario>/<orchestrator>.log``
(what the orchestrator printed) and ``<orchestrator>/<scenario>/<step>/try<N>/`` (torchstep's run
directory of each try of each step), listed in ``<state>/logs/INDEX.md``.

Usage: ``python dags/demo.py [--quick] [--only airflow,kfp,prefect]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MARK_ENV = "TORCHSTEP_DEMO_MARK"
SUMMARY = "DEMO_SUMMARY "
ORCHESTRATORS = ("airflow", "kfp", "prefect")


# -- runners: one orchestrator run in this (child) process, a JSON summary on the last line --------
def run_airflow(conf: dict[str, Any]) -> dict[str, Any]:
    sys.path.append(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    import importlib.util

    spec = importlib.util.spec_from_file_location("batch_training", ROOT / "dags" / "airflow" / "batch_training.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    dr = module.batch_training.test(run_conf=conf)
    tasks = {}
    with create_session() as session:
        for ti in dr.get_task_instances(session=session):
            row = (
                session.query(XComModel)
                .filter_by(dag_id=dr.dag_id, run_id=dr.run_id, task_id=ti.task_id, key="return_value")
                .one_or_none()
            )
            tasks[ti.task_id] = {
                "state": str(ti.state),
                "tries": ti.try_number,
                "result": XComModel.deserialize_value(row) if row is not None else None,
            }
    return {"ok": str(dr.state) == "success", "tasks": tasks}


def run_prefect(conf: dict[str, Any]) -> dict[str, Any]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("batch_training", ROOT / "dags" / "prefect" / "batch_training.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    from prefect.client.orchestration import get_client
    from torchstep_prefect import StepFailed

    state = module.batch_training(**conf, return_state=True)
    outcome = state.result(raise_on_failure=False)
    results = outcome if isinstance(outcome, dict) else {}
    if isinstance(outcome, StepFailed):  # the failed step's result travels with the exception
        results = {"train": outcome.result}
    with get_client(sync_client=True) as client:
        runs = [r for r in client.read_task_runs() if r.flow_run_id == state.state_details.flow_run_id]
    tasks = {}
    for r in runs:
        name = r.name.rsplit("-", 1)[0]
        tasks[name] = {
            "state": r.state.name if r.state else "?",
            "tries": r.run_count,
            "result": results.get(name) if isinstance(results, dict) else None,
        }
    return {"ok": state.is_completed(), "tasks": tasks, "message": state.message}


def run_kfp(conf: dict[str, Any]) -> dict[str, Any]:
    from kfp import local

    root = Path(conf.pop("pipeline_root"))
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root), raise_on_error=False)
    import importlib.util

    spec = importlib.util.spec_from_file_location("kfp_batch_training", ROOT / "dags" / "kfp" / "batch_training.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    run = module.batch_training(**conf)
    tasks = {}
    for task in ("prepare", "train", "evaluate"):
        found = sorted(root.glob(f"batch-training-*/{task}/result"))
        result = json.loads(found[-1].read_text()) if found else None
        # kfp.local ignores set_retry: the step spends the APPLICATION budget itself and its
        # result counts the tries (``attempts``)
        tries = int((result or {}).get("attempts") or 1)
        tasks[task] = {"state": (result or {}).get("state", "not run"), "tries": tries, "result": result}
    del run  # kfp.local's return value; the step results say what happened
    return {"ok": all(t["state"] == "SUCCEEDED" for t in tasks.values()), "tasks": tasks}


def runner_main(name: str, conf_json: str, summary_file: str) -> None:
    # the orchestrator's process is cancelled with Ctrl-C (SIGINT), which a shell that ran
    # the demo as a background job would have it ignore: take it as an interactive one does
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    conf = json.loads(conf_json)
    summary = {"airflow": run_airflow, "kfp": run_kfp, "prefect": run_prefect}[name](conf)
    # beside the orchestrator's own output, which goes to the scenario's log whole
    Path(summary_file).write_text(json.dumps(summary, default=str))


# -- the demo: runs every scenario in child processes and checks what happened -----------------
def marked(mark: str) -> list[int]:
    """Live processes (not zombies) whose environment holds ``MARK_ENV=mark``."""
    want, found = f"{MARK_ENV}={mark}".encode(), []
    for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat", "rb") as f:
                zombie = f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
        except OSError:
            continue
        if want in env and not zombie:
            found.append(int(pid))
    return found


#: scenario -> what it does (the index of the logs folder says it too)
SCENARIOS = {
    # what is injected and what must follow: the outcome is said once the run has ended
    "faults": "prepare fails once, rank 1 of train is killed mid-epoch 1 (each must be survived)",
    "non-retryable": "train raises NonRetryableError (the run must fail at once, without a retry)",
    "cancel": "the orchestrator's process gets SIGINT mid-epoch (every process must stop)",
}
#: Seconds without output after which a long wait prints a progress line (output not a terminal).
PROGRESS_EVERY_S = 10.0

LEGEND = """\
  steps       torchstep steps of the pipeline that ran (prepare, train, evaluate); Airflow's DAG
              also runs publish_model, a plain @task that emits the model as an Airflow Asset
  restarts    rounds in which torchstep's agent restarted train's worker group after rank 1 was
              killed (1 expected: training resumed from the epoch's checkpoint, no step retry);
              a step's result.json counts every replica's restarts: 2 nodes restarted once, 2
  retries     times the orchestrator retried prepare after its planned failure (1 expected; under
              kfp.local, which ignores set_retry, the step spent the same budget itself)
  wall (s)    wall time of the faults run, the orchestrator's start-up included
  accuracy    held-out accuracy of the trained model (chance is 0.25); KFP's train step is one
              pod of 2 processes, the others' 2 nodes of 2: other batches, another number
  orphans     processes of the three runs still alive once each run ended (0 expected)
  root cause  what the failed train step of the non-retryable run reports (it failed at once)"""


class Progress:
    """What the demo is doing: a spinner on a terminal; otherwise (``make demo > file``, CI)
    a line when a phase starts and a line every :data:`PROGRESS_EVERY_S` of a long wait."""

    def __init__(self, console: Any, status: Any) -> None:
        self.console = console
        self.status = status  # None when the output is not a terminal
        self.phase = ""
        self.started = self.last = time.monotonic()

    def update(self, phase: str) -> None:
        """A new phase (``"kfp, faults: what it does …"``; a wait's lines name what is before the ":")."""
        self.phase, self.started = phase, time.monotonic()
        if self.status is not None:
            self.status.update(phase)
        else:
            self.say(f"  {phase}")

    def tick(self) -> None:
        """Called while waiting: prints that the phase goes on, at most every PROGRESS_EVERY_S."""
        if self.status is None and time.monotonic() - self.last >= PROGRESS_EVERY_S:
            label = self.phase.partition(":")[0]
            self.say(f"    {label}: still running ({time.monotonic() - self.started:.0f} s)")

    def say(self, text: str) -> None:
        self.console.print(text, highlight=False)
        self.last = time.monotonic()


class Demo:
    def __init__(self, quick: bool, state: Path, progress: Progress) -> None:
        self.quick = quick
        self.state = state
        self.logs = state / "logs"
        self.progress = progress
        self.sizes = {"samples": 400 if quick else 2000, "epochs": 2 if quick else 4}
        self.failures: list[str] = []
        self.rows: list[dict[str, Any]] = []
        self.index: list[dict[str, Any]] = []

    def env(self, name: str, mark: str, torchstep_state: Path | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PREFECT_"))}
        bin_dir = str(Path(sys.executable).parent)
        env.update(
            {
                MARK_ENV: mark,
                "XDG_STATE_HOME": str(torchstep_state or self.state / "runs"),
                "PATH": os.pathsep.join([bin_dir, env.get("PATH", "")]),
                "PYTHONPATH": str(ROOT),
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # pytorch#135712: restarts are reliable with it
            }
        )
        if name == "airflow":
            home = self.state / "airflow"
            env.update(
                {
                    "AIRFLOW_HOME": str(home),
                    "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags" / "airflow"),
                    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                    "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
                }
            )
        if name == "prefect":
            env.update(
                {
                    "PREFECT_HOME": str(self.state / "prefect"),
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
                }
            )
        return env

    def setup(self, name: str) -> None:
        if name == "airflow" and not (self.state / "airflow" / ".migrated").exists():
            (self.state / "airflow").mkdir(parents=True, exist_ok=True)
            self.progress.update("airflow: creating its database (airflow db migrate) …")
            airflow = str(Path(sys.executable).with_name("airflow"))
            proc = subprocess.Popen(
                [airflow, "db", "migrate"],
                env=self.env(name, "-"),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            deadline = time.monotonic() + 300
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
                self.progress.tick()
            _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if proc.returncode:
                raise SystemExit(f"airflow db migrate failed ({proc.returncode}):\n{err[-3000:]}")
            (self.state / "airflow" / ".migrated").touch()

    def conf(self, name: str, workdir: Path, **faults: Any) -> dict[str, Any]:
        conf: dict[str, Any] = {"workdir": str(workdir), **self.sizes, **faults}
        if name == "kfp":
            conf["pipeline_root"] = str(workdir / "kfp-root")
        if name == "airflow":
            conf["nnodes"] = "2"
        return conf

    def run(
        self, name: str, scenario: str, mark: str, *, cancel: bool = False, **faults: Any
    ) -> tuple[dict | None, float]:
        """One run of the pipeline in a child process; its output goes to the scenario's log,
        torchstep's run directories to ``logs/<name>/<scenario>/<step>/try<N>``."""
        self.progress.update(f"{name}, {scenario}: {SCENARIOS[scenario]} …")
        workdir = self.state / "work" / name / scenario
        runs = self.state / "runs" / name / scenario  # XDG_STATE_HOME of the run: torchstep's logs
        logs = self.logs / name / scenario
        for d in (workdir, runs, logs):
            d.mkdir(parents=True, exist_ok=True)
        conf = self.conf(name, workdir, **faults)
        summary_file = workdir / "summary.json"
        argv = [sys.executable, str(Path(__file__).resolve()), "--runner", name, json.dumps(conf), str(summary_file)]
        t0 = time.monotonic()
        with open(logs / f"{name}.log", "w") as log:
            proc = subprocess.Popen(
                argv,
                env=self.env(name, mark, runs),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                start_new_session=True,
            )
            try:
                if cancel:  # wait for the first checkpoint: the next epoch is running
                    self.wait(proc, lambda: (workdir / "ckpt" / "last.pt").exists(), 300)
                    time.sleep(0.5)
                    os.kill(proc.pid, signal.SIGINT)  # the orchestrator's process only: it must stop the rest
                self.wait(proc, lambda: False, 900)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        wall = time.monotonic() - t0
        summary = json.loads(summary_file.read_text()) if summary_file.exists() else None
        self.collect_logs(name, scenario, runs / "torchstep")
        return summary, wall

    def wait(self, proc: subprocess.Popen, done: Any, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and not done() and time.monotonic() < deadline:
            time.sleep(0.2)
            self.progress.tick()

    def orphans_after(self, mark: str, wait_s: float = 15.0) -> int:
        """The processes of a run still alive ``wait_s`` after it ended (then killed)."""
        deadline = time.monotonic() + wait_s
        while marked(mark) and time.monotonic() < deadline:
            time.sleep(0.2)
            self.progress.tick()
        left = marked(mark)
        for pid in left:  # never leave them running, but count them
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(left)

    def collect_logs(self, name: str, scenario: str, runs: Path) -> None:
        """Move torchstep's run directories (``<app>-<hash>``, one per try of a step) to
        ``logs/<name>/<scenario>/<step>/try<N>`` and note each in the index."""
        tries: dict[str, list[tuple[float, Path, dict]]] = {}
        for run_dir in runs.iterdir() if runs.is_dir() else []:
            if not run_dir.is_dir():
                continue
            try:
                result = json.loads((run_dir / "result.json").read_text())
            except (OSError, ValueError):
                result = {}
            started = result.get("started_at") or run_dir.stat().st_mtime
            tries.setdefault(run_dir.name.rpartition("-")[0] or run_dir.name, []).append((started, run_dir, result))
        for step, found in tries.items():
            for n, (_, run_dir, result) in enumerate(sorted(found, key=lambda t: t[0]), start=1):
                dest = self.logs / name / scenario / step / f"try{n}"
                dest.parent.mkdir(parents=True, exist_ok=True)
                run_dir.rename(dest)
                self.repoint(run_dir, dest)
                self.index.append(
                    {
                        "orchestrator": name,
                        "scenario": scenario,
                        "step": step,
                        "try": n,
                        "state": result.get("state", "no result"),
                        "app_id": run_dir.name,
                        "folder": dest.relative_to(self.logs).as_posix(),
                    }
                )
        for empty in (runs, *list(runs.parents)[:3]):  # runs/<name>/<scenario>/torchstep, once moved
            with contextlib.suppress(OSError):
                empty.rmdir()

    @staticmethod
    def repoint(old: Path, new: Path) -> None:
        """The paths a moved run directory's files name (its results' ``log_dir`` and
        ``log_file``, the agents' logs) point to where it is now."""
        for f in [*new.rglob("result.json"), *new.rglob("agent.log")]:
            with contextlib.suppress(OSError, UnicodeDecodeError):
                text = f.read_text()
                if str(old) in text:
                    f.write_text(text.replace(str(old), str(new)))

    def write_index(self) -> Path:
        lines = [
            "# torchstep demo: the logs of every run",
            "",
            "`<orchestrator>/<scenario>/<orchestrator>.log`: everything the orchestrator printed (its task logs,",
            "every rank's lines prefixed `[role/rank]`). `<orchestrator>/<scenario>/<step>/try<N>/`: torchstep's",
            "run directory of one try of one step (named `<step>-<hash>` while it ran; the paths in its files",
            "name where it is now): `result.json` (the step result; its `restarts` counts every replica's agent",
            "restarts), `<role>/<replica>/agent.log`, `console.log` and `attempt_<k>/rank<r>.log` (one per rank",
            "and agent restart).",
            "",
            "Scenarios: " + "; ".join(f"`{k}`: {v}" for k, v in SCENARIOS.items()) + ".",
            "",
            "| orchestrator | scenario | step | try | state | folder |",
            "|---|---|---|---|---|---|",
        ]
        order = {n: i for i, n in enumerate([*ORCHESTRATORS, *SCENARIOS, "prepare", "train", "evaluate"])}
        for e in sorted(
            self.index,
            key=lambda e: (*(order.get(e[k], 9) for k in ("orchestrator", "scenario", "step")), e["step"], e["try"]),
        ):
            lines.append(
                f"| {e['orchestrator']} | {e['scenario']} | {e['step']} | {e['try']} | {e['state']} | {e['folder']}/ |"
            )
        if any(e["state"] == "no result" for e in self.index):
            lines += [
                "",
                "`no result`: the step was stopped before it wrote its `result.json`; its replicas' "
                "`<role>/<replica>/result.json` and logs are there.",
            ]
        index = self.logs / "INDEX.md"
        index.write_text("\n".join(lines) + "\n")
        return index

    def expect(self, ok: bool, what: str) -> bool:
        if not ok:
            self.failures.append(what)
        return ok

    def orchestrator(self, name: str) -> None:
        self.setup(name)
        row: dict[str, Any] = {"orchestrator": name}
        # 1. faults survived
        mark = uuid.uuid4().hex
        summary, wall = self.run(name, "faults", mark, fail_once=True, kill_rank=1, kill_at_epoch=1)
        orphans = self.orphans_after(mark)
        tasks = (summary or {}).get("tasks", {})
        train = ((tasks.get("train") or {}).get("result") or {}).get("outputs", {})
        evaluate = ((tasks.get("evaluate") or {}).get("result") or {}).get("outputs", {})
        history = train.get("history", [])
        restarts = max((int(h["restart"]) for h in history), default=0)
        retries = int((tasks.get("prepare") or {}).get("tries", 1)) - 1
        accuracy = evaluate.get("accuracy")
        where = self.logs / name / "faults"
        self.expect(bool(summary and summary.get("ok")), f"{name}: the faults run failed (see {where})")
        self.expect(restarts == 1, f"{name}: expected one restart round of the agent, got {restarts}")
        self.expect(
            train.get("first_epoch") == 1 and [h["epoch"] for h in history] == list(range(self.sizes["epochs"])),
            f"{name}: training did not resume at the killed epoch: {history}",
        )
        self.expect(retries == 1, f"{name}: expected prepare to be retried exactly once, got {retries}")
        self.expect(accuracy is not None and accuracy > 0.25 + 0.3, f"{name}: accuracy {accuracy} does not beat chance")
        survived = bool(summary and summary.get("ok")) and restarts == 1 and retries == 1
        self.progress.say(
            f"  {name}, faults: {'survived' if survived else 'NOT survived'} (agent restart rounds "
            f"{restarts}, retries of prepare {retries}, accuracy {accuracy})"
        )
        # 2. non-retryable
        mark2 = uuid.uuid4().hex
        bad, _ = self.run(name, "non-retryable", mark2, non_retryable=True)
        bad_train = ((bad or {}).get("tasks") or {}).get("train") or {}
        root_cause = ((bad_train.get("result") or {}).get("root_cause") or {}).get("message") or "(see the log)"
        self.expect(
            bool(bad) and not bad.get("ok") and bad_train.get("tries", 1) == 1,
            f"{name}: the non-retryable run was retried or did not fail: {bad_train.get('tries')}",
        )
        orphans += self.orphans_after(mark2)
        self.progress.say(f"  {name}, non-retryable: failed in {bad_train.get('tries', '?')} try: {root_cause}")
        # 3. cancelled mid-epoch
        mark3 = uuid.uuid4().hex
        self.run(name, "cancel", mark3, cancel=True, epochs=10_000)
        orphans += self.orphans_after(mark3)
        self.progress.say(f"  {name}, cancel: stopped; processes left behind by the three runs: {orphans}")
        self.expect(orphans == 0, f"{name}: {orphans} process(es) outlived their run")
        steps = sum(1 for t in tasks.values() if isinstance(t.get("result"), dict) and "schema" in t["result"])
        row.update(
            {
                "steps": steps,
                "restarts": restarts,
                "retries": retries,
                "wall": wall,
                "accuracy": accuracy,
                "orphans": orphans,
                "root_cause": textwrap.shorten(root_cause, 160, placeholder=" …"),
            }
        )
        self.rows.append(row)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--runner":
        runner_main(sys.argv[2], sys.argv[3], sys.argv[4])
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes (CI)")
    p.add_argument("--only", default=",".join(ORCHESTRATORS), help="comma-separated orchestrators")
    p.add_argument("--state", default=None, help="where runs, logs and orchestrator homes go (default: a temp dir)")
    a = p.parse_args()
    from rich.console import Console
    from rich.table import Table

    tty = sys.stdout.isatty()
    console = Console(width=None if tty else 120)
    state = Path(a.state or tempfile.mkdtemp(prefix="torchstep-demo-"))
    names = a.only.split(",")
    console.print(f"[bold]torchstep demo[/]: batch training on {', '.join(names)} — state in {state}")
    with console.status("starting …") if tty else contextlib.nullcontext() as status:
        demo = Demo(a.quick, state, Progress(console, status))
        for name in names:
            t0 = time.monotonic()
            demo.orchestrator(name)
            demo.progress.say(f"  {name}: done in {time.monotonic() - t0:.0f} s")
    table = Table(title="torchstep demo: faults injected and survived")
    for col in ("orchestrator", "steps", "restarts", "retries", "wall (s)", "accuracy", "orphans"):
        table.add_column(col)
    table.add_column("non-retryable root cause", max_width=44)  # wraps at words
    for r in demo.rows:
        table.add_row(
            r["orchestrator"],
            str(r["steps"]),
            str(r["restarts"]),
            str(r["retries"]),
            f"{r['wall']:.0f}",
            f"{r['accuracy']:.3f}" if r["accuracy"] is not None else "-",
            str(r["orphans"]),
            r["root_cause"],
        )
    console.print(table)
    console.print(LEGEND, highlight=False)
    # soft_wrap: a path is never broken over two lines, whatever the width
    console.print(f"logs: {demo.logs} — <orchestrator>/<scenario>/<step>/try<N>", highlight=False, soft_wrap=True)
    console.print(f"index: {demo.write_index()}", highlight=False, soft_wrap=True)
    for failure in demo.failures:
        console.print(f"[red]FAILED[/] {failure}")
    return 1 if demo.failures else 0


if __name__ == "__main__":
    sys.exit(main())
