"""DAG parse cost of AppDefOperator against BashOperator and KubernetesPodOperator.

1. **Headline: the real ``airflow dag-processor``'s own stats.** One dags folder in a private
   SQLite home holds a DAG file per variant and size (AppDefOperator with a TorchX builtin by
   name, with a ``file.py:fn`` reference, with a component function; BashOperator;
   KubernetesPodOperator; 50 and 500 tasks, each task with its own arguments). ``airflow
   dag-processor --num-runs N`` parses them (``parsing_processes=1``,
   ``min_file_process_interval=2``, ``print_stats_interval=1``) and logs its "DAG File
   Processing Stats" table every second; each file's **Last Duration** (the manager's clock
   from just after the child's fork to the collection of its result) is read from those tables, one
   sample per (file, Last Run At), the first parse of each file dropped (it compiles, creates
   the DAG rows and fills the plan store). Medians of BENCH_LOOPS loops (default 10, quick 5).
   Why the logged table rather than the ``dag`` table's ``last_parse_duration`` (same number,
   full precision): the table is read after the run, so nothing polls the SQLite file the
   processor writes (a reader there can make the processor wait on its lock), and it is what
   an Airflow user reads. Its 10 ms resolution is small against the ~0.1-1 s durations.
2. **Second row: the fork model.** This bench's emulation of the dag-processor (the headline
   until the real one's stats replaced it): a parent pre-imports only the ``airflow.*``
   modules the DAG files name (``parsing_pre_import_modules``) and forks a child per file that
   imports it (as ``DagBag`` does) and exits; the parent times fork -> exit. Measured: the
   **re-parse of an unchanged file** (the plan store, ``torchstep.components.plan_store``, warm
   from an untimed first parse), and the **first parse of a changed file** (every task's
   arguments new: the store misses); 10/50/200/500 tasks. Also with a parent that has
   pre-imported the operator modules, TorchX and torchstep's planner (figure 5j).
3. **whole process**: ``python dagfile.py`` wall time (imports included), and ``airflow dags
   report`` (long mode); 50 tasks.

The fork model caches byte code in a temp ``sys.pycache_prefix`` as on an installed system;
the plan store lives in a temp directory (``TORCHSTEP_PLAN_CACHE``). Its medians are of
BENCH_REPEATS (default 7, quick 3) runs each, interleaved and in alternating order so machine
load hits every variant alike. Prints the ratios, records the figures (``bench/results.json``)
and writes bench/results/airflow.md. Usage: ``python bench/airflow_parse.py
[--dag-processor-only | --fork-only]`` (``--dag-processor-only``: the headline alone, recorded,
its section of bench/results/airflow.md replaced; ``--fork-only``: the fork model alone,
printed, nothing recorded). ``BENCH_SIZES=50,500`` limits the fork model's sizes (50 and 500
are always measured when recording).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
from figures import curve, full, record

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "airflow.md"
BIN = Path(sys.executable).parent
REPEATS = int(os.environ.get("BENCH_REPEATS", "7" if full() else "3"))
#: the plan store's directory (torchstep.components.plan_store.ENV): a temp one, never the user's
PLAN_STORE_ENV = "TORCHSTEP_PLAN_CACHE"
TASKS = 50
GOAL = 1.1
FORK_SIZES = tuple(int(n) for n in os.environ.get("BENCH_SIZES", "10,50,200,500").split(","))
FORK_GOAL, FORK_STRETCH = 3.0, 1.5
PEER = "BashOperator"

HEADER = "from airflow.sdk import DAG\n"
VARIANTS = {
    # the recommended style: import the component function, pass it with its arguments
    "AppDefOperator": HEADER
    + "from torchx.components.dist import ddp\n"
    + "from torchstep_airflow import AppDefOperator\n"
    + "with DAG('appdef', schedule=None):\n"
    + f"    for i in range({TASKS}):\n"
    + "        AppDefOperator(task_id=f't{i}', app=ddp,\n"
    + "                       app_args={'j': '2x2', 'script': 'train.py', 'script_args': ['--seed', str(i)]})\n",
    # a TorchX builtin by name: TorchX's component finder scans every builtin once per process
    "AppDefOperator (builtin by name)": HEADER
    + "from torchstep_airflow import AppDefOperator\n"
    + "with DAG('appdef_ref', schedule=None):\n"
    + f"    for i in range({TASKS}):\n"
    + "        AppDefOperator(task_id=f't{i}', app='dist.ddp',\n"
    + "                       app_args=['-j', '2x2', '--script', 'train.py', '--', '--seed', str(i)])\n",
    "BashOperator": HEADER
    + "from airflow.providers.standard.operators.bash import BashOperator\n"
    + "with DAG('bash', schedule=None):\n"
    + f"    for i in range({TASKS}):\n"
    + "        BashOperator(task_id=f't{i}', bash_command=f'torchrun --nproc-per-node 2 train.py --seed {i}')\n",
    "KubernetesPodOperator": HEADER
    + "from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator\n"
    + "with DAG('kpo', schedule=None):\n"
    + f"    for i in range({TASKS}):\n"
    + "        KubernetesPodOperator(task_id=f't{i}', image='ghcr.io/pytorch/torchx:0.7.0', cmds=['torchrun'],\n"
    + "                              arguments=['--nproc-per-node', '2', 'train.py', '--seed', str(i)])\n",
}


TRAINER = ROOT / "components" / "train.py"
BUILTIN = "AppDefOperator (builtin by name)"
FILEREF = "AppDefOperator (file.py:fn reference)"
FUNCTION = "AppDefOperator (component function)"
KPO = "KubernetesPodOperator"
PEER_TORCHX = "BashOperator (+ TorchX import)"
#: string references: their goals are against BashOperator and KubernetesPodOperator
REFERENCES = (BUILTIN, FILEREF)
#: goals of the headline (realistic setting, unchanged file)
GOAL_50, GOAL_500, GOAL_KPO, GOAL_FUNCTION = 1.5, 2.0, 1.0, 1.5


def fork_dag(variant: str, n: int, base: int = 0) -> str:
    """The DAG file of ``n`` tasks of ``variant`` for the forked-child measurement (task
    ``i`` gets seed ``base + i``: a new ``base`` is a changed file)."""
    head = "from airflow.sdk import DAG\n"
    loop = f"with DAG('parse_{n}', schedule=None) as dag:\n    for i in range({base}, {base + n}):\n"
    if variant == FUNCTION:
        return (
            head
            + "from torchx.components.dist import ddp\nfrom torchstep_airflow import AppDefOperator\n"
            + loop
            + "        AppDefOperator(task_id=f't{i}', app=ddp,\n"
            + "                       app_args={'j': '2x2', 'script': 'train.py', 'script_args': ['--seed', str(i)]})\n"
        )
    if variant == BUILTIN:
        return (
            head
            + "from torchstep_airflow import AppDefOperator\n"
            + loop
            + "        AppDefOperator(task_id=f't{i}', app='dist.ddp',\n"
            + "                       app_args=['-j', '2x2', '--script', 'train.py', '--', '--seed', str(i)])\n"
        )
    if variant == FILEREF:
        return (
            head
            + "from torchstep_airflow import AppDefOperator\n"
            + loop
            + f"        AppDefOperator(task_id=f't{{i}}', app={str(TRAINER) + ':trainer'!r},\n"
            + "                       app_args={'replicas': 2, 'steps': i + 1, 'lr': 0.1})\n"
        )
    if variant in (PEER, PEER_TORCHX):
        return (
            head
            + "from airflow.providers.standard.operators.bash import BashOperator\n"
            + ("from torchx.components.dist import ddp\n" if variant == PEER_TORCHX else "")
            + loop
            + "        BashOperator(task_id=f't{i}', bash_command=f'torchrun --nproc-per-node 2 train.py --seed {i}')\n"
        )
    if variant == KPO:
        return (
            head
            + "from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator\n"
            + loop
            + "        KubernetesPodOperator(task_id=f't{i}', image='ghcr.io/pytorch/torchx:0.7.0', cmds=['torchrun'],\n"
            + "                              arguments=['--nproc-per-node', '2', 'train.py', '--seed', str(i)])\n"
        )
    raise ValueError(variant)


#: the fork model's variants (a parent with only airflow.* pre-imported)
REAL_VARIANTS = (BUILTIN, FILEREF, FUNCTION, PEER, PEER_TORCHX, KPO)
#: the variants of the fork model with torchstep pre-imported (figure 5j)
FORK_VARIANTS = (FUNCTION, BUILTIN, FILEREF, PEER)
#: first parse of a changed file: measured for these at 50 and 500 tasks
CHANGED_VARIANTS = (BUILTIN, FILEREF, FUNCTION)
#: What the warm parent (torchstep pre-imported) has imported: the files' imports, the operator
#: modules, and what constructing an AppDefOperator imports on first use (TorchX's specs,
#: finder and builders, torchstep's spec layer). Nothing of torchstep runs in the parent.
WARM_IMPORTS = (
    "airflow.sdk",
    "airflow.providers.standard.operators.bash",
    "torchx.components.dist",
    "torchstep_airflow",
    "torchstep_airflow.operators",
    "torchx.specs",
    "torchx.specs.builders",
    "torchx.specs.finder",
    "torchx.specs.file_linter",
    "torchstep.components.builders",
    "torchstep.plan.planner",
)
#: Airflow 3.3's own pre-import (``[dag_processor] parsing_pre_import_modules``): the
#: ``airflow.*`` modules the DAG files import, nothing else (a running dag-processor has
#: imported those of every file it parsed).
AIRFLOW_IMPORTS = (
    "airflow.sdk",
    "airflow.providers.standard.operators.bash",
    "airflow.providers.cncf.kubernetes.operators.pod",
)


def _load_dag(path: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"bench_dag_{abs(hash(path))}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: CPU seconds of the last forked child (appended by _fork_parse)
CPU: list[float] = []


def _fork_parse(path: str, n: int) -> float:
    """Wall time of a forked child that parses the DAG file ``path`` (``n`` tasks)."""
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: parse, check, leave without cleanup (as a dag-processor child does)
        code = 3
        try:
            tasks = len(_load_dag(path).dag.tasks)
            code = 0 if tasks == n else 4
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    _, status, usage = os.wait4(pid, 0)
    elapsed = time.perf_counter() - t0
    if status != 0:
        raise RuntimeError(f"parsing {path} failed in the child (status {status})")
    CPU.append(usage.ru_utime + usage.ru_stime)  # the child's own CPU time: what load does not inflate
    return elapsed


def fork_parent(config_path: str) -> int:
    """The parent (a subprocess of main): prints {variant: {size: [seconds...]}} as JSON;
    "changed: <variant>" keys hold the first parses of changed files."""
    cfg = json.loads(Path(config_path).read_text())
    sys.pycache_prefix, sys.dont_write_bytecode = cfg["pycache"], False
    for name in cfg["imports"]:
        importlib.import_module(name)
    _load_dag(cfg["warmup"])  # Airflow's lazy imports (timetables...), loaded in a running dag-processor
    files: dict[str, dict[str, str]] = cfg["files"]
    changed: dict[str, dict[str, str]] = cfg.get("changed", {})
    variants = list(files)
    for v in variants:  # untimed first parse: byte code, file system cache, the plan store
        for size, path in files[v].items():
            _fork_parse(path, int(size))
    times: dict[str, dict[str, list[float]]] = {v: {size: [] for size in files[v]} for v in variants}
    times.update({f"changed: {v}": {size: [] for size in changed[v]} for v in changed})
    cpu: dict[str, dict[str, list[float]]] = {v: {size: [] for size in per} for v, per in times.items()}
    for r in range(cfg["repeats"]):
        order = variants if r % 2 == 0 else variants[::-1]  # alternating A/B order
        for size in files[variants[0]]:
            for v in order:
                times[v][size].append(_fork_parse(files[v][size], int(size)))
                cpu[v][size].append(CPU[-1])
        for v, per in changed.items():  # every task's arguments new: the store misses
            for size, path in per.items():
                Path(path).write_text(fork_dag(v, int(size), base=1000 * (r + 1)))
                times[f"changed: {v}"][size].append(_fork_parse(path, int(size)))
                cpu[f"changed: {v}"][size].append(CPU[-1])
    print(json.dumps({"wall": times, "cpu": cpu}))
    return 0


def forked_child(
    tmp: Path,
    env: dict[str, str],
    imports: tuple[str, ...],
    variants: tuple[str, ...],
    sizes: tuple[int, ...],
    changed: tuple[str, ...] = (),
) -> dict[str, dict[int, list[float]]]:
    """Run one parent; {variant: {size: [seconds]}} ("changed: <variant>" for ``changed``)."""
    tag = f"{len(imports)}"
    files: dict[str, dict[str, str]] = {}
    for i, v in enumerate(variants):
        files[v] = {}
        for n in sizes:
            path = tmp / f"fork_{tag}_{i}_{n}.py"
            path.write_text(fork_dag(v, n))
            files[v][str(n)] = str(path)
    changed_files = {
        v: {str(n): str(tmp / f"changed_{tag}_{i}_{n}.py") for n in sizes if n in (50, 500)}
        for i, v in enumerate(changed)
    }
    warmup = tmp / "fork_warmup.py"
    warmup.write_text(fork_dag(PEER, 1))
    cfg = tmp / f"fork_{tag}.json"
    cfg.write_text(
        json.dumps(
            {
                "files": files,
                "changed": changed_files,
                "imports": list(imports),
                "warmup": str(warmup),
                "repeats": REPEATS,
                "pycache": str(tmp / "pycache"),
            }
        )
    )
    out = subprocess.run(
        [sys.executable, __file__, "--fork-parent", str(cfg)], env=env, check=True, capture_output=True, text=True
    ).stdout
    raw = json.loads(out.strip().splitlines()[-1])
    CPU_SAMPLES.update({v: {int(n): ts for n, ts in per.items()} for v, per in raw["cpu"].items()})
    return {v: {int(n): ts for n, ts in per.items()} for v, per in raw["wall"].items()}


#: the children's CPU seconds of the headline parent: {variant: {tasks: [seconds]}}
CPU_SAMPLES: dict[str, dict[int, list[float]]] = {}


def medians(samples: dict[str, dict[int, list[float]]]) -> dict[str, dict[int, float]]:
    return {v: {n: statistics.median(ts) for n, ts in per.items()} for v, per in samples.items()}


def _verdict(ratio: float, goal: float) -> str:
    return "met" if ratio <= goal else "NOT met"


def fork_report(
    real: dict[str, dict[int, float]], warm: dict[str, dict[int, float]], loaded: str, cpu: dict[str, dict[int, float]]
) -> list[str]:
    machine = (
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.1f} at the end"
    )
    lines = [
        FORK_TITLE,
        "",
        f"`python bench/airflow_parse.py` — median of {REPEATS} alternating runs per cell, {machine}, "
        f"measured {time.strftime('%Y-%m-%d')}{loaded}. The parent has pre-imported only the `airflow.*` modules "
        "the DAG files name (Airflow 3.3's `parsing_pre_import_modules`); each child imports the DAG file "
        "(torchstep_airflow and what it needs included) and exits. The file is unchanged since its last parse "
        "(the plan store is warm): what every re-parse, every 30 s, costs. Every task has its own arguments. "
        "The goals are on the wall-time ratio; the CPU ratio (the children's own CPU seconds, `wait4`) is what a "
        "loaded machine does not inflate.",
        "",
        "| what is measured | tasks | ours (median) | peer | peer (median) | ratio | CPU ratio | goal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v in REFERENCES:
        for n, ours in real[v].items():
            goal = GOAL_500 if n >= 500 else GOAL_50
            ratio = ours / real[PEER][n]
            lines.append(
                f"| re-parse, {v} | {n} | {ours * 1000:.0f} ms | {PEER} | {real[PEER][n] * 1000:.0f} ms | "
                f"{ratio:.2f}x | {cpu[v][n] / cpu[PEER][n]:.2f}x | "
                + (f"<= {goal:g}x: {_verdict(ratio, goal)}" if n in (50, 500) else "")
                + " |"
            )
        for n, ours in real[v].items():
            ratio = ours / real[KPO][n]
            lines.append(
                f"| re-parse, {v} | {n} | {ours * 1000:.0f} ms | {KPO} | {real[KPO][n] * 1000:.0f} ms | "
                f"{ratio:.2f}x | {cpu[v][n] / cpu[KPO][n]:.2f}x | <= {GOAL_KPO:g}x: {_verdict(ratio, GOAL_KPO)} |"
            )
    for n, ours in real[FUNCTION].items():
        ratio = ours / real[PEER_TORCHX][n]
        lines.append(
            f"| re-parse, {FUNCTION} | {n} | {ours * 1000:.0f} ms | {PEER_TORCHX} | "
            f"{real[PEER_TORCHX][n] * 1000:.0f} ms | {ratio:.2f}x | "
            f"{cpu[FUNCTION][n] / cpu[PEER_TORCHX][n]:.2f}x | <= {GOAL_FUNCTION:g}x: {_verdict(ratio, GOAL_FUNCTION)} |"
        )
    for v in CHANGED_VARIANTS:
        peer = PEER_TORCHX if v == FUNCTION else PEER
        for n, ours in real.get(f"changed: {v}", {}).items():
            lines.append(
                f"| first parse of a changed file (every task new), {v} | {n} | {ours * 1000:.0f} ms | "
                f"{peer} | {real[peer][n] * 1000:.0f} ms | {ours / real[peer][n]:.2f}x | "
                f"{cpu[f'changed: {v}'][n] / cpu[peer][n]:.2f}x | reported |"
            )
    lines += [
        "",
        "The TorchX import alone (BashOperator file with and without `from torchx.components.dist import ddp`): "
        + ", ".join(f"{n} tasks {(real[PEER_TORCHX][n] - real[PEER][n]) * 1000:.0f} ms" for n in real[PEER])
        + ". On a re-parse of an unchanged file, an AppDefOperator of a string reference (or of a module-level "
        "component function) imports neither TorchX nor torchstep's planner: `import torchstep_airflow` and, per "
        "task, one `stat` of the component file and one small JSON read from the plan store "
        "(`torchstep.components.plan_store`, in `~/.cache/torchstep/plans`). A changed file (or component file) "
        "pays the TorchX import and the full materialize and plan of each new task once, and writes the entries.",
        "",
        "## The fork model with torchstep pre-imported",
        "",
        "The parent has also imported the operator modules, TorchX and torchstep's planner (Airflow does not do "
        f"that by default); plan store warm. Goal of this row: <= {FORK_GOAL:g}x {PEER} (stretch "
        f"<= {FORK_STRETCH:g}x).",
        "",
        f"| what is measured | tasks | ours (median) | {PEER} (median) | ratio | goal |",
        "|---|---|---|---|---|---|",
    ]
    for v in FORK_VARIANTS[:-1]:
        for n, ours in warm[v].items():
            ratio = ours / warm[PEER][n]
            verdict = "stretch met" if ratio <= FORK_STRETCH else "met" if ratio <= FORK_GOAL else "NOT met"
            lines.append(
                f"| forked-child parse, {v} | {n} | {ours * 1000:.0f} ms | {warm[PEER][n] * 1000:.0f} ms | "
                f"{ratio:.2f}x | <= {FORK_GOAL:g}x: {verdict} |"
            )
    lines += [
        "",
        "Before the plan store (this bench, 2026-11-25, 2 CPUs, 50 tasks, airflow.* pre-imported): component "
        "function 118 ms, builtin by name 140 ms, file reference ~130 ms vs BashOperator 20 ms (5.7-7.0x); "
        "2026-11-26 with the store off (`TORCHSTEP_PLAN_CACHE=0`, machine loaded, load average 5-10): builtin by "
        "name 6.2x (50 tasks) / 5.0x (500), file reference 6.5x / 3.4x, component function vs BashOperator + "
        "TorchX 1.6x / 3.8x. "
        "Before the component cache (commit 022de9a, 2026-11-24, torchstep pre-imported): 50 tasks — component "
        "function 82 ms (2.7x), builtin by name 634 ms (20.7x), file reference 2281 ms (74x).",
    ]
    return [*lines, ""]


def env_for(home: Path, dags: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        PYTHONDONTWRITEBYTECODE="1",
    )
    if env.get(PLAN_STORE_ENV) != "0":  # TORCHSTEP_PLAN_CACHE=0: measure without the plan store
        env[PLAN_STORE_ENV] = str(home / "plan-store")
    return env


def whole_process(path: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, str(path)], env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def report_duration(env: dict[str, str]) -> float:
    out = subprocess.run(
        [str(BIN / "airflow"), "dags", "report", "-o", "json"], env=env, check=True, capture_output=True, text=True
    ).stdout
    rows = json.loads(next(line for line in reversed(out.splitlines()) if line.startswith("[{")))
    assert len(rows) == 1 and rows[0]["task_num"] == str(TASKS), rows
    h, m, s = rows[0]["duration"].split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


# --- Headline: the real `airflow dag-processor`'s own accounting --------------------------------

#: the variants of the headline: every reference style and both peers, each in its own DAG file
DP_VARIANTS = (BUILTIN, FILEREF, FUNCTION, PEER, PEER_TORCHX, KPO)
#: processing loops whose per-file durations are kept (the first parse of each file is dropped)
DP_LOOPS = int(os.environ.get("BENCH_LOOPS", "10" if full() else "5"))
#: ``[dag_processor] min_file_process_interval``: two parses of one file are at least this far apart,
#: so the table's "Last Run At" (1 s resolution) tells every parse apart
DP_INTERVAL = 2
#: goals of the headline (issue 34): every reference style, 50 and 500 tasks
DP_GOAL_BASH, DP_GOAL_KPO = 1.5, 1.0
STATS_TITLE = "DAG File Processing Stats"
TITLE = "# Airflow DAG parse cost\n\n"
DP_TITLE = "## The real dag-processor's own stats (headline)"
#: the fork model's section: the headline until the real dag-processor's stats replaced it
FORK_TITLE = "## Second row: the fork model (the dag-processor emulated in a parent of this bench)"
OLD_FORK_TITLE = "## Re-parse in the dag-processor as Airflow 3.3 runs it (headline)"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_stats_tables(text: str) -> dict[str, list[float]]:
    """Each DAG file's parse durations from the "DAG File Processing Stats" tables that the
    dag-processor logs (``DagFileProcessorManager._log_file_processing_stats``).

    A table repeats the last parse of every file until the next one; a parse is one
    (file, "Last Run At") pair, so each counts once. Columns are found by name, their spans
    from the table's dashed rule, so a path with spaces or an empty column stays in place.

    Args:
        text: the dag-processor's log (stdout), any number of tables; ANSI colours allowed.

    Returns:
        ``{file path relative to the bundle: [Last Duration in seconds, in the order parsed]}``.

    Raises:
        ValueError: a table whose header lacks a needed column, or a file that Airflow
            reports with import errors or without exactly one DAG (its parse time would not
            be the file's: the error is in the dag-processor's log for that file).
    """
    lines = _ANSI.sub("", text).splitlines()
    seen: dict[str, dict[str, float]] = {}
    for i, line in enumerate(lines):
        if line.strip() != STATS_TITLE:
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j + 1 >= len(lines):
            break  # a table cut off at the end of the log
        header, rule = lines[j], lines[j + 1]
        spans = [m.span() for m in re.finditer(r"-+", rule)]
        names = [header[a:b].strip() for a, b in spans]
        need = ("File Path", "# DAGs", "# Errors", "Last Duration", "Last Run At")
        missing = [n for n in need if n not in names]
        if missing:
            raise ValueError(f"dag-processor stats table without column(s) {missing}: header {header.strip()!r}")
        col = {n: spans[names.index(n)] for n in need}
        for row in lines[j + 2 :]:
            if not row.strip() or row.startswith("="):
                break

            def cell(name: str, row: str = row) -> str:
                a, b = col[name]
                return row[a:b].strip()

            duration, at, path = cell("Last Duration"), cell("Last Run At"), cell("File Path")
            if not duration or not at:  # not parsed yet (or only running now)
                continue
            if cell("# Errors") not in ("", "0") or cell("# DAGs") != "1":
                raise ValueError(
                    f"{path}: the dag-processor reports {cell('# DAGs')} DAG(s) and {cell('# Errors')} import "
                    "error(s), not 1 and 0: see its log for that file (logs/dag_processor/ in AIRFLOW_HOME)"
                )
            seen.setdefault(path, {}).setdefault(at, float(duration.rstrip("s")))
    return {path: list(per.values()) for path, per in seen.items()}


def dag_processor_env(home: Path, dags: Path) -> dict[str, str]:
    """The environment of the headline's ``airflow dag-processor``: the bench's home, the
    stats table every second, one parsing process (children never share the 2 cores),
    byte code cached as on an installed system."""
    env = env_for(home, dags)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(
        AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL="1",
        AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL=str(DP_INTERVAL),
        AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES="1",
        AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT="300",
        AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT="240",
    )
    return env


def run_dag_processor(home: Path, files: dict[str, str], loops: int) -> dict[str, list[float]]:
    """Write ``files`` ({file name: source}) into a fresh dags folder of ``home`` (whose
    database is migrated), run ``airflow dag-processor`` until every file was parsed
    ``loops + 2`` times, and return each file's re-parse durations from its stats tables
    (the first parse, which compiles, creates the DAG rows and fills the plan store, is
    dropped; the last one is logged only when a table falls between it and the exit)."""
    dags = home / f"dags-processor-{len(list(home.glob('dags-processor-*')))}"
    dags.mkdir()
    for name, source in files.items():
        (dags / name).write_text(source)
    log = dags.parent / f"{dags.name}.log"
    with log.open("w") as out:
        subprocess.run(
            [str(BIN / "airflow"), "dag-processor", "--num-runs", str(loops + 2)],
            env=dag_processor_env(home, dags),
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
            timeout=120 + 60 * loops,
        )
    parsed = parse_stats_tables(log.read_text())
    short = {name: len(parsed.get(name, [])) for name in files if len(parsed.get(name, [])) < 2}
    if short:
        raise RuntimeError(f"the dag-processor's stats show fewer than 2 parses of {short}: see {log}")
    return {name: parsed[name][1:] for name in files}


def dp_file(variant: str, n: int) -> str:
    """The headline's DAG file name of ``variant`` with ``n`` tasks."""
    slug = {
        BUILTIN: "appdef_builtin",
        FILEREF: "appdef_fileref",
        FUNCTION: "appdef_function",
        PEER: "bash",
        PEER_TORCHX: "bash_torchx",
        KPO: "kpo",
    }
    return f"{slug[variant]}_{n}.py"


