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
for survivors after each run. Ends with a summary table; exits 1 if any expectation fails.

Usage: ``python dags/demo.py [--quick] [--only airflow,kfp,prefect]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
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
            row = session.query(XComModel).filter_by(dag_id=dr.dag_id, run_id=dr.run_id, task_id=ti.task_id,
                                                     key="return_value").one_or_none()  # fmt: skip
            tasks[ti.task_id] = {"state": str(ti.state), "tries": ti.try_number,
                                 "result": XComModel.deserialize_value(row) if row is not None else None}  # fmt: skip
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
        tasks[name] = {"state": r.state.name if r.state else "?", "tries": r.run_count,
                       "result": results.get(name) if isinstance(results, dict) else None}  # fmt: skip
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
        retried = sum("retried in the step" in w for w in (result or {}).get("warnings", []))
        tasks[task] = {"state": (result or {}).get("state", "not run"), "tries": 1 + retried, "result": result}
    del run  # kfp.local's return value; the step results say what happened
    return {"ok": all(t["state"] == "SUCCEEDED" for t in tasks.values()), "tasks": tasks}


def runner_main(name: str, conf_json: str) -> None:
    conf = json.loads(conf_json)
    summary = {"airflow": run_airflow, "kfp": run_kfp, "prefect": run_prefect}[name](conf)
    print(SUMMARY + json.dumps(summary, default=str), flush=True)


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


