"""The kubernetes target without a cluster (none exists here): the KubernetesPodOperator
builds exactly the pod torchstep renders; what the Job path submits passes the official
schemas; and the Job path's watch / result / cleanup logic against an in-memory API."""

import datetime
import os
import types

import kubernetes_validate
import pytest
import torchstep
from kpo_fakes import FakeHook
from kubefake import FakeKube, Script
from kubernetes.client import ApiClient
from torchstep.kubernetes import LABEL_APP_ID, MIN_KUBERNETES_VERSION
from torchx import specs

pytest.importorskip("airflow.providers.cncf.kubernetes")
from torchstep_airflow import kubernetes as airflow_kubernetes  # noqa: E402
from torchstep_airflow.kubernetes import PodStep, StepPodOperator, pod_operator, render, run_kubernetes  # noqa: E402
from torchstep_airflow.operators import AppDefOperator  # noqa: E402

RUN_ID = "train.fit.manual__2026-11-21T10_00_00+00_00.try1"
TI = types.SimpleNamespace(
    dag_id="train", task_id="fit", run_id="manual__2026-11-21T10:00:00+00:00", try_number=1, map_index=-1
)


def app(replicas=1, roles=1, **role_kw):
    def role(name):
        return specs.Role(
            name,
            image="ghcr.io/acme/train:1.0",
            entrypoint="python",
            args=["-m", "train", "--out", "/ckpt/${app_id}", "--price", "$5 {{ not a template }}"],
            env={"LOG_LEVEL": "debug"},
            num_replicas=replicas,
            resource=specs.Resource(cpu=2, gpu=1, memMB=4096),
            mounts=[specs.BindMount("/mnt/data", "/data", read_only=True), specs.VolumeMount("ckpt", "/ckpt")],
            metadata={"torchstep": {"secret_env": {"HF_TOKEN": "hf-token/token"}, "nproc_per_node": 2}},
            **role_kw,
        )

    return specs.AppDef("train", roles=[role(f"r{i}") if roles > 1 else role("trainer") for i in range(roles)])


def task(a, kwargs=None):
    return AppDefOperator(
        task_id="fit",
        app=a,
        target="kubernetes",
        cfg={"namespace": "ml"},
        kubernetes_kwargs=kwargs or {},
        durable=False,
    )


def step(a, kwargs=None):
    """A 1-replica app's pod operator, as the task's try builds it, and the rendered app."""
    t = task(a, kwargs)
    rendered = render(t, t.build_app()[1], RUN_ID)
    return types.SimpleNamespace(_inner=pod_operator("fit", rendered, t.kubernetes_kwargs), rendered=rendered)


def test_the_one_pod_path_is_a_step_backend_of_the_seam():
    from torchstep.adapter import StepBackend

    t = task(app())
    plan = t.build_app()[1]
    pod = PodStep(t, plan, render(t, plan, RUN_ID), {"ti": TI})
    assert isinstance(pod, StepBackend)  # run, cancel, say, record, plan, result, try_number
    assert pod.plan is plan and pod.result is None and isinstance(pod.operator, StepPodOperator)


def test_pod_operator_pod_is_the_rendered_pod():
    s = step(app())
    op = s._inner
    assert isinstance(op, StepPodOperator)
    op.__dict__["hook"] = FakeHook()  # 10.5.0 reads hook.is_in_cluster (no dry_run yet)
    built = ApiClient().sanitize_for_serialization(op.build_pod_request_obj(None))
    ours = s.rendered.roles[0].pod
    assert built["metadata"]["name"] == ours["metadata"]["name"]  # no random suffix: unique per try already
    assert built["metadata"]["namespace"] == "ml"
    assert ours["metadata"]["labels"].items() <= built["metadata"]["labels"].items()
    (main,) = [c for c in built["spec"]["containers"] if c["name"] == "main"]
    (mine,) = ours["spec"]["containers"]
    for key in ("image", "command", "args", "resources", "env", "terminationMessagePolicy"):
        assert main[key] == mine[key], key
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}} in main["env"]
    assert {"name": "TORCHSTEP_RESULT_FILE", "value": "/airflow/xcom/return.json"} in main["env"]
    # the XCom sidecar's volume comes on top of ours, nothing of ours is lost
    assert [m for m in main["volumeMounts"] if m["mountPath"] != "/airflow/xcom"] == mine["volumeMounts"]
    assert [v for v in built["spec"]["volumes"] if v["name"] != "xcom"] == ours["spec"]["volumes"]
    for key in ("restartPolicy", "enableServiceLinks"):
        assert built["spec"][key] == ours["spec"][key]
    assert "--price" in main["args"] and "$$5 {{ not a template }}" in main["args"]  # verbatim, $ escaped


