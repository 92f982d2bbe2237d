"""What a torchstep KFP step runs inside its container: ``python3 -m torchstep_kfp.entry``.

It materialises the AppDef from the actual input values (a component reference) or the
AppDef the component carries, runs it — in this container (``torchstep.steps.LocalStep``,
one agent per replica) or, for a multi-pod AppDef, as Kubernetes Jobs through
``torchstep.steps.KubernetesStep`` (every pod's log streamed here, the Jobs deleted on every
exit, SIGTERM of the pipeline's cancel included) — and writes the outputs KFP reads: the
step result, rank-0 output parameters, the Metrics and Model artifacts (through the
executor output file, as KFP's own executor does). Imports neither kfp nor torch.

Under kfp.local (``kfp_local_step``) KFP ignores ``set_retry``, so the AppDef's APPLICATION
retry budget is spent here (core's ``run_tries``, with the plan's delays): a pipeline that
passes locally passes remotely for the same reason.

Before anything runs, the run-time AppDef's plan is compared with the one the task was
compiled with (:func:`check_compiled`): a field KFP fixed at compile time (image,
resources, mounts, Secrets, node selectors, overlay, retries, timeout, shape) that the
run-time inputs change fails the step at once, naming the field and the input.

Exit status: 0 when the step succeeded, else the step's exit code (never 0), 2 for a bad
invocation (the message names the argument), 1 when the cluster failed the run
(:class:`~torchstep.RunError`; 82 when it says retrying cannot help).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Mapping
from typing import Any

from torchstep.adapter import Sink

POD_NAME_ENV = "TORCHSTEP_POD_NAME"
#: Seconds between two looks at the Jobs of a launcher step.
POLL_INTERVAL_S = 2.0
NAMESPACE_ENV = "TORCHSTEP_NAMESPACE"
_MOUNT_PREFIXES = (("gs://", "/gcs/"), ("minio://", "/minio/"), ("s3://", "/s3/"))
#: The input every step component has, set from KFP's pipeline job id placeholder when the
#: component is called: with the pod's name (one per task and per retry) it makes the app id.
JOB_ID_INPUT = "torchstep_job_id"
#: The input set from KFP's task id placeholder: the same for every retry of a task's pod
#: (KFP's driver resolves it once per task), so a retried launcher finds the Job it created.
TASK_ID_INPUT = "torchstep_task_id"
#: The input the component sets when called: what that task was compiled with (JSON: the
#: fixed fields of its plan, and the input values it was planned with), checked at run time.
COMPILED_INPUT = "torchstep_compiled"
#: Marks a string argument that ``components.literal`` escaped (KFP must not resolve it).
LITERAL_PREFIX = "torchstep-literal:"


def main(argv: list[str] | None = None, *, local: bool = False, client: Any = None) -> int:
    """Run the step of ``argv`` (see the module docstring); returns the exit status.
    ``local``: run by kfp.local's SubprocessRunner (which rewrites ``python3`` in every
    argument); ``client``: the Kubernetes client of a launcher step (default: in-cluster)."""
    args = _parser().parse_args(argv)
    try:
        spec = json.loads(args.spec)
        executor_input = json.loads(_unmangle(args.executor_input, local)) if args.executor_input else {}
        values = _inputs(spec, args.inputs or [], local)
        local_budget = local or args.kfp_local
        given = executor_input.get("inputs", {}).get("parameterValues", {})
        args.job_id = args.job_id or str(given.get(JOB_ID_INPUT) or "")
        # the task: KFP's task id (the same for each retry of the task); without it the pod (one per
        # task and per retry), or under kfp.local the task's output directory
        args.task_id = (
            args.task_id
            or str(given.get(TASK_ID_INPUT) or "")
            or os.environ.get(POD_NAME_ENV)
            or _local_task(executor_input)
        )
        compiled = json.loads(given[COMPILED_INPUT]) if given.get(COMPILED_INPUT) else None
    except (ValueError, KeyError) as e:
        _say(f"torchstep: bad step arguments: {e}", sys.stderr)
        return 2
    from torchstep import NON_RETRYABLE_EXIT_CODE, RunError, SpecError

    try:
        result = _run(spec, values, args, compiled, local=local_budget, client=client)
    except SpecError as e:
        _say(f"torchstep: {e}", sys.stderr)
        return 2
    except RunError as e:  # the cluster failed the run: a KFP retry may succeed, unless it says not
        _say(f"torchstep: {e}", sys.stderr)
        return 1 if e.retryable else NON_RETRYABLE_EXIT_CODE
    except KeyboardInterrupt:  # a second signal: every process was killed at once
        result = None
    if result is None:
        _say("torchstep: the step was stopped (SIGTERM); every process of it has ended", sys.stderr)
        return 143
    return _publish(spec, result, executor_input)


def kfp_local_step() -> None:
    """The function kfp.local's SubprocessRunner calls (through ``kfp.dsl.executor_main``):
    runs :func:`main` on this process's arguments and exits with its status, before KFP's
    executor would overwrite the executor output file this step wrote."""
    from torchstep.adapter import stop_when_ancestors_die

    # kfp.local runs it as pipeline process -> sh -> python and does not stop it when killed;
    # interrupted (an exception in the pipeline process: Ctrl-C, a timeout), kfp.local stops
    # reading the step's output (stdout, stderr merged into it) and may wait for it or live on
    stop_when_ancestors_die(name="torchstep-kfp-local-watch", output=sys.stdout.fileno())
    argv = sys.argv[1:]
    for flag in ("--component_module_path", "--function_to_execute"):
        while flag in argv:  # kfp's own launch arguments
            i = argv.index(flag)
            del argv[i : i + 2]
    raise SystemExit(main(argv, local=True))


def _local_task(executor_input: Mapping[str, Any]) -> str:
    """kfp.local writes a task's outputs under <root>/<run>/<task>/: that directory names it."""
    out = executor_input.get("outputs", {}).get("outputFile", "")
    return os.path.dirname(out) if out else ""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torchstep_kfp.entry", description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", required=True, help="the step spec (JSON, written by component_from_*)")
    p.add_argument("--executor_input", default="", help="KFP's executor input ({{$}})")
    p.add_argument("--job-id", default="", help="the KFP pipeline job id (default: from the executor input)")
    p.add_argument("--task-id", default="", help="the KFP task's identity (default: the pod's name)")
    p.add_argument("--kfp-local", action="store_true", help="run by kfp.local: spend the retry budget here")
    p.add_argument("--in", dest="inputs", nargs=2, action="append", metavar=("NAME", "VALUE"), help="an input value")
    return p


