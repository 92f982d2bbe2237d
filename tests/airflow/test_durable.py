"""Durable kubernetes steps on Airflow (``AppDefOperator(durable=True)``, issue 17): a retry
after the worker died reattaches to the Job of the earlier try instead of starting another.

Unit level: the operator's ``execute`` with a task context (a fake ``ti`` and task state
store) against the in-memory API of tests/kubefake.py — one ``FakeKube`` per Job, routed by
:class:`Cluster`. End to end: a real deployment (PostgreSQL, scheduler, LocalExecutor) whose
task process is SIGKILLed mid-step, against the cross-process HTTP fake of tests/kubehttp.py.
"""

from __future__ import annotations

import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torchstep
from kubefake import ApiError, FakeKube, Script, _plain, _ts
from proclib import airflow_task_process
from statestore import TaskStateStore as Store
from torchstep.kubernetes import LABEL_APP_ID
from torchstep.kubernetes.jobs import CURSOR_KEY
from torchx import specs

pytest.importorskip("airflow.providers.cncf.kubernetes")
from airflow.sdk.exceptions import AirflowException, AirflowFailException  # noqa: E402
from torchstep_airflow import durable  # noqa: E402
from torchstep_airflow.durable import REPORTED_KEY, RUN_ID_KEY  # noqa: E402
from torchstep_airflow.kubernetes import XCOM_RESULT_FILE, pod_operator, render  # noqa: E402
from torchstep_airflow.operators import AppDefOperator  # noqa: E402
from torchstep_airflow.settings import attempt_of, run_id_of  # noqa: E402

NS = "ml"


# -- fakes ---------------------------------------------------------------------------------------


class TI:
    """The parts of a RuntimeTaskInstance the operator and the mixin read."""

    dag_id = "train"
    run_id = "manual__2026-11-25T00:00:00+00:00"
    task_id = "fit"
    map_index = -1
    stats_tags: dict[str, str] = {}

    def __init__(self, try_number: int) -> None:
        self.try_number = try_number
        self.xcom: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value


def context(try_number: int, store: Store | None) -> dict[str, Any]:
    ctx: dict[str, Any] = {"ti": TI(try_number), "run_id": TI.run_id}
    if store is not None:
        ctx["task_state_store"] = store
    return ctx


