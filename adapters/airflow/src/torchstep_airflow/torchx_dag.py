"""The generic DAG behind ``torchx run -s airflow``: one task that runs the AppDef carried
by the DAG run's conf, under torchstep's agent (``docs/torchx.md``).

Put it in the dags folder once (``python -m torchstep_airflow.torchx_dag DAGS_FOLDER``
writes the two-line file below); the ``airflow`` TorchX scheduler then triggers runs of it
through the REST API with the conf ``{"app": <AppDef as JSON>, "target": "local", "cfg":
{...}}``. The conf is checked on arrival: anything that is not a valid AppDef for the
target, or that the deployment's policy does not allow (:mod:`torchstep.policy`: the
``policy`` given to :func:`torchx_dag`, else the file ``TORCHSTEP_POLICY`` names in the
worker, else ``torchstep.policy.DEFAULT``), fails the run at once (no retry) with the field
and the rule in the task log, before anything is created. Whoever may trigger this DAG
chooses what runs: restrict that with Airflow's ``access_control`` (docs/security.md). On
the local target the step does not inherit the worker's environment (``inherit_env=False``).

Retries: a DAG's retries are fixed when it is parsed, so the generic task has none and
retries the whole app itself, as the AppDef asks (APPLICATION ``max_retries`` and the
retry delays of its metadata), each try with its own run id and logs.

Example (``dags/torchstep_torchx.py``)::

    from torchstep_airflow.torchx_dag import torchx_dag  # an Airflow DAG

    dag = torchx_dag()                      # dag_id "torchstep_torchx"
    gpu = torchx_dag(queue="gpu")           # dag_id "torchstep_torchx_gpu", tasks on queue "gpu"
    ml = torchx_dag("ml_torchx", policy="/etc/torchstep/ml.toml",
                    access_control={"ml-engineers": {"DAG Runs": {"can_create"}}})
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import DAG, BaseOperator
from airflow.sdk.exceptions import AirflowFailException
from torchstep import SpecError, StepPlan, StepResult
from torchstep.adapter import Policy, failure_summary, resolve_policy, untrusted_cfg
from torchstep.adapter.torchx import DAG_ID, TASK_ID, dag_id_for

from torchstep_airflow.operators import AppDefOperator
from torchstep_airflow.settings import UserSettings, run_id_of

DAG_FILE = '''"""The generic DAG of `torchx run -s airflow` (torchstep-airflow)."""
from torchstep_airflow.torchx_dag import torchx_dag  # an Airflow DAG

dag = torchx_dag()
'''


def app_from_conf(
    conf: Mapping[str, Any] | None, policy: Policy | str | None = None
) -> tuple[Any, str, dict[str, Any]]:
    """``(AppDef, target, cfg)`` from a DAG run conf, checked against the deployment's policy.

    Args:
        conf: the DAG run's conf (``{"app": <AppDef as JSON>, "target": ..., "cfg": {...}}``).
        policy: a :class:`torchstep.policy.Policy` or the path of its TOML file; ``None``:
            the file ``TORCHSTEP_POLICY`` names, else ``torchstep.policy.DEFAULT``.

    Returns:
        The AppDef, its target and its run options, as sent.

    Raises:
        SpecError: a bad field (``conf['app'].roles[0].entrypoint``...).
        torchstep.policy.PolicyError: a field the policy does not allow
            (``app.roles[0].mounts[0].src_path``, ``cfg['namespace']``...).

    Example::

        app, target, cfg = app_from_conf(context["dag_run"].conf)
    """
    app, _, target, cfg = received(conf, policy)
    return app, target, cfg


def received(conf: Mapping[str, Any] | None, policy: Policy | str | None) -> tuple[Any, StepPlan, str, dict[str, Any]]:
    """:func:`app_from_conf`, and the AppDef's plan (made once, by core's
    :func:`torchstep.schedulers.generic.step_received`)."""
    from torchstep.adapter import step_received

    return step_received(conf, policy, field="conf", what="the DAG run", scheduler="airflow")


class TorchxAppOperator(AppDefOperator):
    """The task of the generic DAG: the AppDef comes from the DAG run's conf (see the
    module docstring) and its APPLICATION budget is spent inside the task
    (:func:`torchstep.steps.run_tries`); everything else — logs, result XCom, cancel — is
    AppDefOperator's."""

    template_fields: Sequence[str] = ()
    own_retries = None  # the AppDef's budget: Airflow fixed this task's retries (0) at parse time

    def __init__(self, *, policy: Policy | None = None, **kwargs: Any) -> None:
        # No AppDef exists at parse time: skip AppDefOperator's parse-time planning.
        BaseOperator.__init__(self, retries=0, **kwargs)
        self.policy = policy  # None: the worker's TORCHSTEP_POLICY, read when a run arrives
        self.app: Any = None
        self.app_args = None
        self.target = "local"
        self.cfg: dict[str, Any] = {}
        self.kubernetes_kwargs: dict[str, Any] = {}
        # retries=0: Airflow never retries this task (it retries the app itself, each try
        # with its own run id), so there is no earlier try to reattach to
        self.durable = False
        self.deferrable = False  # it retries the app inside one try: it waits in its worker
        self._user = UserSettings()
        self._parsed = None
        self._runner: Any = None
        self._killed = False

    def execute(self, context: Any) -> dict[str, Any]:
        try:
            self.app, plan, self.target, cfg = received(context["dag_run"].conf, self.policy)
            self.cfg = untrusted_cfg(self.target, cfg)
        except SpecError as e:
            raise AirflowFailException(f"torchstep: {e}") from e
        self.log.info(
            "torchstep: running app %r (run id %s) on target %s, at most %d tries",
            plan.app_name,
            run_id_of(context),
            self.target,
            plan.step_retry.count + 1,
        )
        return self._run(plan, context)

    def on_retry(self, result: StepResult, attempt: int, delay: float) -> None:
        self.log.warning("torchstep: try %d failed (%s); retrying in %g s", attempt, failure_summary(result), delay)