def _unmangle(text: str, local: bool) -> str:
    # kfp.local rewrites "python3" to its interpreter's path in every argument; undo it
    return text.replace(sys.executable, "python3") if local and sys.executable else text


def _inputs(spec: Mapping[str, Any], pairs: list[list[str]], local: bool) -> dict[str, Any]:
    types = spec.get("inputs", {})
    out: dict[str, Any] = {}
    for name, raw in pairs:
        if name not in types:
            raise KeyError(f"--in {name}: the step has no input {name!r}")
        raw = _unmangle(raw, local)
        kind = types[name]
        if kind == "str":
            out[name] = json.loads(raw[len(LITERAL_PREFIX) :]) if raw.startswith(LITERAL_PREFIX) else raw
        elif kind == "bool":
            out[name] = json.loads(raw.lower())
        else:
            value = json.loads(raw)
            out[name] = float(value) if kind == "float" else value
    return out


def appdef(spec: Mapping[str, Any], values: Mapping[str, Any]) -> Any:
    """The step's AppDef: the one the component carries, else the component materialised
    from ``values`` (``None`` and an empty ``*args`` left out: the function's own default)."""
    from torchstep import materialize

    if spec.get("app") is not None:
        from torchstep.adapter import app_from_dict

        return app_from_dict(spec["app"])
    mapping = {k: v for k, v in values.items() if v is not None}
    for name in spec.get("variadic", []):
        if name in mapping and not mapping[name]:
            del mapping[name]
    return materialize(spec["component"], mapping)


