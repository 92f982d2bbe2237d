"""``AppDefOperator(target="kubernetes", kubernetes_kwargs={"deferrable": True})`` without a
cluster (none exists here): the Kubernetes API is faked at the KubernetesPodOperator's own
seams (hook, client, pod manager); everything else — our operator, the provider's
``execute_async`` / ``trigger_reentry`` / cleanup, the trigger — is the real code.

What a user relies on: the task hands the worker slot back (TaskDeferred) with a trigger that
watches exactly the pod torchstep rendered; resuming reads the agent's step result; a
non-retryable result still fails without retries; the pod is cleaned up as configured."""

import json
import types

import pytest
from kpo_fakes import FakeHook
from torchx import specs

pytest.importorskip("airflow.providers.cncf.kubernetes")
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator  # noqa: E402
from airflow.providers.cncf.kubernetes.triggers.pod import KubernetesPodTrigger  # noqa: E402
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred  # noqa: E402
from torchstep.result import FAILED, SUCCEEDED, StepResult  # noqa: E402
from torchstep_airflow import AppDefOperator  # noqa: E402


def ns(**kw):
    return types.SimpleNamespace(**kw)


class FakeApi(FakeHook):
    """The calls KubernetesPodOperator makes in deferrable mode, recorded; the pod it reads
    back has finished with ``exit_code`` and the agent's result in its XCom file."""

    def __init__(self, exit_code: int, result: dict | None) -> None:
        self.exit_code, self.result = exit_code, result
        self.created: list = []
        self.deleted: list[str] = []

    # hook (the rest from FakeHook)
    def get_pod(self, name, namespace):
        assert self.created and self.created[0].metadata.name == name, "resumed on a pod that was never created"
        return self.finished(self.created[0])

    def finished(self, pod):
        phase = "Succeeded" if self.exit_code == 0 else "Failed"
        main = ns(name="main", state=ns(terminated=ns(exit_code=self.exit_code), running=None, waiting=None))
        pod.status = ns(phase=phase, container_statuses=[main])
        return pod

    # pod manager
    def create_pod(self, pod):
        self.created.append(pod)
        pod.metadata.uid = f"uid-{pod.metadata.name}"  # the API answers with the created pod, uid included
        return pod

    def await_pod_completion(self, pod, istio_enabled=False, container_name="main"):
        return self.finished(pod)

    def extract_xcom(self, pod):
        return json.dumps(self.result) if self.result is not None else "__airflow_xcom_result_empty__"

    def read_pod(self, pod):
        return pod  # no istio sidecar among its containers

    def read_pod_events(self, pod):
        return ns(items=[])

    def delete_pod(self, pod):
        self.deleted.append(pod.metadata.name)

    # core v1 client
    def list_namespaced_pod(self, namespace, label_selector):
        return ns(items=[])  # no pod of an earlier try to re-attach to

    def read_namespaced_pod_log(self, **kwargs):
        return [b"[trainer/0] epoch 1 done\n"]

    def patch_namespaced_pod(self, **kwargs):
        return None


@pytest.fixture
def api(monkeypatch):
    state: dict = {}

    def fake(self):
        return state["api"]

    for name in ("hook", "client", "pod_manager"):
        monkeypatch.setattr(KubernetesPodOperator, name, property(fake))
    return state


class TI:
    dag_id, task_id, run_id, try_number, map_index = "nightly", "fit", "scheduled__2026-11-21T00:00:00+00:00", 1, -1

    def __init__(self) -> None:
        self.xcom: dict[str, object] = {}

    def xcom_push(self, key, value):
        self.xcom[key] = value


def context():
    ti = TI()
    return {"ti": ti, "run_id": ti.run_id, "dag": ns(parent_dag=None), "task": None}


def operator(**kubernetes_kwargs):
    app = specs.AppDef(
        "train",
        roles=[
            specs.Role(
                "trainer",
                image="ghcr.io/acme/train:1.0",
                entrypoint="python",
                args=["-m", "train"],
                resource=specs.Resource(cpu=2, gpu=0, memMB=4096),
            )
        ],
    )
    return AppDefOperator(
        task_id="fit",
        app=app,
        target="kubernetes",
        cfg={"namespace": "ml"},
        kubernetes_kwargs={"deferrable": True, **kubernetes_kwargs},
    )