class Cluster:
    """A namespace holding several runs' Jobs: one :class:`FakeKube` per run (app id), each
    made from the next entry of ``scripts`` when its Job is created; calls are routed by
    object name or label selector, as the API server's would reach them."""

    def __init__(self, *scripts: dict[int, Script], polls: int = 2) -> None:
        self.scripts = list(scripts)
        self.polls = polls
        self.fakes: dict[str, FakeKube] = {}
        self.creates: list[str] = []  # kind/name of every create call, conflicts included
        self.on_create: Any = None

    # routing
    def _by_app(self, app_id: str) -> FakeKube:
        if app_id not in self.fakes:
            self.fakes[app_id] = FakeKube(self.scripts[min(len(self.fakes), len(self.scripts) - 1)], polls=self.polls)
        return self.fakes[app_id]

    def _by_selector(self, selector: str) -> FakeKube | None:
        return self.fakes.get(selector.split("=", 1)[1]) if selector.startswith(f"{LABEL_APP_ID}=") else None

    def _by_name(self, name: str, *, pods: bool = False) -> FakeKube:
        for fake in self.fakes.values():
            if any(o["metadata"]["name"] == name for o in fake.objects):
                return fake
            if pods and any(p.metadata.name == name for p in fake._pod_list()):
                return fake
        raise ApiError(404, f"{name!r} not found")

    def _create(self, body: dict[str, Any]) -> Any:
        self.creates.append(f"{body['kind']}/{body['metadata']['name']}")
        if self.on_create is not None:
            self.on_create(body)
        return self._by_app(body["metadata"]["labels"][LABEL_APP_ID])._create(body)

    # the API JobGang calls
    def create_namespaced_job(self, namespace: str, body: dict[str, Any]) -> Any:
        return self._create(body)

    create_namespaced_pod = create_namespaced_service = create_namespaced_network_policy = create_namespaced_job

    def read_namespaced_job_status(self, name: str, namespace: str) -> Any:
        return self._by_name(name).read_namespaced_job_status(name, namespace)

    def read_namespaced_pod_status(self, name: str, namespace: str) -> Any:
        return self._by_name(name, pods=True).read_namespaced_pod_status(name, namespace)

    def read_namespaced_pod_log(self, name: str, namespace: str, **kwargs: Any) -> Any:
        return self._by_name(name, pods=True).read_namespaced_pod_log(name, namespace, **kwargs)

    def patch_namespaced_job(self, name: str, namespace: str, body: dict[str, Any]) -> Any:
        return self._by_name(name).patch_namespaced_job(name, namespace, body)

    def list_namespaced_pod(self, namespace: str, label_selector: str) -> Any:
        fake = self._by_selector(label_selector)
        return fake.list_namespaced_pod(namespace, label_selector) if fake else _plain_items()

    def list_namespaced_service(self, namespace: str, label_selector: str) -> Any:
        fake = self._by_selector(label_selector)
        return fake.list_namespaced_service(namespace, label_selector) if fake else _plain_items()

    def delete_collection_namespaced_job(self, namespace: str, label_selector: str, **kw: Any) -> None:
        if fake := self._by_selector(label_selector):
            fake.delete_collection_namespaced_job(namespace, label_selector, **kw)

    def delete_collection_namespaced_pod(self, namespace: str, label_selector: str, **kw: Any) -> None:
        if fake := self._by_selector(label_selector):
            fake.delete_collection_namespaced_pod(namespace, label_selector, **kw)

    def delete_namespaced_service(self, name: str, namespace: str) -> None:
        self._by_name(name).delete_namespaced_service(name, namespace)

    def delete_collection_namespaced_network_policy(self, namespace: str, label_selector: str) -> None:
        if fake := self._by_selector(label_selector):
            fake.delete_collection_namespaced_network_policy(namespace, label_selector)

    def sanitize(self, obj: Any) -> dict[str, Any]:
        return _plain(obj)

    # what the tests look at
    def jobs(self) -> list[str]:
        return [o["metadata"]["name"] for f in self.fakes.values() for o in f.objects if o["kind"] == "Job"]

    def conflicts(self) -> int:
        return sum(f.conflicts for f in self.fakes.values())

    def finish(self, app_id: str) -> None:
        """Let that run's pods run to their end (nobody watching)."""
        fake = self.fakes[app_id]
        while not fake._all_done():
            with fake._lock:
                fake.reads += 1


def cursor_at(line: int) -> str:
    """The saved-cursor key of the fake's ``line``-th log line (RFC 3339, nanoseconds padded)."""
    head, _, frac = _ts(line)[:-1].partition(".")
    return f"{head}.{frac.ljust(9, '0')}"


def _plain_items() -> Any:
    return types.SimpleNamespace(items=[])


class Hook:
    """``KubernetesHook`` standing for the cluster (the operator's Job path reads its clients)."""

    cluster: Any = None

    def __init__(self, conn_id: str | None = None, **kwargs: Any) -> None:
        self.core_v1_client = self.batch_v1_client = Hook.cluster
        # the fake answers namespaces, not the client's models: serialized as the client would
        self.api_client = types.SimpleNamespace(sanitize_for_serialization=_plain)

    default_conn_name = "kubernetes_default"


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    """A fresh cluster whose runs succeed by default; the operator's hook talks to it."""
    c = Cluster(scripts(), scripts())
    monkeypatch.setattr(Hook, "cluster", c)
    monkeypatch.setattr("torchstep_airflow.kubernetes.KubernetesHook", Hook)
    return c


def scripts(codes: tuple[int, int] = (0, 0), lines: int = 6) -> dict[int, Script]:
    return {i: Script(codes=[c], lines=[f"[trainer/{i}] step {k}" for k in range(lines)]) for i, c in enumerate(codes)}


def app(replicas: int = 2) -> specs.AppDef:
    role = specs.Role(
        "trainer", image="ghcr.io/acme/train:1.0", entrypoint="python", args=["-m", "train"], num_replicas=replicas
    )
    return specs.AppDef("train", roles=[role])


def operator(**kw: Any) -> AppDefOperator:
    kw.setdefault("kubernetes_kwargs", {"poll_interval": 0.01})
    return AppDefOperator(task_id="fit", app=app(), target="kubernetes", cfg={"namespace": NS}, **kw)