def _run(
    spec: Mapping[str, Any],
    values: Mapping[str, Any],
    args: argparse.Namespace,
    compiled: Any,
    *,
    local: bool,
    client: Any,
) -> Any:
    """Check the run-time AppDef against what the task was compiled with, then run it —
    in this container, or as the Jobs of a launcher step — through core's
    :func:`~torchstep.steps.run_tries` (the APPLICATION budget is spent here only under
    kfp.local, which ignores ``set_retry``)."""
    import dataclasses

    from torchstep import build_plan
    from torchstep.adapter import Attempt, run_tries, stop_on_signals

    app = appdef(spec, values)
    launcher = bool(spec.get("launcher"))
    compiled = compiled or {"fixed": spec.get("fixed"), "planned_with": spec.get("planned_with")}
    if inputs_changed(compiled.get("planned_with") or {}, values):  # else the AppDef is the one compiled
        check_compiled(spec, values, compiled, build_plan(app, "kfp"))
    cfg = dict(spec.get("cfg") or {})
    options: dict[str, Any] = {}
    if launcher:  # the Jobs are named after the task, not the pod: a retried launcher reattaches
        namespace = cfg.get("namespace") or os.environ.get(NAMESPACE_ENV)
        cfg.update({"namespace": namespace} if namespace else {})
        options = {"client": client, "poll_interval": POLL_INTERVAL_S}
    else:  # the pod mounted the volumes (as compiled: checked above), and its cgroup limits the cpus
        app = dataclasses.replace(
            app,
            roles=[
                dataclasses.replace(r, mounts=[m for m in r.mounts if type(m).__name__ != "VolumeMount"])
                for r in app.roles
            ],
        )
        cfg.setdefault("cpu_affinity", False)
    plan = build_plan(app, "kubernetes" if launcher else "local")
    attempt = Attempt(("kfp", args.job_id or "run", args.task_id or spec.get("name", "step")))
    cancel = threading.Event()  # set by SIGTERM (the run cancelled, the pod evicted) or SIGINT
    with stop_on_signals(cancel, (signal.SIGTERM, signal.SIGINT)):
        result = run_tries(
            plan,
            attempt=attempt,
            cfg=cfg,
            on_line=_print,
            cancel=cancel,
            retries=plan.step_retry.count if local and not launcher else 0,
            **options,
        )
    return None if cancel.is_set() else result


def inputs_changed(planned_with: Mapping[str, Any], values: Mapping[str, Any]) -> bool:
    """Whether the run-time input ``values`` differ from those the task was compiled with
    (an input on one side only differs): only then can the AppDef's fixed fields differ
    from the compiled ones, and only then is it planned for ``kfp`` to check them — a step
    run with its compiled values is planned once, for its run target.

    >>> inputs_changed({"lr": 0.1}, {"lr": 0.1}), inputs_changed({"lr": 0.1}, {"lr": 0.2}), inputs_changed({}, {})
    (False, True, False)
    """
    missing = object()
    return any(values.get(k, missing) != planned_with.get(k, missing) for k in {*planned_with, *values})


def fixed_of(plan: Any, spec: Mapping[str, Any]) -> dict[str, Any]:
    """What a task of this step fixes at compile time: core's
    :func:`torchstep.plan.fixed.step_fixed` of the step's role."""
    from torchstep.adapter import step_fixed

    return step_fixed(plan, role=int(spec.get("role", 0)))