def result_dict(state: str, *, retryable: bool = True, exit_code: int = 0) -> dict:
    return StepResult(
        app_id="train-1", state=state, exit_code=exit_code, retryable=retryable, outputs={"loss": 0.25}
    ).to_dict()


def defer(op, api_state, fake, ctx):
    api_state["api"] = fake
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    return deferred.value


def test_execute_creates_the_rendered_pod_and_defers_to_a_trigger_watching_it(api):
    fake = FakeApi(0, result_dict(SUCCEEDED))
    op, ctx = operator(poll_interval=5), context()
    deferred = defer(op, api, fake, ctx)

    (pod,) = fake.created
    assert pod.metadata.namespace == "ml"
    (main,) = [c for c in pod.spec.containers if c.name == "main"]
    assert main.image == "ghcr.io/acme/train:1.0"
    assert main.command == ["torchstep-agent"] and main.args[-3:] == ["python", "-m", "train"]  # agent wraps role
    assert deferred.method_name == "trigger_reentry"  # resumes on AppDefOperator, not on the inner KPO
    trigger = deferred.trigger
    assert isinstance(trigger, KubernetesPodTrigger)
    classpath, kwargs = trigger.serialize()  # what the triggerer stores and rebuilds
    assert kwargs["pod_name"] == pod.metadata.name and kwargs["pod_namespace"] == "ml"
    assert kwargs["base_container_name"] == "main" and kwargs["poll_interval"] == 5
    assert ctx["ti"].xcom["pod_name"] == pod.metadata.name


def test_resuming_after_success_returns_the_agents_step_result_and_deletes_the_pod(api):
    fake = FakeApi(0, result_dict(SUCCEEDED))
    op, ctx = operator(), context()
    deferred = defer(op, api, fake, ctx)
    name = deferred.trigger.serialize()[1]["pod_name"]

    # Airflow resumes on a fresh copy of the task (the triggerer fired); the pod name must match
    value = operator().trigger_reentry(ctx, {"status": "success", "name": name, "namespace": "ml", "message": ""})
    assert value["state"] == SUCCEEDED and value["outputs"] == {"loss": 0.25}
    assert fake.deleted == [name]  # on_finish_action's default, delete_pod


def test_resuming_after_a_non_retryable_failure_fails_the_task_without_retry_and_keeps_the_result(api):
    fake = FakeApi(82, result_dict(FAILED, retryable=False, exit_code=82))
    op, ctx = operator(on_finish_action="keep_pod"), context()
    name = defer(op, api, fake, ctx).trigger.serialize()[1]["pod_name"]

    event = {"status": "failed", "name": name, "namespace": "ml", "message": "pod failed"}
    with pytest.raises(AirflowFailException, match="not retryable"):
        operator(on_finish_action="keep_pod").trigger_reentry(ctx, event)
    assert ctx["ti"].xcom["return_value"]["retryable"] is False
    assert fake.deleted == []  # keep_pod


def test_resuming_after_a_retryable_failure_raises_so_airflow_retries(api):
    fake = FakeApi(1, result_dict(FAILED, exit_code=1))
    op, ctx = operator(), context()
    name = defer(op, api, fake, ctx).trigger.serialize()[1]["pod_name"]

    event = {"status": "failed", "name": name, "namespace": "ml", "message": "pod failed"}
    with pytest.raises(AirflowException, match="FAILED") as err:
        operator().trigger_reentry(ctx, event)
    assert not isinstance(err.value, AirflowFailException)  # retryable: Airflow's retries apply
    assert ctx["ti"].xcom["return_value"]["state"] == FAILED


def test_deferrable_reaches_the_pod_operator_from_the_argument_and_from_its_alias():
    # the Job path (several replicas) defers too: tests/airflow/test_deferrable_jobs.py
    from torchstep_airflow.kubernetes import PodStep, render

    app = specs.AppDef("train", roles=[specs.Role("trainer", image="img:1", entrypoint="python")])
    for spelling in ({"deferrable": True}, {"kubernetes_kwargs": {"deferrable": True}}, {}):
        op = AppDefOperator(task_id="fit", app=app, target="kubernetes", **spelling)
        plan = op.build_app()[1]
        step = PodStep(op, plan, render(op, plan, "train.fit.r.try1"), context())
        assert step.operator.deferrable is bool(spelling), spelling
