"""What a step publishes beside its state, handed to an orchestrator: :func:`publish`
walks a :class:`~torchstep.StepResult` once — every rank-0 output, the metrics, the model
rank 0 saved, then the whole result — and gives each to a :class:`Sink`, the adapter's
writer for its orchestrator (KFP's executor output and artifacts, Prefect's artifacts, a
toy orchestrator's output table). One walk, one rule for what the metrics and the model
are (:func:`torchstep.outputs.metrics_of`), in every adapter.

Example::

    >>> from torchstep.adapter.outputs import Sink, publish
    >>> from torchstep.result import StepResult
    >>> class Printed(Sink):
    ...     def output(self, name, value): print("output", name, value)
    ...     def metrics(self, values): print("metrics", values)
    ...     def result(self, result): print("result", result.state)
    >>> done = StepResult(app_id="a", state="SUCCEEDED", exit_code=0, outputs={"loss": 0.5, "tag": "x"})
    >>> publish(done, Printed(), expected=["loss", "acc"])
    output loss 0.5
    output tag x
    metrics {'loss': 0.5}
    result SUCCEEDED
    ['acc']
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from torchstep.outputs import metrics_of

if TYPE_CHECKING:
    from torchstep.result import StepResult

__all__ = ["MODEL_OUTPUT", "Sink", "publish"]

#: The rank-0 output that names the model a step saved (a path in the container or a URI).
MODEL_OUTPUT = "model"


class Sink:
    """Where an adapter writes what a step published; every method does nothing unless
    overridden, so a sink implements only what its orchestrator shows.

    The calls come in this order: :meth:`output` for each rank-0 output, :meth:`metrics`
    once (empty when no output is a number), :meth:`model` when the step succeeded and
    named one, and
    :meth:`result` last (a sink may write everything it collected there).
    """

    def output(self, name: str, value: Any) -> None:
        """One rank-0 output (``torchstep.output(name, value)``).

        Args:
            name: the output's name.
            value: its value (JSON data).
        """

    def metrics(self, values: Mapping[str, float]) -> None:
        """The step's metrics: :func:`torchstep.outputs.metrics_of` of the outputs (the
        output ``metrics`` when it is a mapping, else every number).

        Args:
            values: ``{name: number}``, empty when there is none.
        """

    def model(self, source: str) -> bool:
        """The model of a successful step: rank 0's output ``"model"``.

        Args:
            source: a path in the step's container, or a URI.

        Returns:
            Whether it was published (False: the path does not exist, or the sink cannot).
        """
        return True

    def result(self, result: StepResult) -> None:
        """The step result itself, after every part of it.

        Args:
            result: the step result.
        """


def publish(result: StepResult, sink: Sink, *, expected: Iterable[str] = (), model: bool = False) -> list[str]:
    """Give ``result``'s outputs, metrics, model and the result itself to ``sink``.

    Args:
        result: the step result.
        sink: the adapter's writer.
        expected: the outputs the orchestrator declared (a pipeline reads them): each one
            missing is returned.
        model: whether the orchestrator expects a model (output ``"model"``): a successful
            step without one, or with one the sink could not publish, returns ``"model"``.

    Returns:
        The expected outputs that are missing, in the order given (the caller decides
        whether that fails the step: :func:`torchstep.outputs.unpublished` says it).
    """
    outputs = dict(result.outputs or {})
    for name, value in outputs.items():
        sink.output(str(name), value)
    sink.metrics(metrics_of(outputs))
    missing = [name for name in expected if name not in outputs]
    if model and result.succeeded:
        source = outputs.get(MODEL_OUTPUT)
        if not (isinstance(source, str) and source and sink.model(source)) and MODEL_OUTPUT not in missing:
            missing.append(MODEL_OUTPUT)
    sink.result(result)
    return missing
