"""AppDefOperator and @task.torchstep as a DAG author sees them when the DAG is parsed:
retries from the AppDef, conflicts as SpecErrors, templates rendered before the AppDef is
built. No scheduler, no database, no torch."""

import datetime

import pytest
import torchstep
from airflow.sdk import DAG, task
from torchstep_airflow import AppDefOperator
from torchx import specs


def app(max_retries=0, policy=specs.RetryPolicy.APPLICATION, metadata=None, args=("hi",), app_metadata=None):
    role = specs.Role(
        "worker",
        image="",
        entrypoint="echo",
        args=list(args),
        max_retries=max_retries,
        retry_policy=policy,
        metadata={"torchstep": metadata} if metadata else {},
    )
    return specs.AppDef("demo", roles=[role], metadata=app_metadata or {})


def component(msg: str = "hi", max_retries: int = 0, delay: float = 1.0) -> specs.AppDef:
    """A TorchX component (typed parameters, returns an AppDef)."""
    return app(max_retries, metadata={"retry_delay": delay}, args=(msg,))


def test_application_retries_and_timing_become_airflow_retries():
    with DAG("d", schedule=None):
        op = AppDefOperator(
            task_id="t", app=app(3, metadata={"retry_delay": 2, "retry_backoff": 3, "max_retry_delay": 10})
        )
    assert op.retries == 3
    assert op.retry_delay == datetime.timedelta(seconds=2)
    assert op.retry_exponential_backoff == 3
    assert op.max_retry_delay == datetime.timedelta(seconds=10)


def test_without_retry_budget_airflow_retries_stay_the_authors():
    with DAG("d", schedule=None, default_args={"retries": 2}):
        op = AppDefOperator(task_id="t", app=app(0))
    assert op.retries == 2


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"retries": 1}, "roles[0].max_retries"),  # APPLICATION 3 vs retries=1
        ({"retry_delay": 7}, "roles[0].metadata['torchstep']['retry_delay']"),
    ],
)
def test_conflicting_task_settings_are_spec_errors(kwargs, field):
    with DAG("d", schedule=None), pytest.raises(torchstep.SpecError) as err:
        AppDefOperator(task_id="t", app=app(3, metadata={"retry_delay": 2}), **kwargs)
    assert err.value.field == field
    assert "set" in err.value.fix


def test_airflow_retries_on_top_of_agent_restarts_are_refused_even_from_default_args():
    with DAG("d", schedule=None, default_args={"retries": 2}), pytest.raises(torchstep.SpecError) as err:
        AppDefOperator(task_id="t", app=app(2, policy=specs.RetryPolicy.REPLICA))
    assert err.value.field == "roles[0].retry_policy"
    assert "multiply" in str(err.value)


def test_step_timeout_gives_an_execution_timeout_backstop():
    with DAG("d", schedule=None):
        op = AppDefOperator(task_id="t", app=app(app_metadata={"torchstep.timeout": "30"}))
        mine = AppDefOperator(
            task_id="u", app=app(app_metadata={"torchstep.timeout": "30"}), execution_timeout=datetime.timedelta(5)
        )
    assert op.execution_timeout == datetime.timedelta(seconds=90)
    assert mine.execution_timeout == datetime.timedelta(5)


def test_a_bad_appdef_fails_when_the_dag_is_parsed():
    bad = app()
    bad.roles[0].num_replicas = 0
    with DAG("d", schedule=None), pytest.raises(torchstep.SpecError) as err:
        AppDefOperator(task_id="t", app=bad)
    assert err.value.field == "roles[0].num_replicas"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"app": app(), "target": "kfp"}, "target"),
        ({"app": 42}, "app"),
        ({"app": component, "app_args": "--msg hi"}, "app_args"),
        ({"app": app(), "app_args": ["--msg", "x"]}, "app_args"),
        ({"app": component, "app_args": {"nope": 1}}, "component.nope"),
    ],
)
def test_bad_operator_arguments_name_the_field(kwargs, field):
    with DAG("d", schedule=None), pytest.raises(torchstep.SpecError) as err:
        AppDefOperator(task_id="t", **kwargs)
    assert err.value.field == field


def test_templated_app_args_render_before_the_appdef_is_built_and_appdef_args_stay_verbatim():
    with DAG("d", schedule=None, params={"msg": "from-params"}):
        op = AppDefOperator(task_id="t", app=component, app_args={"msg": "{{ params.msg }}-{{ ds }}"})
        literal = AppDefOperator(task_id="u", app=app(args=["{{ not a template }}"]))
    op.render_template_fields({"params": {"msg": "from-params"}, "ds": "2026-11-21"})
    built, _ = op.build_app()
    assert built.roles[0].args == ["from-params-2026-11-21"]
    literal.render_template_fields({"params": {}, "ds": "2026-11-21"})
    assert literal.build_app()[0].roles[0].args == ["{{ not a template }}"]