def torchx_dag(
    dag_id: str = DAG_ID,
    *,
    queue: str | None = None,
    policy: Policy | str | None = None,
    access_control: Mapping[str, Any] | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """The generic DAG (see the module docstring). Unscheduled, never paused at creation.

    Args:
        dag_id: the DAG's id (``torchx run -s airflow -cfg dag_id=...`` picks it).
        queue: the executor queue of its task; the DAG is then ``<dag_id>_<queue>``
            (``-cfg queue=...`` picks it).
        policy: what a run's AppDef may do: a :class:`torchstep.policy.Policy` or the path of
            its TOML file (read now: a bad file is an import error of the DAG file); ``None``:
            the file ``TORCHSTEP_POLICY`` names in the worker, else ``torchstep.policy.DEFAULT``.
        access_control: Airflow's DAG-level permissions, e.g. ``{"ml-engineers": {"DAG Runs":
            {"can_create"}}}``: who may trigger it, hence who chooses what runs (docs/torchx.md).
        dag_kwargs: anything else ``DAG`` takes.

    Returns:
        The DAG.

    Raises:
        torchstep.policy.PolicyError: the policy file cannot be read or is not a policy.
    """
    dag_kwargs.setdefault("schedule", None)
    dag_kwargs.setdefault("catchup", False)
    dag_kwargs.setdefault("is_paused_upon_creation", False)
    dag_kwargs.setdefault("max_active_runs", 16)
    dag_kwargs.setdefault("tags", ["torchstep", "torchx"])
    dag_kwargs.setdefault("doc_md", __doc__)
    if access_control is not None:
        dag_kwargs["access_control"] = access_control
    checked = resolve_policy(policy) if policy is not None else None
    with DAG(dag_id_for(queue, dag_id), **dag_kwargs) as dag:
        TorchxAppOperator(task_id=TASK_ID, policy=checked, **({"queue": queue} if queue else {}))
    return dag


def write_dag_file(dags_folder: str) -> str:
    """Write ``<dags_folder>/torchstep_torchx.py`` (mode 0600, never through a symlink)."""
    from torchstep.adapter import write_private

    return write_private(os.path.join(dags_folder, "torchstep_torchx.py"), DAG_FILE)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m torchstep_airflow.torchx_dag DAGS_FOLDER``: install the generic DAG file."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or not os.path.isdir(args[0]):
        print("usage: python -m torchstep_airflow.torchx_dag DAGS_FOLDER (an existing directory)", file=sys.stderr)
        return 2
    print(f"wrote {write_dag_file(args[0])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
