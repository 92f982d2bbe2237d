"""The orchestrators' Kubernetes paths on the real pods of the one-machine cluster (issue 35
item 2): KFP's launcher step under kfp.local, Prefect's ``app_task(target="kubernetes")`` and
Airflow's ``AppDefOperator(target="kubernetes")`` in ``dag.test()`` each run a 2x2 gloo gang
(2 pods x 2 ranks that all-reduce) to success through the default client of ``$KUBECONFIG``
(Airflow: its default kubernetes connection), as a worker or a launcher does; Prefect's task
timeout deletes the Jobs and leaves no pod process; and a watcher SIGKILLed while the pods train — a KFP
launcher (run again with the same task id: KFP's retry) or a Prefect flow-run process (its
flow run executed again) — reattaches to the same Job and resumes its log at the saved cursor.

The watchers run on this machine, not in pods: the pods' network namespaces cannot reach the
test's API server (it listens on the machine's loopback), and a watcher needs nothing of a pod
but its environment (``TORCHSTEP_NAMESPACE``, the kubeconfig an in-cluster config gives).
One cluster serves the module (``module_cluster``): every run names its objects apart and
deletes them; each test checks that nothing of its run is left, processes included.
"""

# No `from __future__ import annotations`: Prefect and KFP read the flows' annotations.
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.harness import REPO, Cluster

GANG = f"{Path(__file__).resolve().parent / 'apps' / 'gang.py'}:allreduce_steps"
MANAGED = "app.kubernetes.io/managed-by=torchstep"
RANK_LINE = re.compile(r"\[trainer/(\d)\] rank (\d) step (\d+) world (\d+) sum (\d+)")

pytestmark = pytest.mark.slow


def rank_lines(text: str) -> list[tuple[int, int]]:
    """Every ``(rank, step)`` line of a step log, in order (the prefix's rank checked)."""
    out = []
    for m in RANK_LINE.finditer(text):
        assert m.group(1) == m.group(2) and m.group(4) == "4" and m.group(5) == "10", m.group(0)
        out.append((int(m.group(2)), int(m.group(3))))
    return out


def nothing_left(cluster: Cluster, timeout: float = 90.0) -> None:
    """No Job, pod or Service of torchstep's in the namespace and no pod process on the
    machine (the kubelet's cgroups), within ``timeout``."""
    cluster.wait(
        lambda: not any(cluster.items(kind, MANAGED) for kind in ("jobs", "pods", "services")),
        timeout,
        "every object of the run to be deleted",
    )
    cluster.wait(lambda: not cluster.pod_processes(), timeout, "every pod process to end")


