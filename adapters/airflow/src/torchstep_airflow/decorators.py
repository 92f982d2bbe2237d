"""``@task.torchstep``: a TorchX component function as an Airflow TaskFlow task.

The decorated function is a component (it returns a ``torchx.specs.AppDef``). Calling it in
a DAG makes an :class:`~torchstep_airflow.AppDefOperator` task; its arguments may be
templates or XComArgs, rendered before the AppDef is built at execute time, and string
values are parsed by TorchX like ``torchx run`` arguments (``"0.1"`` → ``float``).

Example::

    from airflow.sdk import dag, task
    from torchx import specs

    @task.torchstep(target="local")
    def train(lr: float = 0.1, steps: int = 10) -> specs.AppDef:
        return specs.AppDef("train", roles=[specs.Role(
            "trainer", image="", entrypoint="python",
            args=["-m", "my_project.train", "--lr", str(lr), "--steps", str(steps)], num_replicas=2)])

    @dag(schedule=None, params={"lr": 0.1})
    def pipeline():
        train(lr="{{ params.lr }}")
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, ClassVar

from airflow.sdk.bases.decorator import DecoratedOperator, TaskDecorator, task_decorator_factory
from torchstep import SpecError
from torchstep.adapter import check_parameter_names

from torchstep_airflow.operators import AppDefOperator


class _TorchstepDecoratedOperator(DecoratedOperator, AppDefOperator):
    """The operator behind ``@task.torchstep``: ``app`` is the decorated component and its
    arguments are the call's ``op_args`` / ``op_kwargs`` (templated)."""

    template_fields: Sequence[str] = (*DecoratedOperator.template_fields, "cfg")
    template_fields_renderers: ClassVar[dict[str, str]] = {**DecoratedOperator.template_fields_renderers, "cfg": "py"}
    custom_operator_name: str = "@task.torchstep"

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Collection[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("multiple_outputs", None)  # the result is one dict (the step result)
        # before Airflow binds the call (its TypeError names no parameter): the words of every path
        check_parameter_names(python_callable, op_kwargs or {})
        super().__init__(
            python_callable=python_callable,
            op_args=op_args,
            op_kwargs=op_kwargs,
            kwargs_to_upstream={"app": python_callable},
            **kwargs,
        )

    def _component(self) -> tuple[Any, Mapping[str, Any]]:
        return self.python_callable, _bind(self.python_callable, list(self.op_args), dict(self.op_kwargs))


def _bind(fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by parameter name (``*args`` under its own name)."""
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs)
    except TypeError as e:
        raise SpecError("op_args", None, f"{fn.__qualname__}: {e}", fix="call the component with its parameters") from e
    out: dict[str, Any] = {}
    params = inspect.signature(fn).parameters
    for name, value in bound.arguments.items():
        if params[name].kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        else:
            out[name] = list(value) if params[name].kind is inspect.Parameter.VAR_POSITIONAL else value
    return out


def torchstep_task(python_callable: Callable[..., Any] | None = None, **kwargs: Any) -> TaskDecorator:
    """``@task.torchstep(target="local", cfg=None, **BaseOperator kwargs)``: wrap a TorchX
    component function into an :class:`~torchstep_airflow.AppDefOperator` task.

    Args:
        python_callable: the component function (it returns an AppDef); ``None`` when called with options.
        kwargs: the operator's arguments (``target``, ``cfg``, ``durable``, ``retries``, ...).

    Returns:
        The decorator, or (given ``python_callable``) the decorated function: calling it makes the task.

    Raises:
        TypeError: ``python_callable`` is not callable (an option passed by position).

    Example::

        @task.torchstep(target="kubernetes", cfg={"namespace": "ml"})
        def train(lr: float = 0.1) -> specs.AppDef: ...
    """
    return task_decorator_factory(
        python_callable=python_callable,
        decorated_operator_class=_TorchstepDecoratedOperator,
        **kwargs,
    )