def check_compiled(spec: Mapping[str, Any], values: Mapping[str, Any], compiled: Mapping[str, Any], now: Any) -> None:
    """A :class:`~torchstep.SpecError` when the run-time AppDef's plan (``now``, target
    kfp) differs from the one the task was compiled with in a field KFP fixed at compile
    time (``compiled["fixed"]``), naming the field and the input that changed it (core's
    :func:`torchstep.plan.fixed.check_fixed`): KFP would run the step with the compiled
    value, silently."""
    from torchstep.adapter import check_fixed

    check_fixed(
        compiled.get("fixed") or {},
        compiled.get("planned_with") or {},
        values,
        fixed_of(now, spec),
        lambda v: _fixed_with(spec, v),
        target="kfp",
        orchestrator="KFP",
        when="compile time",
        fixed_as="compiled",
        fix_constant="pass {names} as a constant in the pipeline (e.g. op({first}=...)), or make this field "
        "independent of run-time inputs",
        fix_shape="pass these inputs as constants in the pipeline, or set them in component_from_fn(..., defaults=...)",
    )


def _fixed_with(spec: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any] | None:
    from torchstep import build_plan

    try:
        return fixed_of(build_plan(appdef(spec, values), "kfp"), spec)
    except Exception:  # these values alone make no plan: not the one input that changed it
        return None


def _print(line: str) -> None:
    _say(line, sys.stdout)


def _say(text: str, stream: Any) -> None:
    """Print ``text`` to ``stream`` and flush it. Under kfp.local, a pipeline process that
    was interrupted stops reading the step's output: nothing more is printed then (the rank
    logs and the result keep it), and the step's exit status stays its own, not EPIPE's."""
    try:
        print(text, file=stream, flush=True)
    except BrokenPipeError:
        from torchstep.adapter import discard_output

        discard_output(stream.fileno())


def _publish(spec: Mapping[str, Any], result: Any, executor_input: Mapping[str, Any]) -> int:
    """Write the result, the named outputs and the artifacts (core's
    :func:`~torchstep.adapter.publish` into an :class:`ExecutorOutputSink`); the step's
    exit status."""
    from torchstep.adapter import failure_summary, publish, unpublished, write_out

    sink = ExecutorOutputSink(spec, executor_input)
    missing = publish(result, sink, expected=list(spec.get("outputs", {})), model=bool(spec.get("model")))
    if sink.output_file:
        write_out(sink.output_file, json.dumps(sink.executor_output))
    if result.succeeded and missing:
        _say(unpublished(missing), sys.stderr)
        return 1
    if not result.succeeded:
        _say(failure_summary(result), sys.stderr)
        return int(result.exit_code) if result.exit_code else 1
    return 0