class Seen:
    """What a thread saw of the run's objects while the test ran: every Job's and pod's uid,
    whether the Job completed, and whether a pod process ran."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.jobs: dict[str, str] = {}  # uid -> name
        self.pods: dict[str, str] = {}
        self.complete: set[str] = set()
        self.processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="seen")

        # Jobs through the watch API: a Job completed and deleted at once between two polls
        # (a loaded machine) is still seen complete, in its DELETED event's final state
        self._jobs_thread = threading.Thread(target=self._watch_jobs, daemon=True, name="seen-jobs")

    def __enter__(self) -> "Seen":
        self._jobs_thread.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(30)
        self._jobs_thread.join(30)

    def _note_job(self, job: dict[str, Any]) -> None:
        self.jobs[job["metadata"]["uid"]] = job["metadata"]["name"]
        conditions = job.get("status", {}).get("conditions") or []
        if any(c["type"] == "Complete" and c["status"] == "True" for c in conditions):
            self.complete.add(job["metadata"]["uid"])

    def _watch_jobs(self) -> None:
        import urllib.parse
        import urllib.request

        path, selector = self.cluster.path("jobs"), urllib.parse.quote(MANAGED)
        version = None
        while not self._stop.is_set():
            try:
                if version is None:  # list, then watch from the list's version
                    listed = self.cluster.api("GET", f"{path}?labelSelector={selector}")
                    for job in listed["items"]:
                        self._note_job(job)
                    version = listed["metadata"]["resourceVersion"]
                query = f"watch=true&labelSelector={selector}&resourceVersion={version}&timeoutSeconds=2"
                with urllib.request.urlopen(f"{self.cluster.server.url}{path}?{query}", timeout=30) as r:
                    for line in r:
                        event = json.loads(line)
                        if event["type"] == "ERROR":  # 410 Gone: list again
                            version = None
                            break
                        version = event["object"]["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            self._note_job(event["object"])
            except Exception:  # a dropped watch: resume from the last version
                self._stop.wait(0.2)

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            try:
                for job in self.cluster.items("jobs", MANAGED):
                    self._note_job(job)
                for pod in self.cluster.items("pods", MANAGED):
                    self.pods[pod["metadata"]["uid"]] = pod["metadata"]["name"]
                self.processes = max(self.processes, len(self.cluster.pod_processes()))
            except Exception:  # a read that raced a deletion: the next one sees it
                continue


@pytest.fixture
def kube_env(module_cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Cluster:
    """The environment a worker or a launcher pod gives the step: the cluster's kubeconfig
    (the default client reads it), its namespace; a private state directory."""
    monkeypatch.setenv("KUBECONFIG", str(module_cluster.kubeconfig))
    monkeypatch.setenv("TORCHSTEP_NAMESPACE", module_cluster.namespace)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.chdir(REPO)  # TorchX finds the component's script from the repository root
    return module_cluster


# -- KFP: the launcher step of a multi-pod AppDef -----------------------------------------------------
def test_kfp_launcher_step_runs_a_2x2_gang_on_real_pods_under_kfp_local(
    kube_env: Cluster, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("kfp")
    from kfp import local
    from torchstep_kfp import component_from_fn

    op = component_from_fn(GANG, outputs={"sum": int, "world": int}, cfg={"namespace": kube_env.namespace})
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    try:
        with Seen(kube_env) as seen:
            task = op(steps=3)  # a lone component runs at once under kfp.local
    finally:
        local.config.LocalExecutionConfig.instance = None
    out = capfd.readouterr()
    text = out.out + out.err
    result = task.outputs["result"]
    assert result["state"] == "SUCCEEDED", text[-4000:]
    assert task.outputs["sum"] == 10 and task.outputs["world"] == 4  # rank 0's outputs, KFP's parameters
    assert result["outputs"] == {"sum": 10, "world": 4}
    assert [r["replica_id"] for r in result["replicas"]] == [0, 1]
    lines = rank_lines(text)
    assert sorted(lines) == [(r, s) for r in range(4) for s in range(3)], text[-4000:]  # each rank's lines, once
    assert len(seen.jobs) == 1 and seen.complete == set(seen.jobs)  # one Job, completed by its pods
    assert len(seen.pods) == 2 and seen.processes >= 2  # two real pods, no replacement
    nothing_left(kube_env)  # the launcher deleted the Job, its pods and Service


# -- Prefect: app_task(target="kubernetes") ------------------------------------------------------------
@pytest.fixture(scope="module")
def prefect_harness() -> Iterator[None]:
    """A temporary Prefect API server for the module (as tests/prefect's session harness), or
    that harness's own when it already runs in this process (a server start costs ~10 s, a
    minute on a loaded machine)."""
    pytest.importorskip("prefect")
    # before Prefect reads its settings: a private home, no analytics, a startup timeout for 2 cores
    os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="prefect-home-"))
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "120"
    from prefect.settings import PREFECT_API_URL

    if str(PREFECT_API_URL.value() or "").startswith("http://127.0.0.1:"):  # tests/prefect's harness, running
        yield
        return
    os.environ.pop("PREFECT_API_URL", None)
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@contextlib.contextmanager
def task_log() -> Iterator[list[str]]:
    """Every message of the task runs' loggers (what the task run's log shows in Prefect's UI)."""
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler, logger = Keep(logging.INFO), logging.getLogger("prefect.task_runs")
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


def test_prefect_task_runs_a_2x2_gang_on_real_pods(kube_env: Cluster, prefect_harness: None) -> None:
    from prefect import flow
    from torchstep_prefect import app_task

    train = app_task(GANG, target="kubernetes", cfg={"namespace": kube_env.namespace})

    @flow
    def pipeline():
        return train(steps=3)

    with task_log() as log, Seen(kube_env) as seen:
        result = pipeline()
    text = "\n".join(log)
    assert result["state"] == "SUCCEEDED" and result["outputs"] == {"sum": 10, "world": 4}, text[-4000:]
    assert [r["replica_id"] for r in result["replicas"]] == [0, 1]
    lines = rank_lines(text)
    assert sorted(lines) == [(r, s) for r in range(4) for s in range(3)], text[-4000:]  # in the task's log, once
    assert len(seen.jobs) == 1 and seen.complete == set(seen.jobs) and len(seen.pods) == 2
    nothing_left(kube_env)