def test_pod_operator_arguments_torchstep_owns_are_refused():
    with pytest.raises(torchstep.SpecError) as err:
        step(app(), {"image": "other:1"})
    assert err.value.field == "kubernetes_kwargs['image']"


def test_job_path_refuses_pod_operator_only_arguments():
    t = task(app(replicas=2), {"startup_timeout_seconds": 60})
    with pytest.raises(torchstep.SpecError) as err:
        run_kubernetes(t, t.build_app()[1], {"ti": TI})
    assert err.value.field == "kubernetes_kwargs['startup_timeout_seconds']"


# -- the Job path against the recorded in-memory API (tests/kubefake.py) ---------------------------
def job_set(exit_codes, messages=None, monkeypatch=None, **kwargs):
    """The Job path of one try of a task (several replicas: Jobs through core's open_step, not
    a pod operator), its client the KubernetesHook's, standing for a ``FakeKube``."""
    t = task(app(replicas=len(exit_codes)), {"poll_interval": 0.01, **kwargs})
    plan = t.build_app()[1]
    scripts = {i: Script(codes=[code], messages=[(messages or {}).get(i)]) for i, code in enumerate(exit_codes)}
    for i, script in scripts.items():
        if script.messages == [None]:
            script.messages = []
    fake = FakeKube(scripts)

    class Hook:
        default_conn_name = "kubernetes_default"

        def __init__(self, conn_id=None, **kwargs):
            self.core_v1_client, self.batch_v1_client, self.api_client = fake, fake, ApiClient()

    monkeypatch.setattr(airflow_kubernetes, "KubernetesHook", Hook)
    ctx = {"ti": TI}
    rendered = render(t, plan, airflow_kubernetes.attempt_of(ctx).run_id)
    run = lambda context=None: run_kubernetes(t, plan, ctx)  # noqa: E731
    return types.SimpleNamespace(run=run, cancel=t.on_kill, rendered=rendered), fake


def test_job_path_submits_schema_valid_objects_with_the_service_owned_by_its_job(capsys, monkeypatch):
    s, fake = job_set([0, 0], monkeypatch=monkeypatch)
    result = s.run(context=None)
    kinds = [o["kind"] for o in fake.objects]
    assert kinds == ["Job", "Service", "NetworkPolicy"]
    for obj in fake.objects:
        clean = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "uid"}}
        kubernetes_validate.validate(clean, MIN_KUBERNETES_VERSION, strict=True)
    job, svc, policy = fake.objects
    assert policy["metadata"]["ownerReferences"] == svc["metadata"]["ownerReferences"]  # goes with the Job
    assert svc["metadata"]["ownerReferences"][0] == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": job["metadata"]["name"],
        "uid": "uid-0",
    }
    assert job["spec"]["completions"] == 2 and job["spec"]["completionMode"] == "Indexed"
    assert result.state == "SUCCEEDED" and [r.replica_id for r in result.replicas] == [0, 1]
    selector = f"{LABEL_APP_ID}={s.rendered.app_id}"
    assert ("jobs", selector, "Foreground") in fake.deleted  # on_finish_action delete_pod
    out = capsys.readouterr().out
    assert "[trainer/0] hello" in out and "[trainer/1] hello" in out  # every pod's log streamed


def test_job_path_non_retryable_exit_fails_without_retry_and_keeps_objects_when_asked(monkeypatch):
    s, fake = job_set([0, 82], monkeypatch=monkeypatch, on_finish_action="delete_succeeded_pod")
    result = s.run(context=None)
    assert result.state == "FAILED" and result.retryable is False and result.exit_code == 82
    assert "exited 82 (non-retryable)" in result.message
    assert fake.deleted == []  # failed: kept for inspection


def test_job_path_cancel_deletes_everything(monkeypatch):
    s, fake = job_set([0, 0], monkeypatch=monkeypatch)
    fake.polls = 10**6  # never finishes by itself
    s.cancel()
    result = s.run(context=None)
    assert result.state == "CANCELLED" and result.retryable is False
    assert {kind for kind, _, _ in fake.deleted} >= {"jobs", "pods", "service"}