def dag_processor_headline(home: Path, sizes: tuple[int, ...]) -> dict[str, dict[int, list[float]]]:
    """Run the real dag-processor over every variant and size: {variant: {tasks: [seconds]}}."""
    files = {dp_file(v, n): fork_dag(v, n) for v in DP_VARIANTS for n in sizes}
    parsed = run_dag_processor(home, files, DP_LOOPS)
    return {v: {n: parsed[dp_file(v, n)] for n in sizes} for v in DP_VARIANTS}


def dp_report(samples: dict[str, dict[int, list[float]]]) -> list[str]:
    """The headline section of bench/results/airflow.md."""
    med = medians(samples)
    load = os.getloadavg()[0]
    loaded = (
        f", **measured on a loaded machine** (1-minute load average {load:.1f})" if load > (os.cpu_count() or 1) else ""
    )
    lines = [
        DP_TITLE,
        "",
        f"`python bench/airflow_parse.py` — `airflow dag-processor --num-runs {DP_LOOPS + 2}` (Airflow 3.3, SQLite "
        f"home, `parsing_processes=1`, `min_file_process_interval={DP_INTERVAL}`, `print_stats_interval=1`) over one "
        f"dags folder holding every variant and size; each file's **Last Duration** from the "
        f"\"{STATS_TITLE}\" tables it logs (the manager's own clock from just after the child's fork to the collection of "
        "its result: import, DAG construction, serialization; 10 ms resolution), one sample per parse "
        f"(a parse is a (file, Last Run At) pair), the first parse of each file dropped; median of {DP_LOOPS} "
        f"loops, {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"measured {time.strftime('%Y-%m-%d')}{loaded}. Every task has its own arguments; plan store warm after "
        "the first parse.",
        "",
        "| AppDefOperator reference style | tasks | ours (median) | peer | peer (median) | ratio | goal |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in (BUILTIN, FILEREF, FUNCTION):
        for peer, goal in ((PEER, DP_GOAL_BASH), (KPO, DP_GOAL_KPO)):
            for n, ours in med[v].items():
                ratio = ours / med[peer][n]
                lines.append(
                    f"| {v.split('(')[1].rstrip(')')} | {n} | {ours * 1000:.0f} ms | {peer} | "
                    f"{med[peer][n] * 1000:.0f} ms | {ratio:.2f}x | <= {goal:g}x: {_verdict(ratio, goal)} |"
                )
    for n, ours in med[FUNCTION].items():  # what torchstep adds to a file that imports TorchX itself
        ratio = ours / med[PEER_TORCHX][n]
        lines.append(
            f"| component function | {n} | {ours * 1000:.0f} ms | {PEER_TORCHX} | {med[PEER_TORCHX][n] * 1000:.0f} ms | "
            f"{ratio:.2f}x | <= {DP_GOAL_BASH:g}x: {_verdict(ratio, DP_GOAL_BASH)} |"
        )
    lines += [
        "",
        "The component-function file imports TorchX itself (`from torchx.components.dist import ddp`, the "
        "user's own import, which every re-parse pays); the last two rows compare it with a BashOperator file "
        "that imports TorchX too: what torchstep adds.",
        "",
        "Samples (seconds, in parse order): "
        + "; ".join(
            f"{v} {n}: {', '.join(f'{t:.2f}' for t in ts)}" for v, per in samples.items() for n, ts in per.items()
        ),
        "",
    ]
    return lines


def record_headline(samples: dict[str, dict[int, list[float]]], command: str) -> None:
    """Record the headline's figures: every reference style against both peers at 50 and 500 tasks."""
    ids = {  # the figure ids of earlier runs keep their meaning (style, size, peer)
        (BUILTIN, 50, PEER): "5a",
        (FILEREF, 50, PEER): "5d",
        (BUILTIN, 500, PEER): "5e",
        (FILEREF, 500, PEER): "5f",
        (BUILTIN, 50, KPO): "5g",
        (FILEREF, 50, KPO): "5h",
        (FUNCTION, 50, PEER): "5i",
        (BUILTIN, 500, KPO): "5k",
        (FILEREF, 500, KPO): "5l",
        (FUNCTION, 500, PEER): "5m",
        (FUNCTION, 50, KPO): "5n",
        (FUNCTION, 500, KPO): "5o",
        (FUNCTION, 50, PEER_TORCHX): "5p",
        (FUNCTION, 500, PEER_TORCHX): "5q",
    }
    note = (
        f'Last Duration in the real dag-processor\'s "{STATS_TITLE}" (parsing_processes=1, '
        f"min_file_process_interval={DP_INTERVAL}, first parse dropped), {DP_LOOPS} loops"
    )
    for (v, n, peer), fig in ids.items():
        if n in samples[v]:
            record(
                fig,
                f"Airflow dag-processor re-parse (its own stats): {n} x {v}",
                samples[v][n],
                samples[peer][n],
                peer_name=f"{n} x {peer}",
                goal=DP_GOAL_KPO if peer == KPO else DP_GOAL_BASH,
                command=command,
                note=note,
            )


def splice_headline(text: str, dp_lines: list[str]) -> str:
    """``text`` (bench/results/airflow.md) with its headline section replaced by
    ``dp_lines`` (inserted below the title when absent); the other sections are kept."""
    text = text.replace(OLD_FORK_TITLE, FORK_TITLE)
    section = "\n".join(dp_lines).rstrip("\n") + "\n\n"
    if DP_TITLE in text:
        start = text.index(DP_TITLE)
        end = text.find("\n## ", start + len(DP_TITLE))
        return text[:start] + section + (text[end + 1 :] if end >= 0 else "")
    at = text.index(TITLE) + len(TITLE) if TITLE in text else 0
    return text[:at] + section + text[at:]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--fork-parent"]:
        return fork_parent(argv[1])
    fork_only, dp_only = "--fork-only" in argv, "--dag-processor-only" in argv
    with tempfile.TemporaryDirectory(prefix="torchstep-bench-airflow-") as tmp:
        home = Path(tmp)
        subprocess.run(
            [str(BIN / "airflow"), "db", "migrate"], env=env_for(home, home), check=True, capture_output=True
        )
        dp_lines: list[str] = []
        if not fork_only:  # the headline: the real dag-processor's own stats
            dp_sizes = (50, 500)
            print(f"airflow dag-processor: sizes {dp_sizes}, {DP_LOOPS} loops", flush=True)
            dp_samples = dag_processor_headline(home, dp_sizes)
            dp_lines = dp_report(dp_samples)
            print("\n".join(dp_lines), flush=True)
            record_headline(dp_samples, "python bench/airflow_parse.py" + (" --dag-processor-only" if dp_only else ""))
            if dp_only:
                old = RESULTS.read_text() if RESULTS.exists() else TITLE
                RESULTS.write_text(splice_headline(old, dp_lines))
                return 0
        fork_env = env_for(home, home)
        sizes = tuple(sorted(set(FORK_SIZES) | ({50, 500} if not fork_only else set())))
        warm_sizes = sizes if full() else (50,)
        print(f"forked child: sizes {sizes} (torchstep pre-imported: {warm_sizes}), {REPEATS} repeats", flush=True)
        real_samples = forked_child(home, fork_env, AIRFLOW_IMPORTS, REAL_VARIANTS, sizes, CHANGED_VARIANTS)
        real_cpu = medians(CPU_SAMPLES)
        warm_samples = forked_child(home, fork_env, WARM_IMPORTS, FORK_VARIANTS, warm_sizes)
        real, warm = medians(real_samples), medians(warm_samples)
        loaded = f", plan store {'OFF' if fork_env.get(PLAN_STORE_ENV) == '0' else 'on'}"
        fork_lines = fork_report(real, warm, loaded, real_cpu)
        print("\n".join(fork_lines), flush=True)
        for v in REFERENCES:
            print(
                f"ratio {v}/{PEER} (re-parse, airflow.* pre-imported): "
                + ", ".join(f"{n} tasks {real[v][n] / real[PEER][n]:.2f}x" for n in real[v])
                + f"; /{KPO}: "
                + ", ".join(f"{n} {real[v][n] / real[KPO][n]:.2f}x" for n in real[v])
            )
        print(
            f"ratio {FUNCTION}/{PEER_TORCHX}: "
            + ", ".join(f"{n} tasks {real[FUNCTION][n] / real[PEER_TORCHX][n]:.2f}x" for n in real[FUNCTION])
        )
        if fork_only:
            return 0
        cmd = "python bench/airflow_parse.py"
        setting = "re-parse of an unchanged file, fork model (airflow.* pre-imported, forked child)"
        first = "; ".join(
            f"first parse of a changed file, {v} {n} tasks: {t * 1000:.0f} ms "
            f"({t / real[PEER_TORCHX if v == FUNCTION else PEER][n]:.1f}x)"
            for v in CHANGED_VARIANTS
            for n, t in real[f"changed: {v}"].items()
        )
        record(
            "5j",
            f"Airflow re-parse, forked child with torchstep pre-imported (second row): 50 x {FUNCTION}",
            warm_samples[FUNCTION][50],
            warm_samples[PEER][50],
            peer_name=f"50 x {PEER}",
            goal=FORK_GOAL,
            command=cmd,
            note=", ".join(f"{v}: {warm[v][50] / warm[PEER][50]:.2f}x" for v in REFERENCES)
            + f"; {setting}: "
            + ", ".join(f"{v} {n} tasks {real[v][n] / real[PEER][n]:.2f}x" for v in REFERENCES for n in (50, 500))
            + "; "
            + first,
        )
        curve(
            "airflow_parse",
            "Airflow re-parse of an unchanged DAG file (fork model: airflow.* pre-imported, forked child)",
            "tasks in the DAG file",
            {v: [(n, t) for n, t in sorted(real[v].items())] for v in REAL_VARIANTS},
        )
        files: dict[str, Path] = {}
        for name, code in VARIANTS.items():
            d = home / f"dags-{len(files)}"
            d.mkdir()
            files[name] = d / f"dag_{len(files)}.py"
            files[name].write_text(code)
        whole: dict[str, list[float]] = {n: [] for n in VARIANTS}
        parse: dict[str, list[float]] = {n: [] for n in VARIANTS}
        for name in VARIANTS:  # warm the file system cache and byte code of the imports
            whole_process(files[name], env_for(home, files[name].parent))
        for i in range(REPEATS):
            for name in VARIANTS:
                env = env_for(home, files[name].parent)
                whole[name].append(whole_process(files[name], env))
                if full():  # `airflow dags report` is a second Airflow process per round: the long run only
                    parse[name].append(report_duration(env))
            print(f"round {i + 1}/{REPEATS} done", flush=True)
    med_w = {n: statistics.median(v) for n, v in whole.items()}
    med_p = {n: statistics.median(v) if v else float("nan") for n, v in parse.items()}
    lines = [
        TITLE.rstrip("\n"),
        "",
        *dp_lines,
        *fork_lines,
        "## Whole process and `airflow dags report`",
        "",
        f"`python bench/airflow_parse.py` — {TASKS} tasks per DAG file, median of {REPEATS} interleaved runs, "
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"measured {time.strftime('%Y-%m-%d')}."
        + ("" if full() else " `airflow dags report` runs in the long mode only (BENCH_FULL=1): nan here."),
        "",
        "| DAG file | whole process `python dag.py` | `airflow dags report` parse | vs BashOperator (process / report) |",
        "|---|---|---|---|",
    ]
    for n in VARIANTS:
        lines.append(
            f"| {TASKS} x {n} | {med_w[n]:.2f} s | {med_p[n] * 1000:.0f} ms | "
            f"{med_w[n] / med_w['BashOperator']:.2f} / {med_p[n] / med_p['BashOperator']:.1f} |"
        )
    ratio = med_w["AppDefOperator"] / med_w["BashOperator"]
    record(
        "5b",
        "Airflow whole-process parse (`python dag.py`) of 50 x AppDefOperator",
        whole["AppDefOperator"],
        whole["BashOperator"],
        peer_name="50 x BashOperator",
        goal=1.1,
        command="python bench/airflow_parse.py",
    )
    record(
        "5c",
        "Airflow whole-process parse of 50 x AppDefOperator vs KubernetesPodOperator",
        whole["AppDefOperator"],
        whole["KubernetesPodOperator"],
        peer_name="50 x KubernetesPodOperator",
        goal=1.0,
        command="python bench/airflow_parse.py",
    )
    lines += [
        "",
        f"Goal: AppDefOperator / BashOperator whole-process ratio <= {GOAL}: "
        f"**{ratio:.2f} ({'met' if ratio <= GOAL else 'NOT met'})**.",
        "",
        "What the AppDefOperator file pays for: importing TorchX and building and planning each AppDef while the "
        "DAG is parsed (~0.6-1 ms per task) — so a bad AppDef is a DAG import error and Airflow knows the retry "
        'budget before the first run. Naming a TorchX builtin (`app="dist.ddp"`) imports and lints that one '
        "builtin (TorchX's own finder lints every builtin, ~0.6 s per process). No torch, kfp, prefect or "
        "Kubernetes client is imported. "
        "KubernetesPodOperator pays for the provider and the Kubernetes client. The machine "
        f"({os.cpu_count()} CPUs) is shared: whole-process times move by ±10 % between runs; the ratios are of "
        "medians of interleaved runs.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    for n in VARIANTS:
        print(
            f"ratio {n}/BashOperator: whole process {med_w[n] / med_w['BashOperator']:.2f}, "
            f"dags report {med_p[n] / med_p['BashOperator']:.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