def test_prefect_tasks_timeout_deletes_the_job_and_leaves_no_pod_process(
    kube_env: Cluster, prefect_harness: None
) -> None:
    from prefect import flow
    from torchstep_prefect import app_task

    train = app_task(GANG, target="kubernetes", cfg={"namespace": kube_env.namespace}, timeout_seconds=30)

    states: list[Any] = []

    @flow
    def pipeline():
        states.append(train(steps=100000, interval=0.5, return_state=True))  # trains until stopped

    with task_log() as log, Seen(kube_env) as seen:
        pipeline()
        t0 = time.monotonic()
        nothing_left(kube_env)
        gone_s = time.monotonic() - t0
    text = "\n".join(log)
    (state,) = states
    assert state.is_failed() and state.name == "TimedOut", (state, text[-4000:])
    assert len(seen.jobs) == 1 and not seen.complete  # the Job ran and was deleted, never completed
    assert len(seen.pods) == 2 and seen.processes >= 2, text[-4000:]  # both pods' processes ran
    print(f"Prefect task timeout: every pod process gone {gone_s:.1f} s after the task ended")


# -- the watcher SIGKILLed mid-run and run again: KFP's retry of a launcher pod --------------------------
def launcher_argv(tmp_path: Path, task_id: str, **inputs: Any) -> list[str]:
    """What KFP runs in a launcher pod for ``GANG`` with ``inputs``: the component's own
    ``--spec``, an executor input naming the output files, KFP's job and task ids."""
    from torchstep_kfp import component_from_fn

    op = component_from_fn(GANG, outputs={"sum": int, "world": int}, cfg={"namespace": "ml"})
    args = op.component.component_spec.implementation.container.args
    executor_input = {
        "inputs": {"parameterValues": {"torchstep_job_id": "job-1", "torchstep_task_id": task_id}},
        "outputs": {
            "parameters": {name: {"outputFile": str(tmp_path / "out" / name)} for name in ("result", "sum", "world")},
            "outputFile": str(tmp_path / "out" / "executor_output.json"),
        },
    }
    out = ["--spec", args[args.index("--spec") + 1], "--executor_input", json.dumps(executor_input)]
    for name, value in inputs.items():
        out += ["--in", name, json.dumps(value)]
    return out


def start_launcher(args: list[str], pod: str, log: Path) -> "subprocess.Popen[bytes]":
    """The launcher process of KFP's launcher pod ``pod`` (a retry is a new pod: a new name)."""
    env = {**os.environ, "TORCHSTEP_POD_NAME": pod, "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "torchstep_kfp.entry", *args], env=env, stdout=f, stderr=subprocess.STDOUT
        )


def saved_lines(cluster: Cluster) -> set[tuple[int, int]]:
    """The ``(rank, step)`` lines at or before the log position a watcher saved on the run's
    Job (the ``torchstep/log-cursor`` annotation), read from the pods' own logs."""
    from torchstep.kubernetes.jobs import CURSOR_ANNOTATION
    from torchstep.kubernetes.logcursor import Cursor, cursor_value

    jobs = cluster.items("jobs", MANAGED)
    if len(jobs) != 1:
        return set()
    saved = cursor_value((jobs[0]["metadata"].get("annotations") or {}).get(CURSOR_ANNOTATION, ""))
    covered: set[tuple[int, int]] = set()
    for pod, position in saved.items():
        cursor = Cursor.resumed(position)
        for line in cluster.log(pod, "?timestamps=true").splitlines():
            if cursor.accept(line) is None:  # at or before the saved position
                covered.update(rank_lines(line))
    return covered