def test_kubernetes_target_operator_in_a_dag_imports_no_kubernetes_client_until_execute():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from airflow.sdk import DAG\n"
        "from torchstep_airflow import AppDefOperator\n"
        "with DAG('d', schedule=None):\n"
        "    AppDefOperator(task_id='t', app='dist.ddp', app_args=['-j', '2x2', '--script', 't.py'],\n"
        "                   target='kubernetes', kubernetes_kwargs={'on_finish_action': 'keep_pod'},\n"
        "                   execution_timeout=__import__('datetime').timedelta(hours=1))\n"
        "print(sorted(m for m in ('kubernetes', 'airflow.providers.cncf.kubernetes.operators.pod') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_step_timeout_becomes_the_pods_deadline_and_airflows_backstop():
    a = app()
    a.metadata["torchstep.timeout"] = "600"
    s = step(a)
    assert s.rendered.roles[0].pod["spec"]["activeDeadlineSeconds"] == 600
    from airflow.sdk import DAG
    from torchstep_airflow import AppDefOperator

    with DAG("d", schedule=None):
        op = AppDefOperator(task_id="t", app=a, target="kubernetes")
    assert op.execution_timeout == datetime.timedelta(seconds=660)


WORKER = """
import sys, torchstep

@torchstep.record
def main():
    import os
    rank = int(os.environ["RANK"])
    torchstep.output("loss", 0.25 if rank == 0 else 9.0)
    torchstep.output("rank", rank)
    if sys.argv[1] == "fail" and rank == 1:
        raise RuntimeError("disk full on rank 1")

main()
"""


def agent_summary(tmp_path, mode):
    """Run the real agent with the termination log the rendered pods set; return what
    Kubernetes would show as the container's termination message."""
    import subprocess
    import sys

    script = tmp_path / f"worker_{mode}.py"
    script.write_text(WORKER)
    log = tmp_path / f"termination-{mode}.log"
    env = {**os.environ, "TORCHSTEP_TERMINATION_LOG": str(log)}
    argv = [
        sys.executable,
        "-m",
        "torchstep.agent",
        "--nproc-per-node",
        "2",
        "--log-dir",
        str(tmp_path / mode),
        str(script),
        mode,
    ]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert log.exists(), done.stdout[-2000:] + done.stderr[-2000:]
    return done.returncode, log.read_text()


@pytest.mark.timeout(300)
def test_job_path_reads_rank0_outputs_and_root_cause_from_the_agents_termination_messages(tmp_path, monkeypatch):
    code_ok, ok = agent_summary(tmp_path, "ok")
    code_bad, bad = agent_summary(tmp_path, "fail")
    assert (code_ok, code_bad) == (0, 1)
    assert len(ok.encode()) <= 4096 and len(bad.encode()) <= 4096  # Kubernetes keeps 4096 bytes

    s, _ = job_set([0, 0], messages={0: ok, 1: ok}, monkeypatch=monkeypatch)
    result = s.run(context=None)
    assert result.state == "SUCCEEDED"
    assert result.outputs == {"loss": 0.25, "rank": 0}  # global rank 0's values, not rank 1's

    s, _ = job_set([0, code_bad], messages={0: ok, 1: bad}, monkeypatch=monkeypatch)
    result = s.run(context=None)
    assert result.state == "FAILED" and result.retryable is True
    assert result.root_cause is not None and result.root_cause.rank == 1
    assert "disk full on rank 1" in (result.root_cause.message or "")
    assert "disk full on rank 1" in result.message


def test_job_path_ignores_a_forged_pod_with_replica_0s_labels(capsys, monkeypatch):
    ok = torchstep.StepResult(app_id="x", state="SUCCEEDED", exit_code=0, outputs={"model_uri": "s3://ours"})
    forged = torchstep.StepResult(app_id="x", state="SUCCEEDED", exit_code=0, outputs={"model_uri": "s3://attacker"})
    s, fake = job_set([0, 0], messages={0: ok.summary(), 1: ok.summary()}, monkeypatch=monkeypatch)
    fake.impersonate(["[trainer/0] FORGED step"], forged.summary())
    result = s.run(context=None)
    assert result.state == "SUCCEEDED" and result.outputs == {"model_uri": "s3://ours"}
    out = capsys.readouterr().out
    assert "[trainer/0] hello" in out and "FORGED" not in out
    assert out.count("ignoring pod ml/") == 1


def test_a_run_error_is_retried_by_airflow_unless_it_says_retrying_cannot_help(monkeypatch):
    """A RunError (the cluster failed the run, the input is fine) is raised as is for Airflow
    to retry; one that is not retryable fails the task (AirflowFailException), as a SpecError does."""
    from airflow.sdk.exceptions import AirflowFailException

    t = task(app(replicas=2))
    plan = t.build_app()[1]
    for retryable in (True, False):

        def refused(*args, retryable=retryable, **kwargs):
            raise torchstep.RunError("Job ml/train-1a2b", "the API server refused it; fix: retry", retryable=retryable)

        monkeypatch.setattr(airflow_kubernetes, "run_kubernetes", refused)
        expected = torchstep.RunError if retryable else AirflowFailException
        with pytest.raises(expected, match=r"Job ml/train-1a2b: the API server refused it"):
            t._run(plan, {"ti": TI})