def app_id(run_id: str) -> str:
    return torchstep.kubernetes.render_app(app(), namespace=NS, cfg={"run_id": run_id}).app_id


def attempt_id_of(ctx: dict[str, Any]) -> str:
    """The run id of the task's logical attempt (not the try)."""
    return attempt_of(ctx).logical_id


def core_step(op: AppDefOperator, run_id: str, cursor_store: Any = None) -> Any:
    """Core's step of ``run_id`` as the task's Job path opens it (the hook's client)."""
    from torchstep.kubernetes import OfficialClient
    from torchstep.steps import KubernetesStep

    hook = Hook()
    client = OfficialClient(core=hook.core_v1_client, batch=hook.batch_v1_client, api_client=hook.api_client)
    return KubernetesStep(
        op.build_app()[1],
        run_id=run_id,
        cfg=op.cfg,
        client=client,
        cursor_store=cursor_store,
        result_file=XCOM_RESULT_FILE,
    )


def dead_watcher(op: AppDefOperator, try_number: int, store: Store | None) -> str:
    """What a try leaves behind when its worker is SIGKILLed mid-step: its run id in the task
    state store and its Job on the cluster, running. Returns that run id."""
    run_id = run_id_of(context(try_number, store))
    if store is not None:
        store.set(RUN_ID_KEY, run_id)
    core_step(op, run_id, cursor_store=store).job_gang().create()  # records its Job's uid, as a real try does
    return run_id


# -- the Job path, decided by the mixin and the task state store -----------------------------------
def test_first_try_stores_its_run_id_before_creating_anything(cluster: Cluster) -> None:
    store = Store()
    seen: list[Any] = []
    cluster.on_create = lambda body: seen.append(store.values.get(RUN_ID_KEY))
    out = operator().execute(context(1, store))
    run_id = run_id_of(context(1, store))
    assert out["state"] == "SUCCEEDED" and out["app_id"] == app_id(run_id)
    assert seen and set(seen) == {run_id}  # the id was in the store before the first object existed
    assert store.values[RUN_ID_KEY] == run_id and store.values[REPORTED_KEY] == run_id
    assert len(cluster.jobs()) == 1 and cluster.conflicts() == 0
    assert CURSOR_KEY in store.values  # the log position, for a watcher that reattaches


def test_retry_reattaches_to_the_running_job_and_continues_its_logs(cluster: Cluster, capsys) -> None:
    store = Store()
    op = operator()
    first = dead_watcher(op, 1, store)
    (job,) = cluster.jobs()
    pod0 = f"{job}-0-a"
    store.set(CURSOR_KEY, {"pods": {pod0: [cursor_at(3), 2]}})  # the dead watcher's last save: lines 0-3 seen
    capsys.readouterr()
    out = op.execute(context(2, store))
    assert out["state"] == "SUCCEEDED" and out["app_id"] == app_id(first)  # the first try's Job, not a new one
    assert cluster.jobs() == [job] and cluster.conflicts() == 3  # Job, Service, NetworkPolicy existed
    printed = capsys.readouterr().out
    assert "[trainer/0] step 3" not in printed and "[trainer/0] step 4" in printed  # continued after the cursor
    assert "[trainer/1] step 0" in printed  # pod 1 had no saved position: read from its start
    assert store.values[REPORTED_KEY] == first


def test_a_job_that_succeeded_while_nobody_watched_returns_its_result_without_a_rerun(cluster: Cluster) -> None:
    store = Store()
    op = operator()
    first = dead_watcher(op, 1, store)
    cluster.finish(app_id(first))
    ti_ctx = context(2, store)
    out = op.execute(ti_ctx)
    assert out["state"] == "SUCCEEDED" and out["app_id"] == app_id(first)
    assert [r["replica_id"] for r in out["replicas"]] == [0, 1]
    assert len(cluster.jobs()) == 1 and ti_ctx["ti"].xcom == {}  # returned as on a normal success
    assert ("jobs", f"{LABEL_APP_ID}={app_id(first)}", "Foreground") in cluster.fakes[app_id(first)].deleted