def test_a_sigkilled_launcher_run_again_reattaches_to_the_same_job_and_prints_each_line_once(
    kube_env: Cluster, tmp_path: Path
) -> None:
    pytest.importorskip("kfp")
    steps = 60
    args = launcher_argv(tmp_path, "task-kill-1", steps=steps, interval=0.5)
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    with Seen(kube_env) as seen:
        first = start_launcher(args, "pipeline-x-launcher-1", first_log)
        try:
            # kill it once it saved a log position past some of both pods' training lines
            kube_env.wait(
                lambda: first.poll() is None and len({r // 2 for r, _ in saved_lines(kube_env)}) == 2,
                180,
                "the first launcher to save a log position past both pods' training lines",
            )
        finally:
            first.send_signal(signal.SIGKILL)  # the launcher pod is gone (node lost, OOM): nothing cleans up
            first.wait()
        before = saved_lines(kube_env)  # the first watcher's last saved position
        (job_uid,) = seen.jobs
        assert kube_env.pod_processes()  # the pods train on without their watcher
        second = start_launcher(args, "pipeline-x-launcher-2", second_log)  # KFP's retry: a new pod, the same task
        assert second.wait(300) == 0, second_log.read_text()[-4000:]
    first_text, second_text = first_log.read_text(), second_log.read_text()
    assert "attaching" in second_text, second_text[-4000:]
    assert set(seen.jobs) == {job_uid} and seen.complete == {job_uid}  # the one Job, run to its end
    assert len(seen.pods) == 2  # never a second set of pods
    once, again = rank_lines(first_text), rank_lines(second_text)
    assert len(again) == len(set(again)) and len(once) == len(set(once))
    assert before <= set(once) and not before & set(again), sorted(before & set(again))  # resumed at the cursor
    assert set(once) | set(again) == {(r, s) for r in range(4) for s in range(steps)}  # nothing lost
    result = json.loads((tmp_path / "out" / "result").read_text())
    assert result["state"] == "SUCCEEDED" and result["outputs"] == {"sum": 10, "world": 4}  # the pods' real outcome
    assert (tmp_path / "out" / "sum").read_text() == "10"
    print(f"reattached: the second launcher skipped {len(before)} lines, printed {len(again)}")
    nothing_left(kube_env)


def start_flow_process(cluster: Cluster, log: Path, run_id_file: Path, *args: str) -> "subprocess.Popen[bytes]":
    """A flow-run process of tests/cluster/apps/prefect_flow.py against the module's Prefect
    API server (``args``: steps, interval and, to execute it again, the flow run's id)."""
    from prefect.settings import PREFECT_API_URL

    env = {
        **os.environ,
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        "FLOW_RUN_ID_FILE": str(run_id_file),
        "PYTHONUNBUFFERED": "1",
    }
    with open(log, "wb") as f:
        return subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve().parent / "apps" / "prefect_flow.py"), *args],
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )


def test_a_sigkilled_prefect_flow_run_executed_again_reattaches_to_the_same_job(
    kube_env: Cluster, prefect_harness: None, tmp_path: Path
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    steps = 60
    run_id_file = tmp_path / "flow_run_id"
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    with Seen(kube_env) as seen:
        first = start_flow_process(kube_env, first_log, run_id_file, str(steps), "0.5")
        try:
            kube_env.wait(
                lambda: first.poll() is None and len({r // 2 for r, _ in saved_lines(kube_env)}) == 2,
                240,
                "the first flow-run process to save a log position past both pods' training lines",
            )
        finally:
            first.send_signal(signal.SIGKILL)  # the flow-run pod is gone: nothing cleans up
            first.wait()
        before = saved_lines(kube_env)
        (job_uid,) = seen.jobs
        flow_run_id = run_id_file.read_text()
        with get_client(sync_client=True) as client:  # as Prefect marks a run whose process vanished
            client.set_flow_run_state(flow_run_id, Crashed(message="the flow-run process was killed"), force=True)
        second = start_flow_process(kube_env, second_log, run_id_file, str(steps), "0.5", flow_run_id)
        assert second.wait(300) == 0, second_log.read_text()[-4000:]
    first_text, second_text = first_log.read_text(), second_log.read_text()
    assert "attaching" in second_text, second_text[-4000:]
    assert set(seen.jobs) == {job_uid} and seen.complete == {job_uid} and len(seen.pods) == 2
    once, again = rank_lines(first_text), rank_lines(second_text)
    assert len(again) == len(set(again)) and len(once) == len(set(once))
    assert before <= set(once) and not before & set(again), sorted(before & set(again))
    assert set(once) | set(again) == {(r, s) for r in range(4) for s in range(steps)}
    result = json.loads(second_text.split("RESULT ", 1)[1].splitlines()[0])
    assert result["state"] == "SUCCEEDED" and result["outputs"] == {"sum": 10, "world": 4}
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(flow_run_id).state.is_completed()
    print(f"Prefect flow run re-executed: skipped {len(before)} lines, printed {len(again)}")
    nothing_left(kube_env)


# -- Airflow: AppDefOperator(target="kubernetes") in dag.test() -------------------------------------------
AIRFLOW_DAG = """
from airflow.sdk import DAG
from torchstep_airflow import AppDefOperator

with DAG("torchstep_gang_on_pods", schedule=None) as dag:
    AppDefOperator(
        task_id="train", app={gang!r}, app_args={{"steps": 3}}, target="kubernetes", cfg={{"namespace": "ml"}}
    )
"""


def airflow_home(
    tmp_path: Path, kubeconfig: str, dag: tuple[str, str] | None = None, *, connection_only: bool = False
) -> dict[str, str]:
    """A migrated Airflow home with the DAG file ``dag`` (name, text; default: a 2x2 gang on
    the kubernetes target), and the environment of its processes: the cluster (``kubeconfig``)
    as Airflow's default kubernetes connection; ``connection_only``: without ``$KUBECONFIG``
    too. The database is the session's migrated template when tests/airflow's fixtures built
    one (``airflow db migrate`` costs a minute of CPU on a loaded machine), else migrated here."""
    name, text = dag or ("gang_dag.py", AIRFLOW_DAG.format(gang=GANG))
    home = tmp_path / "airflow"
    (home / "dags").mkdir(parents=True)
    (home / "dags" / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__UNIT_TEST_MODE="False",
        AIRFLOW__LOGGING__BASE_LOG_FOLDER=str(home / "logs"),
        XDG_STATE_HOME=str(tmp_path / "state"),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
    )
    env.pop("KUBERNETES_SERVICE_HOST", None)
    if connection_only:
        env.pop("KUBECONFIG", None)
    connection = {"conn_type": "kubernetes", "extra": {"kube_config_path": kubeconfig, "namespace": "ml"}}
    env["AIRFLOW_CONN_KUBERNETES_DEFAULT"] = json.dumps(connection)
    shared = os.environ.get("TORCHSTEP_TESTS_SHARED_TMP")
    template = Path(shared) / "airflow-sqlite" if shared else None
    if template is not None and (template / ".complete").exists():
        shutil.copy2(template / "airflow.db", home / "airflow.db")
    else:
        airflow = str(Path(sys.executable).parent / "airflow")
        done = subprocess.run([airflow, "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
    return env


def test_airflow_appdefoperator_runs_a_2x2_gang_on_real_pods_in_dag_test(kube_env: Cluster, tmp_path: Path) -> None:
    pytest.importorskip("airflow.providers.cncf.kubernetes")
    env = airflow_home(tmp_path, str(kube_env.kubeconfig))
    driver = REPO / "tests" / "airflow" / "dag_test_driver.py"
    dag_file = Path(env["AIRFLOW__CORE__DAGS_FOLDER"]) / "gang_dag.py"
    with Seen(kube_env) as seen:
        done = subprocess.run(
            [sys.executable, str(driver), str(dag_file), "torchstep_gang_on_pods", "{}"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=400,
        )
    text = done.stdout
    marks = [x for x in text.splitlines() if x.startswith("DAG_TEST_SUMMARY ")]
    assert done.returncode == 0 and marks, text[-4000:]
    summary = json.loads(marks[-1].split(" ", 1)[1])
    task = summary["tasks"]["train"]
    assert summary["state"] == "success" and task["state"] == "success", text[-4000:]
    result = task["xcom"]
    assert result["state"] == "SUCCEEDED" and result["outputs"] == {"sum": 10, "world": 4}
    assert sorted(rank_lines(text)) == [(r, s) for r in range(4) for s in range(3)], text[-4000:]
    assert len(seen.jobs) == 1 and seen.complete == set(seen.jobs) and len(seen.pods) == 2
    nothing_left(kube_env)
