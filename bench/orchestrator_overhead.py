"""Per-step overhead of each orchestrator's local run: one step running a 2-process gloo
hello world (``bench/_hello.py``), written with torchstep vs written by hand the way users
do without it — the same orchestrator, the same script under plain ``torchrun``:

- Airflow (``dag.test()``, SQLite): ``AppDefOperator(app="dist.ddp", ...)`` vs a
  ``BashOperator`` running ``torchrun``;
- Prefect (ephemeral server): ``app_task`` of the ``dist.ddp`` AppDef vs a ``@task`` that runs ``torchrun``
  with ``subprocess``;
- KFP (``kfp.local`` SubprocessRunner): ``component_from_app`` vs a lightweight component
  that runs ``torchrun`` with ``subprocess``.

Each variant is a fresh ``python`` process (what a user's local run costs), runs alternated;
the bare ``torchrun`` command is measured too, so the table shows what each orchestrator
itself adds. Usage: ``python bench/orchestrator_overhead.py [--runs N] [--only airflow]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "scripts"))
from agent_bench import BIN, clean_env  # noqa: E402
from figures import full, record  # noqa: E402
from figures import runs as mode_runs  # noqa: E402

HELLO = str(ROOT / "bench" / "_hello.py")
TORCHRUN = str(BIN / "torchrun")

AIRFLOW_DAG = """
import sys
from airflow.sdk import DAG
{imports}
with DAG("{dag_id}", schedule=None) as dag:
    {task}
if __name__ == "__main__":
    run = dag.test()
    sys.exit(0 if run.state == "success" else 1)
"""
AIRFLOW = {
    "ours": (
        "from torchstep_airflow import AppDefOperator",
        f"AppDefOperator(task_id='hello', app='dist.ddp', app_args=['-j', '1x2', '--script', {HELLO!r}])",
    ),
    "peer": (
        "from airflow.providers.standard.operators.bash import BashOperator",
        f"BashOperator(task_id='hello', bash_command='{TORCHRUN} --nproc-per-node 2 {HELLO}')",
    ),
}

PREFECT_FLOW = """
import subprocess
from prefect import flow, task
import torchstep
from torchstep_prefect import app_task

hello = app_task(torchstep.materialize("dist.ddp", ["-j", "1x2", "--script", {hello!r}]), target="local")

@task
def by_hand():
    subprocess.run([{torchrun!r}, "--nproc-per-node", "2", {hello!r}], check=True)

@flow
def ours():
    hello()

@flow
def peer():
    by_hand()

if __name__ == "__main__":
    import sys
    (ours if sys.argv[1] == "ours" else peer)()
"""

KFP_PIPELINE = """
import sys, tempfile
from kfp import dsl, local
local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=tempfile.mkdtemp(prefix="kfp-bench-"))
import torchstep
from torchstep_kfp import component_from_app

hello = component_from_app(torchstep.materialize("dist.ddp", ["-j", "1x2", "--script", {hello!r}]))

@dsl.component(install_kfp_package=False)
def by_hand():
    import subprocess
    subprocess.run([{torchrun!r}, "--nproc-per-node", "2", {hello!r}], check=True)

@dsl.pipeline
def ours():
    hello().set_caching_options(False)

@dsl.pipeline
def peer():
    by_hand().set_caching_options(False)

if __name__ == "__main__":
    (ours if sys.argv[1] == "ours" else peer)()
"""


def timed(argv: list[str], env: dict[str, str], cwd: str) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=False, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv[-2:])} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return time.perf_counter() - t0


def setups(tmp: Path) -> dict[str, tuple[dict[str, list[str]], dict[str, str]]]:
    """orchestrator -> ({variant: argv}, env)."""
    py = sys.executable
    base = clean_env(PYTHONPATH=str(ROOT), XDG_STATE_HOME=str(tmp / "state"))
    home = tmp / "airflow"
    (home / "dags").mkdir(parents=True)
    for name, (imports, task) in AIRFLOW.items():
        (home / "dags" / f"{name}.py").write_text(
            AIRFLOW_DAG.format(imports=imports, task=task, dag_id=f"bench_{name}")
        )
    af_env = {
        **base,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    }
    subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=af_env, capture_output=True, check=True, timeout=300)
    (tmp / "flow.py").write_text(PREFECT_FLOW.format(torchrun=TORCHRUN, hello=HELLO))
    pf_env = {
        **{k: v for k, v in base.items() if not k.startswith("PREFECT_")},
        "PREFECT_HOME": str(tmp / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    }
    (tmp / "pipeline.py").write_text(KFP_PIPELINE.format(torchrun=TORCHRUN, hello=HELLO))
    return {
        "airflow": ({v: [py, str(home / "dags" / f"{v}.py")] for v in AIRFLOW}, af_env),
        "prefect": ({v: [py, str(tmp / "flow.py"), v] for v in ("ours", "peer")}, pf_env),
        "kfp": ({v: [py, str(tmp / "pipeline.py"), v] for v in ("ours", "peer")}, base),
    }


FIGURE = {"airflow": "7a", "prefect": "7b", "kfp": "7c"}
WHAT = {
    "airflow": "Airflow dag.test(), one step: AppDefOperator vs BashOperator running torchrun",
    "prefect": "Prefect local flow, one step: app_task vs a @task running torchrun",
    "kfp": "kfp.local pipeline, one step: component_from_app vs a lightweight component running torchrun",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=mode_runs(2, 5))
    ap.add_argument("--only", action="append", choices=list(FIGURE))
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="torchstep-bench-") as tmp_s:
        tmp = Path(tmp_s)
        bare = [timed([TORCHRUN, "--nproc-per-node", "2", HELLO], clean_env(), tmp_s) for _ in range(ns.runs)]
        bare_s = statistics.median(bare)
        print(f"bare torchrun: {bare_s:.2f} s", flush=True)
        for orch, (variants, env) in setups(tmp).items():
            if ns.only and orch not in ns.only:
                continue
            # warm-up: bytecode, databases, page cache (quick mode: one run warms the orchestrator for both)
            for argv in list(variants.values()) if full() else [variants["peer"]]:
                timed(argv, env, tmp_s)
            times: dict[str, list[float]] = {v: [] for v in variants}
            for i in range(ns.runs):
                for v in variants if i % 2 == 0 else reversed(list(variants)):
                    times[v].append(timed(variants[v], env, tmp_s))
            ours, peer = statistics.median(times["ours"]), statistics.median(times["peer"])
            record(
                FIGURE[orch],
                WHAT[orch],
                times["ours"],
                times["peer"],
                peer_name=f"{orch} + torchrun by hand",
                goal=1.15,
                command=f"python bench/orchestrator_overhead.py --only {orch} --runs {ns.runs}",
                note=f"over the bare torchrun command ({bare_s:.1f} s): ours +{ours - bare_s:.1f} s, "
                f"by hand +{peer - bare_s:.1f} s",
            )
    return 0


if __name__ == "__main__":
    os.environ.pop("PREFECT_API_URL", None)
    sys.exit(main())