def test_a_job_that_failed_while_nobody_watched_is_cleaned_and_a_fresh_job_runs(cluster: Cluster) -> None:
    cluster.scripts = [scripts((0, 1)), scripts((0, 0))]  # the first Job fails, the next succeeds
    store = Store()
    op = operator()
    first = dead_watcher(op, 1, store)
    cluster.finish(app_id(first))
    out = op.execute(context(2, store))
    second = run_id_of(context(2, store))
    assert out["state"] == "SUCCEEDED" and out["app_id"] == app_id(second)
    assert len(cluster.jobs()) == 2  # the mixin's "terminal → resubmit": one fresh Job for this try
    assert ("jobs", f"{LABEL_APP_ID}={app_id(first)}", "Foreground") in cluster.fakes[app_id(first)].deleted
    assert store.values[RUN_ID_KEY] == second and store.values[REPORTED_KEY] == second


def test_an_unwatched_non_retryable_failure_is_reported_not_rerun(cluster: Cluster) -> None:
    cluster.scripts = [scripts((0, 82))]
    store = Store()
    op = operator()
    first = dead_watcher(op, 1, store)
    cluster.finish(app_id(first))
    ctx = context(2, store)
    with pytest.raises(AirflowFailException, match="not retryable"):
        op.execute(ctx)
    assert len(cluster.jobs()) == 1 and ctx["ti"].xcom["return_value"]["exit_code"] == 82


def test_a_job_whose_watcher_reported_it_is_not_reattached(cluster: Cluster) -> None:
    """A retry after a reported failure, or a cleared task: the next try runs afresh."""
    store = Store()
    op = operator()
    op.execute(context(1, store))
    out = op.execute(context(2, store))
    assert out["app_id"] == app_id(run_id_of(context(2, store)))
    assert len(cluster.jobs()) == 2 and cluster.conflicts() == 0


def test_a_stored_id_whose_job_never_got_created_is_created_under_that_id(cluster: Cluster) -> None:
    """The worker died after storing the id, before creating: no window is left."""
    store = Store({RUN_ID_KEY: run_id_of(context(1, None))})
    out = operator().execute(context(2, store))
    assert out["app_id"] == app_id(run_id_of(context(1, None)))
    assert len(cluster.jobs()) == 1


def test_an_object_of_someone_else_under_the_same_name_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    op = operator()
    run_id = run_id_of(context(1, None))
    name = render(op, op.build_app()[1], run_id).roles[0].name
    fake = FakeKube(scripts())
    fake.objects.append({"kind": "Job", "metadata": {"name": name, "labels": {"team": "other"}, "uid": "x"}})
    monkeypatch.setattr(Hook, "cluster", fake)
    monkeypatch.setattr("torchstep_airflow.kubernetes.KubernetesHook", Hook)
    with pytest.raises(AirflowFailException, match=f"Job {NS}/{name}.*not created by this run"):
        op.execute(context(1, Store()))
    assert [o["metadata"]["labels"] for o in fake.objects] == [{"team": "other"}]  # nothing created beside it


def test_a_job_with_the_runs_labels_that_this_task_did_not_create_is_refused_by_name(cluster: Cluster) -> None:
    """Someone allowed to create Jobs in the namespace made the task's Job in advance, its
    labels copied from ``torchstep render`` (run ids are predictable). The task state store
    holds no uid of it: refused by name, nothing deleted, nothing created beside it."""
    store = Store()
    op = operator()
    run_id = run_id_of(context(1, store))
    forged = render(op, op.build_app()[1], run_id).roles[0].workload
    cluster.create_namespaced_job(NS, body=forged)
    name = forged["metadata"]["name"]
    with pytest.raises(AirflowFailException, match=f"Job {NS}/{name}.*not created by this run.*no creation of it"):
        op.execute(context(1, store))
    fake = cluster.fakes[app_id(run_id)]
    assert fake.deleted == [] and fake.deleted_names == []  # left alone
    assert cluster.jobs() == [name] and [o["kind"] for o in fake.objects] == ["Job"]