def orphans_after(mark: str, wait_s: float = 15.0) -> int:
    deadline = time.monotonic() + wait_s
    while marked(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = marked(mark)
    for pid in left:  # never leave them running, but count them
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(left)


class Demo:
    def __init__(self, quick: bool, state: Path) -> None:
        self.quick = quick
        self.state = state
        self.sizes = {"samples": 400 if quick else 2000, "epochs": 2 if quick else 4}
        self.failures: list[str] = []
        self.rows: list[dict[str, Any]] = []

    def env(self, name: str, mark: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PREFECT_"))}
        bin_dir = str(Path(sys.executable).parent)
        env.update({
            MARK_ENV: mark, "XDG_STATE_HOME": str(self.state / "torchstep"),
            "PATH": os.pathsep.join([bin_dir, env.get("PATH", "")]), "PYTHONPATH": str(ROOT),
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # pytorch#135712: restarts are reliable with it
        })  # fmt: skip
        if name == "airflow":
            home = self.state / "airflow"
            env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags" / "airflow"),
                        "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__UNIT_TEST_MODE": "False"})  # fmt: skip
        if name == "prefect":
            env.update({"PREFECT_HOME": str(self.state / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120"})  # fmt: skip
        return env

    def setup(self, name: str) -> None:
        if name == "airflow" and not (self.state / "airflow" / ".migrated").exists():
            (self.state / "airflow").mkdir(parents=True, exist_ok=True)
            subprocess.run([str(Path(sys.executable).with_name("airflow")), "db", "migrate"], env=self.env(name, "-"),
                           check=True, capture_output=True, timeout=300)  # fmt: skip
            (self.state / "airflow" / ".migrated").touch()

    def conf(self, name: str, workdir: Path, **faults: Any) -> dict[str, Any]:
        conf: dict[str, Any] = {"workdir": str(workdir), **self.sizes, **faults}
        if name == "kfp":
            conf["pipeline_root"] = str(workdir / "kfp-root")
        if name == "airflow":
            conf["nnodes"] = "2"
        return conf

    def run(self, name: str, conf: dict[str, Any], mark: str, *, cancel: bool = False) -> tuple[dict | None, float]:
        argv = [sys.executable, str(Path(__file__).resolve()), "--runner", name, json.dumps(conf)]
        Path(conf["workdir"]).mkdir(parents=True, exist_ok=True)
        log = open(Path(conf["workdir"]) / f"{name}.log", "w")
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, env=self.env(name, mark), stdout=subprocess.PIPE, stderr=log, text=True,
                                cwd=ROOT, start_new_session=True)  # fmt: skip
        if cancel:  # wait for the first checkpoint: the next epoch is running
            ckpt = Path(conf["workdir"]) / "ckpt" / "last.pt"
            deadline = time.monotonic() + 300
            while not ckpt.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(0.5)
            os.kill(proc.pid, signal.SIGINT)  # the orchestrator's process only: what it does must stop the rest
        try:
            out, _ = proc.communicate(timeout=900)
        finally:
            log.close()
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        lines = [x for x in out.splitlines() if x.startswith(SUMMARY)]
        return (json.loads(lines[-1][len(SUMMARY) :]) if lines else None), time.monotonic() - t0

    def expect(self, ok: bool, what: str) -> bool:
        if not ok:
            self.failures.append(what)
        return ok

    def orchestrator(self, name: str, status: Any) -> None:
        self.setup(name)
        base = Path(tempfile.mkdtemp(prefix=f"demo-{name}-", dir=self.state))
        row: dict[str, Any] = {"orchestrator": name}
        # 1. faults survived
        status.update(f"{name}: prepare fails once, rank 1 killed mid-epoch 1 …")
        mark = uuid.uuid4().hex
        summary, wall = self.run(
            name, self.conf(name, base / "faults", fail_once=True, kill_rank=1, kill_at_epoch=1), mark
        )
        orphans = orphans_after(mark)
        tasks = (summary or {}).get("tasks", {})
        train = ((tasks.get("train") or {}).get("result") or {}).get("outputs", {})
        evaluate = ((tasks.get("evaluate") or {}).get("result") or {}).get("outputs", {})
        history = train.get("history", [])
        restarts = max((h["restart"] for h in history), default=0)
        retries = (tasks.get("prepare") or {}).get("tries", 1) - 1
        accuracy = evaluate.get("accuracy")
        self.expect(bool(summary and summary.get("ok")), f"{name}: the faults run failed (see {base / 'faults'})")
        self.expect(restarts == 1, f"{name}: expected one restart round of the agent, got {restarts}")
        self.expect(train.get("first_epoch") == 1 and [h["epoch"] for h in history] == list(range(self.sizes["epochs"])),
                    f"{name}: training did not resume at the killed epoch: {history}")  # fmt: skip
        self.expect(retries == 1, f"{name}: expected prepare to be retried exactly once, got {retries}")
        self.expect(accuracy is not None and accuracy > 0.25 + 0.3, f"{name}: accuracy {accuracy} does not beat chance")
        # 2. non-retryable
        status.update(f"{name}: a non-retryable error …")
        mark2 = uuid.uuid4().hex
        bad, _ = self.run(name, self.conf(name, base / "non-retryable", non_retryable=True), mark2)
        bad_train = ((bad or {}).get("tasks") or {}).get("train") or {}
        root_cause = ((bad_train.get("result") or {}).get("root_cause") or {}).get("message") or "(see the log)"
        self.expect(bool(bad) and not bad.get("ok") and bad_train.get("tries", 1) == 1,
                    f"{name}: the non-retryable run was retried or did not fail: {bad_train.get('tries')}")  # fmt: skip
        orphans += orphans_after(mark2)
        # 3. cancelled mid-epoch
        status.update(f"{name}: cancelled mid-epoch …")
        mark3 = uuid.uuid4().hex
        self.run(name, self.conf(name, base / "cancel", epochs=10_000), mark3, cancel=True)
        orphans += orphans_after(mark3)
        self.expect(orphans == 0, f"{name}: {orphans} process(es) outlived their run")
        row.update({"steps": len(tasks), "restarts": restarts, "retries": retries, "wall": wall, "accuracy": accuracy,
                    "orphans": orphans, "root_cause": root_cause[:60], "logs": str(self.state / "torchstep")})  # fmt: skip
        self.rows.append(row)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--runner":
        runner_main(sys.argv[2], sys.argv[3])
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes (CI)")
    p.add_argument("--only", default=",".join(ORCHESTRATORS), help="comma-separated orchestrators")
    p.add_argument("--state", default=None, help="where runs, logs and orchestrator homes go (default: a temp dir)")
    a = p.parse_args()
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 140)
    state = Path(a.state or tempfile.mkdtemp(prefix="torchstep-demo-"))
    demo = Demo(a.quick, state)
    console.print(f"[bold]torchstep demo[/]: batch training on {a.only.replace(',', ', ')} — state in {state}")
    with console.status("starting …") as status:
        for name in a.only.split(","):
            t0 = time.monotonic()
            demo.orchestrator(name, status)
            console.print(f"  {name}: done in {time.monotonic() - t0:.0f} s")
    table = Table(title="torchstep demo: faults injected and survived")
    for col in (
        "orchestrator",
        "steps",
        "restarts",
        "retries",
        "wall (s)",
        "accuracy",
        "orphans",
        "non-retryable root cause",
    ):
        table.add_column(col)
    for r in demo.rows:
        table.add_row(r["orchestrator"], str(r["steps"]), str(r["restarts"]), str(r["retries"]), f"{r['wall']:.0f}",
                      f"{r['accuracy']:.3f}" if r["accuracy"] is not None else "-", str(r["orphans"]), r["root_cause"])  # fmt: skip
    console.print(table)
    console.print(f"logs: {state / 'torchstep'}")
    for failure in demo.failures:
        console.print(f"[red]FAILED[/] {failure}")
    return 1 if demo.failures else 0


if __name__ == "__main__":
    sys.exit(main())
