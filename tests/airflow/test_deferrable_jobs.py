"""``AppDefOperator(target="kubernetes", deferrable=True)`` on the Job path (several replicas
or roles): the worker creates the Jobs and defers, :class:`JobGangTrigger` waits in the
triggerer, ``execute_complete`` reattaches in a worker to print the logs, collect the
result and clean up (issue 35, item 2).

Against the cross-process HTTP fake of the Kubernetes API (tests/kubehttp.py): the operator
and the trigger each reach it through the ``KubernetesHook`` of a kubeconfig file, as in a
deployment. End to end: ``dag.test()``, which runs the trigger inline (Airflow 3), and a
real deployment whose triggerer runs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import torchstep
from statestore import TaskStateStore as Store
from torchx import specs

pytest.importorskip("airflow.providers.cncf.kubernetes")
kubehttp = pytest.importorskip("kubehttp")
from airflow.sdk.exceptions import (  # noqa: E402
    AirflowException,
    AirflowFailException,
    AirflowTaskTimeout,
    TaskDeferred,
)
from torchstep_airflow.durable import REPORTED_KEY, RUN_ID_KEY  # noqa: E402
from torchstep_airflow.operators import AppDefOperator  # noqa: E402
from torchstep_airflow.triggers import JobGangTrigger  # noqa: E402

NS = "ml"


class TI:
    """The parts of a RuntimeTaskInstance the operator and the mixin read."""

    dag_id, task_id, run_id, map_index = "train", "fit", "manual__2026-11-27T00:00:00+00:00", -1
    stats_tags: dict[str, str] = {}

    def __init__(self) -> None:
        self.try_number = 1
        self.start_date = None
        self.xcom: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value


def context(store: Store | None = None) -> dict[str, Any]:
    ctx: dict[str, Any] = {"ti": TI(), "run_id": TI.run_id}
    if store is not None:
        ctx["task_state_store"] = store
    return ctx


def app(replicas: int = 2) -> specs.AppDef:
    role = specs.Role(
        "trainer", image="ghcr.io/acme/train:1.0", entrypoint="python", args=["-m", "train"], num_replicas=replicas
    )
    return specs.AppDef("train", roles=[role])


def operator(server: Any, **kw: Any) -> AppDefOperator:
    kwargs = {"config_file": str(server.kubeconfig), "poll_interval": 0.2, **kw.pop("kubernetes_kwargs", {})}
    kw.setdefault("deferrable", True)
    return AppDefOperator(
        task_id="fit", app=app(), target="kubernetes", cfg={"namespace": NS}, kubernetes_kwargs=kwargs, **kw
    )


@pytest.fixture
def start(tmp_path: Path):
    """Starts a fake API server with a scenario; stopped at the end of the test."""
    servers: list[Any] = []

    def make(**scenario: Any) -> Any:
        server = kubehttp.start_server(tmp_path / f"api{len(servers)}", kubehttp.Scenario(**scenario))
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.stop()


def defer(op: AppDefOperator, ctx: dict[str, Any]) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    return deferred.value


def first_event(trigger: JobGangTrigger, timeout: float = 120) -> dict[str, Any]:
    """Run the trigger as the triggerer does (one event loop), after a round trip through
    its serialized form; the payload of its first event."""
    path, kwargs = trigger.serialize()
    assert path == "torchstep_airflow.triggers.JobGangTrigger"
    again = JobGangTrigger(**json.loads(json.dumps(kwargs)))  # JSON only

    async def one() -> dict[str, Any]:
        async for event in again.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(one(), timeout))


def objects(server: Any, kind: str) -> list[dict[str, Any]]:
    return [o for o in server.state()["objects"] if o.get("kind") == kind]


# -- the argument ----------------------------------------------------------------------------------
def test_deferrable_is_one_argument_with_kubernetes_kwargs_as_its_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    def op(**kw: Any) -> AppDefOperator:
        return AppDefOperator(task_id="t", app=app(), target="kubernetes", **kw)

    assert op().deferrable is False  # Airflow's [operators] default_deferrable
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
    assert op().deferrable is True and op(deferrable=False).deferrable is False
    alias = op(kubernetes_kwargs={"deferrable": False})
    assert alias.deferrable is False and "deferrable" not in alias.kubernetes_kwargs
    with pytest.raises(torchstep.SpecError) as err:
        op(deferrable=True, kubernetes_kwargs={"deferrable": False})
    assert err.value.field == "kubernetes_kwargs['deferrable']" and "set only deferrable=" in str(err.value)
    with pytest.raises(torchstep.SpecError) as err:
        AppDefOperator(task_id="t", app=app(), target="local", deferrable=True)
    assert err.value.field == "deferrable"
    assert AppDefOperator(task_id="t", app=app(), target="local").deferrable is False  # the default: no error
    with pytest.raises(torchstep.SpecError) as err:
        op(deferrable="yes")
    assert err.value.field == "deferrable"


def test_the_trigger_serializes_to_json_kwargs_and_refuses_unknown_ones() -> None:
    handle = {
        "namespace": NS,
        "app_id": "a",
        "label_selector": "torchstep/app-id=a",
        "preemption_retries": 3,
        "queue": None,
        "workloads": [{"kind": "Job", "name": "a-trainer", "uid": "u1"}],
    }
    trigger = JobGangTrigger(run_id="r", handle=handle, conn={"config_file": "/k"}, poll_interval=1, deadline=5.0)
    path, kwargs = trigger.serialize()
    assert json.loads(json.dumps(kwargs)) == kwargs
    assert JobGangTrigger(**kwargs).serialize() == (path, kwargs)
    with pytest.raises(ValueError, match="unknown key 'image'"):
        JobGangTrigger(run_id="r", handle=handle, conn={"image": "x"})


# -- execute → trigger → execute_complete, against the HTTP fake -----------------------------------
def test_deferred_job_succeeds_and_resumes_with_the_result_the_logs_once_and_cleanup(start, capsys) -> None:
    server = start(replicas=2, run_s=2, lines=5, line_interval_s=0.2)
    op, store = operator(server), Store()
    ctx = context(store)
    deferred = defer(op, ctx)
    assert deferred.method_name == "execute_complete"
    assert server.state()["jobs_created"] == 1  # created by the worker before it deferred
    assert store.get(RUN_ID_KEY)  # the durable state records the try, as without deferral
    event = first_event(deferred.trigger)
    assert event["status"] == "succeeded" and event["run_id"] == store.get(RUN_ID_KEY)
    assert server.state()["log_requests"] == 0  # nobody read a log while the task was deferred
    result = op.resume_execution(deferred.method_name, {"event": event}, ctx)
    assert result["state"] == "SUCCEEDED" and [r["replica_id"] for r in result["replicas"]] == [0, 1]
    out = capsys.readouterr().out.splitlines()
    for index in (0, 1):
        lines = [x for x in out if x.startswith(f"[trainer/{index}] line")]
        assert len(lines) == 5 and len(set(lines)) == 5, out  # every line, once
    assert objects(server, "Job") == []  # on_finish_action delete_pod (the default)
    assert store.get(REPORTED_KEY) == event["run_id"]  # a later try starts afresh


def test_deferred_non_retryable_failure_fails_without_retry_keeping_the_objects_when_asked(start) -> None:
    server = start(replicas=2, run_s=1, codes=[0, 82])
    op = operator(server, kubernetes_kwargs={"on_finish_action": "delete_succeeded_pod"})
    ctx = context(Store())
    deferred = defer(op, ctx)
    event = first_event(deferred.trigger)
    assert event["status"] == "failed"
    with pytest.raises(AirflowFailException, match="not retryable"):
        op.resume_execution(deferred.method_name, {"event": event}, ctx)
    xcom = ctx["ti"].xcom["return_value"]
    assert xcom["state"] == "FAILED" and xcom["retryable"] is False and xcom["exit_code"] == 82
    assert len(objects(server, "Job")) == 1  # failed: kept for inspection


def test_deferred_retryable_failure_is_retried_by_airflow(start) -> None:
    server = start(replicas=2, run_s=1, codes=[0, 1])
    op = operator(server, durable=False)  # each try its own Jobs
    ctx = context()
    deferred = defer(op, ctx)
    event = first_event(deferred.trigger)
    assert event["status"] == "failed"
    with pytest.raises(AirflowException) as err:
        op.resume_execution(deferred.method_name, {"event": event}, ctx)
    assert not isinstance(err.value, AirflowFailException)  # Airflow retries it
    assert objects(server, "Job") == []


def test_the_tasks_execution_timeout_ends_the_wait_and_deletes_the_jobs(start) -> None:
    server = start(replicas=2, run_s=600)
    op = operator(server, execution_timeout=__import__("datetime").timedelta(seconds=2))
    ctx = context(Store())
    deferred = defer(op, ctx)
    assert deferred.timeout is not None and deferred.timeout.total_seconds() > 2  # Airflow's own: a backstop
    began = time.monotonic()
    event = first_event(deferred.trigger)
    assert event["status"] == "timeout" and time.monotonic() - began < 60
    with pytest.raises(AirflowTaskTimeout):
        op.resume_execution(deferred.method_name, {"event": event}, ctx)
    assert ctx["ti"].xcom["return_value"]["state"] == "CANCELLED"
    assert objects(server, "Job") == [] and objects(server, "Pod") == []


def test_preemptions_the_trigger_counted_still_count_when_a_worker_resumes(start) -> None:
    server = start(replicas=2, run_s=600)
    op = AppDefOperator(
        task_id="fit",
        app=app(),
        target="kubernetes",
        deferrable=True,
        cfg={"namespace": NS, "preemption_retries": 1},
        kubernetes_kwargs={"config_file": str(server.kubeconfig), "poll_interval": 0.2},
    )
    ctx = context(Store())
    deferred = defer(op, ctx)
    # what the trigger reports after a second pod with DisruptionTarget (a polling reader cannot
    # catch the fake's evictions: it deletes an evicted pod at once; tests/kubernetes/test_remote.py)
    event = {
        **deferred.trigger.serialize()[1],
        "status": "preempted",
        "workload": None,
        "message": "the run ended",
        "preempted_pods": {"u1": "train-trainer-0", "u2": "train-trainer-0b"},
        "evictions": 0,
    }
    with pytest.raises(AirflowFailException, match="preempted 2 times"):
        op.resume_execution(deferred.method_name, {"event": event}, ctx)
    assert ctx["ti"].xcom["return_value"]["state"] == "PREEMPTED"
    assert objects(server, "Job") == []


def test_a_task_killed_while_deferred_deletes_its_jobs_from_the_triggerer(start) -> None:
    server = start(replicas=2, run_s=600)
    deferred = defer(operator(server), context(Store()))
    assert len(objects(server, "Job")) == 1
    asyncio.run(JobGangTrigger(**deferred.trigger.serialize()[1]).on_kill())
    assert objects(server, "Job") == [] and objects(server, "Service") == []


def test_jobs_deleted_while_deferred_are_a_retryable_run_error(start) -> None:
    server = start(replicas=2, run_s=600)
    op = operator(server)
    ctx = context(Store())
    deferred = defer(op, ctx)
    asyncio.run(JobGangTrigger(**deferred.trigger.serialize()[1]).on_kill())  # someone deletes them
    event = first_event(deferred.trigger)
    assert event["status"] == "gone"
    with pytest.raises(torchstep.RunError) as err:
        op.resume_execution(deferred.method_name, {"event": event}, ctx)
    assert err.value.retryable and "deleted" in str(err.value)
    assert server.state()["jobs_created"] == 1  # never created again behind the user's back


def test_a_creation_refused_before_the_deferral_leaves_nothing_running(start) -> None:
    server = start(replicas=2, run_s=600)
    server.fault(status=403, count=1, match="/services", methods=["POST"])  # the Job is made, its Service refused
    with pytest.raises(torchstep.RunError, match="403"):
        operator(server).execute(context(Store()))
    assert server.state()["jobs_created"] == 1 and objects(server, "Job") == []


def test_a_retry_after_the_worker_died_while_deferred_defers_again_on_the_same_jobs(start) -> None:
    server = start(replicas=2, run_s=600)
    op, store = operator(server), Store()
    first = defer(op, context(store))
    ctx = context(store)
    ctx["ti"].try_number = 2  # the resuming worker died: Airflow retries the task
    second = defer(op, ctx)
    assert second.trigger.run_id == first.trigger.run_id
    assert second.trigger.handle == first.trigger.handle  # the same Jobs, by uid
    state = server.state()
    assert state["jobs_created"] == 1 and state["conflicts"] >= 1, state


def test_deferral_imports_nothing_heavy_at_parse_time(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from airflow.sdk import DAG\n"
        "from torchstep_airflow import AppDefOperator\n"
        "with DAG('d', schedule=None):\n"
        "    AppDefOperator(task_id='t', app='dist.ddp', app_args=['-j', '2x2', '--script', 't.py'],\n"
        "                   target='kubernetes', deferrable=True)\n"
        "print(sorted(m for m in ('torchstep_airflow.triggers', 'torchstep_airflow.kubernetes', 'kubernetes',\n"
        "                         'kfp', 'prefect', 'torch') if m in sys.modules))\n"
        "import torchstep_airflow.triggers\n"  # what the triggerer imports to make the trigger again
        "print(sorted(m for m in ('kubernetes', 'kfp', 'prefect', 'torch') if m in sys.modules))\n"
    )
    cold = tmp_path / "plans"  # an empty plan store: the parse plans (TorchX), the worst case
    cold.mkdir(mode=0o700)
    env = {**os.environ, "TORCHSTEP_PLAN_CACHE": str(cold)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120, env=env)
    assert out.stdout.strip().splitlines()[-2:] == ["[]", "[]"]


# -- end to end: dag.test() runs the trigger inline -----------------------------------------------
DEFERRED_DAG = '''"""Written by tests/airflow/test_deferrable_jobs.py: a deferred 2-replica Job against a local HTTP fake."""
from airflow.sdk import DAG
from torchstep_airflow import AppDefOperator
from torchx import specs

role = specs.Role("trainer", image="ghcr.io/acme/train:1.0", entrypoint="python", args=["-m", "train"], num_replicas=2)
with DAG("{dag_id}", schedule=None, tags=["torchstep-test"]) as dag:
    AppDefOperator(
        task_id="fit", app=specs.AppDef("train", roles=[role]), target="kubernetes", deferrable=True,
        cfg={{"namespace": {namespace!r}}},
        kubernetes_kwargs={{"config_file": {kubeconfig!r}, "poll_interval": 0.5}},
    )
'''


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dag_test_defers_runs_the_trigger_inline_and_resumes(dag_tester, start) -> None:
    server = start(replicas=2, run_s=3, lines=4, line_interval_s=0.3)
    dag_file = dag_tester.home / "dags" / "torchstep_deferred_jobs.py"
    dag_file.write_text(
        DEFERRED_DAG.format(dag_id="torchstep_deferred_jobs", namespace=NS, kubeconfig=str(server.kubeconfig))
    )
    try:
        run = dag_tester.run("torchstep_deferred_jobs", timeout=400)
    finally:
        dag_file.unlink()
    fit = run["tasks"]["fit"]
    assert run["state"] == "success" and fit["state"] == "success", run["output"][-4000:]
    assert fit["xcom"]["state"] == "SUCCEEDED" and fit["try_number"] == 1
    out = run["output"]
    assert "waiting for them in the triggerer (deferred)" in out and "running trigger in line" in out
    assert "back from the triggerer (succeeded)" in out and "[trainer/1] line 3" in out
    state = server.state()
    assert state["jobs_created"] == 1 and not [o for o in state["objects"] if o.get("kind") == "Job"]


# -- end to end: a deployment's triggerer -----------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_deployment_triggerer_waits_for_the_jobs_and_a_worker_resumes(deployment, start) -> None:
    airflow = str(Path(sys.executable).parent / "airflow")
    if "triggerer" not in deployment.procs:  # the fixture starts none: one more component, stopped with it
        log = open(deployment.home / "triggerer.log", "wb")  # noqa: SIM115 - closed with the process
        deployment.procs["triggerer"] = subprocess.Popen(
            [airflow, "triggerer"], env=deployment.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
    server = start(replicas=2, run_s=8, lines=4, line_interval_s=1)
    dag_file = deployment.home / "dags" / "torchstep_deferred_jobs.py"
    dag_file.write_text(
        DEFERRED_DAG.format(dag_id="torchstep_deferred_jobs", namespace=NS, kubeconfig=str(server.kubeconfig))
    )
    subprocess.run([airflow, "dags", "reserialize"], env=deployment.env, capture_output=True, timeout=300, check=True)
    run = deployment.start_run("torchstep_deferred_jobs")
    path = f"/api/v2/dags/torchstep_deferred_jobs/dagRuns/{urllib.parse.quote(run['dag_run_id'], safe='')}"
    ti = f"{path}/taskInstances/fit"
    deployment.wait(lambda: deployment.call("GET", ti)["state"] == "deferred", 300, "the task to defer", interval=0.5)
    assert server.state()["jobs_created"] == 1

    def finished() -> dict | None:
        r = deployment.call("GET", path)
        return r if r["state"] in ("success", "failed") else None

    done = deployment.wait(finished, 300, "the DAG run to finish", interval=1)
    log = deployment.call("GET", f"{ti}/logs/1?full_content=true")
    text = "\n".join(str(e.get("event", "")) if isinstance(e, dict) else str(e) for e in log["content"])
    assert done["state"] == "success", text[-4000:]
    xcom = deployment.call("GET", f"{ti}/xcomEntries/return_value?deserialize=true")["value"]
    assert xcom["state"] == "SUCCEEDED"
    assert "back from the triggerer (succeeded)" in text and "[trainer/0] line 3" in text
    assert "waiting for them in the triggerer (deferred)" in text  # only the triggerer runs triggers here
    assert not [o for o in server.state()["objects"] if o.get("kind") == "Job"]