def test_mark_failed_or_clear_while_reattached_deletes_the_job_and_its_pods(cluster: Cluster) -> None:
    cluster.polls = 10**6  # runs until stopped
    store = Store()
    op = operator()
    first = dead_watcher(op, 1, store)
    cluster.fakes[app_id(first)].polls = 10**6
    errors: list[BaseException] = []

    def run() -> None:
        try:
            op.execute(context(2, store))
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 60
    while cluster.conflicts() < 1 and time.monotonic() < deadline:  # attached
        time.sleep(0.01)
    assert cluster.conflicts() >= 1
    op.on_kill()  # what Airflow calls on mark failed / clear
    t.join(60)
    assert not t.is_alive() and errors and isinstance(errors[0], AirflowException)
    deleted = {kind for kind, _, _ in cluster.fakes[app_id(first)].deleted}
    assert {"jobs", "pods"} <= deleted and len(cluster.jobs()) == 1
    assert store.values[REPORTED_KEY] == first  # a cleared task's next try starts afresh


# -- without the mixin, or without a task state store ---------------------------------------------
def test_no_task_state_store_warns_and_runs_under_the_attempts_name(cluster: Cluster, capsys) -> None:
    op = operator()
    ctx = context(1, None)
    out = op.execute(ctx)
    assert out["state"] == "SUCCEEDED" and out["app_id"] == app_id(attempt_id_of(ctx))
    assert len(cluster.jobs()) == 1
    printed = capsys.readouterr()
    assert "no task_state_store in the context" in printed.out + printed.err  # Airflow's logger: the task log


def test_without_the_mixin_a_retry_still_attaches_by_the_deterministic_name(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, durable.MIXIN_MODULE, None)  # Airflow < 3.3: the import fails
    assert durable.resumable_class() is None
    op = operator()
    attempt = attempt_id_of(context(1, None))
    core_step(op, attempt).job_gang().create()  # try 1 created the Job of the attempt, then died
    out = op.execute(context(2, Store()))
    assert out["state"] == "SUCCEEDED" and out["app_id"] == app_id(attempt)
    assert len(cluster.jobs()) == 1 and cluster.conflicts() == 3


def test_durable_false_runs_each_try_under_its_own_name_and_stores_nothing(cluster: Cluster) -> None:
    store = Store()
    op = operator(durable=False)
    out = op.execute(context(1, store))
    assert out["app_id"] == app_id(run_id_of(context(1, None)))
    assert store.values == {}


# -- the single-pod path: KubernetesPodOperator's reattach_on_restart -------------------------------
def pod_step(durable_: bool, kwargs: dict[str, Any] | None = None) -> Any:
    """The pod operator a 1-replica app's try builds (``_inner``)."""
    op = AppDefOperator(task_id="fit", app=app(replicas=1), target="kubernetes", cfg={"namespace": NS})
    rendered = render(op, op.build_app()[1], "r1")
    return types.SimpleNamespace(_inner=pod_operator("fit", rendered, kwargs or {}, durable=durable_))


def test_single_pod_durability_is_the_pod_operators_reattach_on_restart() -> None:
    assert pod_step(True)._inner.reattach_on_restart is True
    assert pod_step(False)._inner.reattach_on_restart is False
    with pytest.raises(torchstep.SpecError) as err:
        pod_step(True, {"reattach_on_restart": False})
    assert err.value.field == "kubernetes_kwargs['reattach_on_restart']"