def test_templated_args_plan_with_defaults_at_parse_and_check_after_rendering():
    with DAG("d", schedule=None):
        op = AppDefOperator(task_id="t", app=component, app_args={"msg": "{{ ds }}", "max_retries": "2"})
        drift = AppDefOperator(task_id="u", app=component, app_args={"max_retries": "{{ params.n }}"})
    assert op.retries == 2  # known at parse time: only msg is templated
    assert drift.retries == 0  # the component's default
    drift.render_template_fields({"params": {"n": 3}})
    _, plan = drift.build_app()
    from torchstep_airflow.settings import check_run_settings

    with pytest.raises(torchstep.SpecError) as err:
        check_run_settings(plan, drift._user, "local", drift._parsed, drift)
    assert "retries=3" in str(err.value) and err.value.fix.startswith("set retries=3")


def test_task_torchstep_makes_an_appdef_task_from_a_component_function():
    with DAG("d", schedule=None, params={"msg": "p"}):

        @task.torchstep(target="local")
        def train(msg: str = "hi", max_retries: int = 0, delay: float = 1.0) -> specs.AppDef:
            return component(msg, max_retries, delay)

        out = train(msg="{{ params.msg }}", max_retries=2)
    op = out.operator
    assert isinstance(op, AppDefOperator)
    assert op.retries == 2 and op.retry_delay == datetime.timedelta(seconds=1)
    op.render_template_fields({"params": {"msg": "rendered"}})
    assert op.build_app()[0].roles[0].args == ["rendered"]


def test_decorator_errors_name_the_parameter():
    with DAG("d", schedule=None), pytest.raises(TypeError, match="has no parameter 'nope'; fix: use one of: msg"):

        @task.torchstep
        def train(msg: str = "hi") -> specs.AppDef:
            return component(msg)

        train(nope=1)


def trainer(data: str, lr: float = 0.1, max_retries: int = 2) -> specs.AppDef:
    """A component with a required parameter.

    Args:
        data: input path
        lr: learning rate
        max_retries: APPLICATION retries
    """
    return app(max_retries, metadata={"retry_delay": 1}, args=(data, str(lr)))


@pytest.mark.parametrize(
    "args",
    [
        {"data": "{{ ti.xcom_pull('prep') }}", "lr": "{{ params.lr }}"},  # a required parameter is templated
        ["--data", "{{ ds }}", "--lr", "{{ params.lr }}"],  # command-line strings
    ],
)
def test_retry_budget_is_known_at_parse_time_even_with_templated_required_arguments(args):
    with DAG("d", schedule=None):
        op = AppDefOperator(task_id="t", app=trainer, app_args=args)
    assert op.retries == 2 and op.retry_delay == datetime.timedelta(seconds=1)
    op.render_template_fields({"params": {"lr": 0.5}, "ds": "2026-11-21", "ti": FakeTI()})
    built, plan = op.build_app()
    assert built.roles[0].args[1] == "0.5"
    from torchstep_airflow.settings import check_run_settings

    check_run_settings(plan, op._user, "local", op._parsed, op)  # the rendered AppDef agrees


class FakeTI:
    """Only what the template above reads (no metadata DB in these tests)."""

    def xcom_pull(self, task_ids):
        return "/data/from-prep"


def test_task_torchstep_passes_positional_and_varargs_by_name():
    with DAG("d", schedule=None):

        @task.torchstep
        def run(script: str, *script_args: str) -> specs.AppDef:
            return specs.AppDef(
                "run", roles=[specs.Role("r", image="", entrypoint="python", args=[script, *script_args])]
            )

        out = run("main.py", "--epochs", "{{ params.epochs }}")
    op = out.operator
    op.render_template_fields({"params": {"epochs": 3}})
    assert op.build_app()[0].roles[0].args == ["main.py", "--epochs", "3"]


def test_airflow_task_arguments_carry_the_same_timing() -> None:
    """The step's retry waits (StepRetry.delays, adapters/core/tests/test_retry_delays.py)
    become the task's Airflow retry arguments: the first role of two owns the timing."""

    def role(name: str, **opts: float) -> specs.Role:
        return specs.Role(
            name,
            image="img:1",
            entrypoint="python",
            args=["-c", "pass"],
            max_retries=2,
            retry_policy=specs.RetryPolicy.APPLICATION,
            metadata={"torchstep": opts},
        )

    two_roles = specs.AppDef(
        "two", [role("a", retry_delay=5, retry_backoff=2, max_retry_delay=8), role("b", retry_delay=1)]
    )
    with DAG("retry_delays", schedule=None):
        op = AppDefOperator(task_id="t", app=two_roles, target="local")
    assert op.retries == 2
    assert op.retry_delay == datetime.timedelta(seconds=5)
    assert op.retry_exponential_backoff == 2
    assert op.max_retry_delay == datetime.timedelta(seconds=8)