class ExecutorOutputSink(Sink):
    """KFP's sink of :func:`torchstep.adapter.publish`: what KFP reads after the step, as
    KFP's own executor writes it — each output parameter in its file and in the executor
    output, the ``Metrics`` artifact's metadata and file, the ``Model`` artifact (a URI
    referenced, a path copied).

    Args:
        spec: the step spec (its declared ``outputs``, ``metrics``, ``model``).
        executor_input: KFP's executor input (where each output goes).
    """

    def __init__(self, spec: Mapping[str, Any], executor_input: Mapping[str, Any]) -> None:
        outputs = executor_input.get("outputs", {})
        self.declared: Mapping[str, str] = spec.get("outputs", {})
        self.params: Mapping[str, Any] = outputs.get("parameters", {})
        self.artifacts: Mapping[str, Any] = outputs.get("artifacts", {})
        self.metrics_name = _artifact_name(spec.get("metrics"), "metrics")
        self.model_name = _artifact_name(spec.get("model"), "model")
        self.output_file: str = outputs.get("outputFile", "")
        self.executor_output: dict[str, Any] = {"parameterValues": {}}
        self._metrics: dict[str, float] = {}

    def _put(self, name: str, value: Any, kind: str) -> None:
        from torchstep.adapter import write_out

        target = self.params.get(name, {}).get("outputFile")
        self.executor_output["parameterValues"][name] = value
        if target:
            write_out(target, value if kind == "str" and isinstance(value, str) else json.dumps(value))

    def output(self, name: str, value: Any) -> None:
        kind = self.declared.get(name)
        if kind is not None:  # a pipeline reads only the outputs the component declares
            self._put(name, value if kind != "str" or isinstance(value, str) else json.dumps(value), kind)

    def metrics(self, values: Mapping[str, float]) -> None:
        self._metrics = dict(values)
        self._write_metrics()

    def _write_metrics(self) -> None:
        from torchstep.adapter import write_out

        art = _artifact(self.artifacts, self.metrics_name) if self.metrics_name else None
        if art is not None:
            art["metadata"] = {**art.get("metadata", {}), **self._metrics}
            write_out(_path(art["uri"]), json.dumps(self._metrics))
            self.executor_output.setdefault("artifacts", {})[self.metrics_name] = {"artifacts": [art]}

    def model(self, source: str) -> bool:
        from torchstep.adapter import copy_out, is_uri

        art = _artifact(self.artifacts, self.model_name) if self.model_name else None
        if art is None:
            return True  # no Model output to fill (a lone component run): nothing is missing
        art["metadata"] = {**art.get("metadata", {}), "source": source}
        if is_uri(source):
            art["uri"] = source  # the model stays where rank 0 put it
        elif os.path.exists(source):
            copy_out(source, _path(art["uri"]))
        else:
            return False
        self.executor_output.setdefault("artifacts", {})[self.model_name] = {"artifacts": [art]}
        return True

    def result(self, result: Any) -> None:
        from torchstep.adapter import without_nulls

        progress = progress_metrics(result.progress)
        if progress and self.metrics_name:  # the Metrics artifact shows the step's last progress too
            self._metrics = {**progress, **self._metrics}  # a rank-0 metric of the same name wins
            self._write_metrics()
        self._put("result", without_nulls(result.to_dict()), "dict")


#: The Metrics artifact's names for the step's last ``torchstep.progress()`` report.
PROGRESS_METRICS = ("progress_step", "progress_total", "progress_percent", "progress_rate", "progress_eta_s")


def progress_metrics(progress: Any) -> dict[str, float]:
    """The step's last progress (the result's ``progress``) as KFP scalar metrics: those of
    :data:`PROGRESS_METRICS` that are known (no total: no percent; no rate yet: no ETA).

    Args:
        progress: the result's ``progress`` (``step``, ``total``, ``rate``, ``eta_s``), or None.

    Returns:
        ``{name: number}``; empty when the step reported no progress.

    >>> progress_metrics({"step": 120, "total": 1000, "rate": 4.0, "eta_s": 220.0, "rank": 0})
    {'progress_step': 120.0, 'progress_total': 1000.0, 'progress_percent': 12.0, 'progress_rate': 4.0, 'progress_eta_s': 220.0}
    >>> progress_metrics({"step": 7, "total": None, "rate": None, "eta_s": None})
    {'progress_step': 7.0}
    """
    if not isinstance(progress, Mapping):
        return {}

    def number(key: str) -> float | None:
        v = progress.get(key)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v == v else None

    step, total = number("step"), number("total")
    if step is None:
        return {}
    values = {
        "progress_step": step,
        "progress_total": total,
        "progress_percent": round(100.0 * step / total, 2) if total else None,
        "progress_rate": number("rate"),
        "progress_eta_s": number("eta_s"),
    }
    return {k: v for k, v in values.items() if v is not None}


def _artifact_name(option: Any, default: str) -> str | None:
    """The artifact's name from a component option (``True``: the default name)."""
    if not option:
        return None
    return option if isinstance(option, str) else default


def _artifact(artifacts: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    items = artifacts.get(name, {}).get("artifacts", [])
    return dict(items[0]) if items else None


def _path(uri: str) -> str:
    """The local path of an artifact URI (KFP's mounts for remote stores)."""
    for prefix, mount in _MOUNT_PREFIXES:
        if uri.startswith(prefix):
            return mount + uri[len(prefix) :]
    return uri


if __name__ == "__main__":
    raise SystemExit(main())