def test_durable_is_checked_and_costs_nothing_at_parse_time() -> None:
    import subprocess

    with pytest.raises(torchstep.SpecError):
        AppDefOperator(task_id="t", app=app(), target="kubernetes", durable="yes")
    code = (
        "import sys\n"
        "from airflow.sdk import DAG\n"
        "from torchstep_airflow import AppDefOperator\n"
        "with DAG('d', schedule=None):\n"
        "    AppDefOperator(task_id='t', app='dist.ddp', app_args=['-j', '2x2', '--script', 't.py'],\n"
        "                   target='kubernetes', durable=True)\n"
        "print(sorted(m for m in ('torchstep_airflow.durable', 'torchstep_airflow.kubernetes', 'kubernetes')\n"
        "             if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[]"


# -- a real scheduler: the task process SIGKILLed mid-step, the retry reattaches -------------------
DURABLE_DAG = '''"""Written by tests/airflow/test_durable.py: a 2-replica Job against a local HTTP fake of the API."""
from airflow.sdk import DAG
from torchstep_airflow import AppDefOperator
from torchx import specs

role = specs.Role(
    "trainer", image="ghcr.io/acme/train:1.0", entrypoint="python", args=["-m", "train"], num_replicas=2,
    max_retries=1, retry_policy=specs.RetryPolicy.APPLICATION, metadata={{"torchstep": {{"retry_delay": 1}}}},
)
with DAG("torchstep_durable", schedule=None, tags=["torchstep-test"]):
    AppDefOperator(
        task_id="fit", app=specs.AppDef("train", roles=[role]), target="kubernetes", retries=1,
        cfg={{"namespace": {namespace!r}}},
        kubernetes_kwargs={{"config_file": {kubeconfig!r}, "poll_interval": 0.5}},
    )
'''


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigkilled_task_process_is_retried_and_the_retry_reattaches_to_the_one_job(deployment, tmp_path) -> None:
    import os
    import signal
    import subprocess
    import urllib.parse

    kubehttp = pytest.importorskip("kubehttp")
    server = kubehttp.start_server(tmp_path, kubehttp.Scenario(replicas=2, run_s=40, codes=[0, 0]))
    try:
        dag_file = deployment.home / "dags" / "torchstep_durable_test.py"
        dag_file.write_text(DURABLE_DAG.format(namespace=NS, kubeconfig=str(server.kubeconfig)))
        # the dag-processor finds new files only every refresh_interval: register it now
        airflow = str(Path(sys.executable).parent / "airflow")
        subprocess.run(
            [airflow, "dags", "reserialize"], env=deployment.env, capture_output=True, timeout=300, check=True
        )
        run = deployment.start_run("torchstep_durable")
        path = f"/api/v2/dags/torchstep_durable/dagRuns/{urllib.parse.quote(run['dag_run_id'], safe='')}"
        ti = f"{path}/taskInstances/fit"

        def running_job() -> dict | None:  # try 1 runs, its Job exists and its pods log
            t = deployment.call("GET", ti)
            return t if t["state"] == "running" and server.state()["jobs_created"] >= 1 else None

        first = deployment.wait(running_job, 300, "try 1 to create its Job", interval=0.5)
        assert first["try_number"] == 1
        pid = deployment.wait(lambda: airflow_task_process(first["id"]), 60, "the task process of try 1")
        first_id = deployment.call("GET", f"{ti}/state-store/{RUN_ID_KEY}")["value"]

        def cursor_saved() -> bool:  # try 1 streamed some lines and saved where it is
            try:
                return bool(deployment.call("GET", f"{ti}/state-store/{CURSOR_KEY}", ok=()).get("value"))
            except AssertionError:
                return False

        deployment.wait(cursor_saved, 120, "try 1 to save its log position", interval=0.5)
        os.kill(pid, signal.SIGKILL)  # the watcher dies; the Job runs on

        def finished() -> dict | None:
            r = deployment.call("GET", path)
            return r if r["state"] in ("success", "failed") else None

        done = deployment.wait(finished, 300, "the DAG run to finish", interval=1)
        tries = deployment.call("GET", f"{ti}/tries")["task_instances"]
        logs = {n: log_of(deployment, ti, n) for n in (1, 2)}
        assert done["state"] == "success", logs
        assert [t["try_number"] for t in tries] == [1, 2]
        state = server.state()
        assert state["jobs_created"] == 1 and state["conflicts"] >= 1, state  # the retry attached
        xcom = deployment.call("GET", f"{ti}/xcomEntries/return_value?deserialize=true")["value"]
        assert xcom["state"] == "SUCCEEDED" and xcom["app_id"] == app_id(first_id)
        assert deployment.call("GET", f"{ti}/state-store/{RUN_ID_KEY}")["value"] == first_id
        assert "Reconnecting to existing job" in logs[2] and "attached to the running Job" in logs[2]
        seen = [line for line in logs[1].splitlines() if line.startswith("[trainer/0]")]
        assert seen and seen[0] not in logs[2].splitlines()  # try 2 continued the logs after try 1's saved position
    finally:
        server.stop()


def log_of(deployment: Any, ti: str, try_number: int) -> str:
    """The events of one try's task log, a line each."""
    log = deployment.call("GET", f"{ti}/logs/{try_number}?full_content=true")
    return "\n".join(str(e.get("event", "")) if isinstance(e, dict) else str(e) for e in log["content"])
