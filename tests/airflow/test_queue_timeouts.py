"""How Airflow's ``execution_timeout`` counts the time a kubernetes step waits in a Kueue
queue (issue 36 goal 4; docs/kubernetes.md, "Timeouts and the queue"). It counts wall time
from the start of the try, the wait for admission included, while the step's own timeout
(the Jobs' ``activeDeadlineSeconds``) counts from admission. So with the run option
``queue`` torchstep derives no ``execution_timeout`` from the step timeout (without a queue
it derives the timeout + 60 s backstop), and one the DAG author set is kept and said in the
task log at each try."""

from __future__ import annotations

import datetime

import pytest
import torchstep
from torchx import specs

pytest.importorskip("airflow.providers.cncf.kubernetes")
from airflow.sdk import DAG  # noqa: E402
from torchstep_airflow import AppDefOperator  # noqa: E402
from torchstep_airflow.kubernetes import queue_timeout_note  # noqa: E402


def app(replicas: int) -> specs.AppDef:
    role = specs.Role("t", image="ghcr.io/acme/train:1", entrypoint="python", args=["-m", "t"], num_replicas=replicas)
    return specs.AppDef("train", roles=[role], metadata={"torchstep.timeout": "600"})


@pytest.mark.parametrize("replicas", [1, 2])  # the KubernetesPodOperator path and the Job path
def test_a_queued_step_gets_no_derived_execution_timeout_and_keeps_its_own_deadline(replicas: int) -> None:
    with DAG("d", schedule=None):
        plain = AppDefOperator(task_id="plain", app=app(replicas), target="kubernetes", cfg={"namespace": "ml"})
        queued = AppDefOperator(
            task_id="queued", app=app(replicas), target="kubernetes", cfg={"namespace": "ml", "queue": "team-a"}
        )
    assert plain.execution_timeout == datetime.timedelta(seconds=660)  # the step timeout + 60 s backstop
    assert queued.execution_timeout is None  # the wait in the queue would count against it
    rendered = torchstep.kubernetes.render_app(app(replicas), namespace="ml", cfg={"queue": "team-a", "run_id": "r1"})
    assert rendered.roles[0].workload["spec"]["activeDeadlineSeconds"] == 600  # counted from admission


def test_an_execution_timeout_the_author_set_is_kept_and_the_task_log_says_it_counts_the_queue() -> None:
    hour = datetime.timedelta(hours=1)
    with DAG("d", schedule=None):
        op = AppDefOperator(
            task_id="t",
            app=app(2),
            target="kubernetes",
            cfg={"namespace": "ml", "queue": "team-a"},
            execution_timeout=hour,
        )
    assert op.execution_timeout == hour
    said = queue_timeout_note("team-a", hour)
    assert said is not None
    assert "execution_timeout (3600 s) counts wall time, the wait in Kueue's queue team-a included" in said
    assert "the step's own timeout counts from admission" in said and "Fix: leave execution_timeout unset" in said
    assert queue_timeout_note(None, hour) is None and queue_timeout_note("team-a", None) is None
