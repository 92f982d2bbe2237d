"""KFP container components from AppDefs and TorchX component functions.

``component_from_fn(component)`` gives a component whose KFP inputs are the component
function's parameters (types, defaults, docstring descriptions); the container runs
``python3 -m torchstep_kfp.entry``, which materialises the AppDef from the actual input
values at run time and runs it. ``component_from_app(app)`` does the same for a fixed AppDef.
Calling either inside a ``@dsl.pipeline`` gives a ``PipelineTask`` with the plan applied
(:func:`torchstep_kfp.apply_plan`); the static fields KFP needs (image, resources, retries,
env, volumes) come from the AppDef materialised with the defaults.

Example::

    from kfp import dsl
    from torchstep_kfp import component_from_fn

    train_op = component_from_fn("components/train.py:trainer", outputs={"loss": float}, metrics=True)

    @dsl.pipeline
    def pipeline(lr: float = 0.1):
        train = train_op(lr=lr)          # a PipelineTask: resources, set_retry, env... applied
        evaluate_op(result=train.outputs["result"], metrics=train.outputs["metrics"])
"""

from __future__ import annotations

import copy
import inspect
import json
import keyword
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from kfp.dsl.container_component_class import ContainerComponent
from torchstep import SpecError, StepPlan
from torchstep.adapter import INLINED_INTO, several_pods, waits_in_queue, warn_inlined
from torchstep.adapter.names import python_identifier

from torchstep_kfp import entry
from torchstep_kfp.entry import COMPILED_INPUT, JOB_ID_INPUT, LITERAL_PREFIX, TASK_ID_INPUT
from torchstep_kfp.tasks import TARGET, apply_plan, plan_of, role_of

#: The module the container runs (``python3 -m torchstep_kfp.entry``).
ENTRY_MODULE = "torchstep_kfp.entry"
#: The output parameter holding the step result (a JSON object, ``"schema": 1``).
RESULT_OUTPUT = "result"
METRICS_OUTPUT = "metrics"
MODEL_OUTPUT = "model"
#: Names the component uses itself (JOB_ID_INPUT: see torchstep_kfp.entry).
_RESERVED = (RESULT_OUTPUT, JOB_ID_INPUT, TASK_ID_INPUT, COMPILED_INPUT)
_OPTIONS = ("name", "outputs", "metrics", "model", "caching", "defaults", "cfg", "role", "launcher_image")
#: KFP's own lightweight-component launch script (kfp.dsl.component_factory): what
#: kfp.local's SubprocessRunner accepts. User data never enters it: it reaches Python as "$@".
_LIGHTWEIGHT_SCRIPT = (
    "\nprogram_path=$(mktemp -d)\n\n"
    'printf "%s" "$0" > "$program_path/ephemeral_component.py"\n'
    '_KFP_RUNTIME=true python3 -m kfp.dsl.executor_main --component_module_path "$program_path/ephemeral_component.py" "$@"\n'
)
_LIGHTWEIGHT_SOURCE = "from torchstep_kfp.entry import kfp_local_step as torchstep_step\n"
#: The image named by the SubprocessRunner's form of a step: the Python it really runs in.
_THIS_PYTHON = f"python:{sys.version_info.major}.{sys.version_info.minor}"


def component_from_app(app: Any, **options: Any) -> StepComponent:
    """A KFP container component that runs the fixed AppDef ``app`` (an AppDef, or a
    component reference materialised with its defaults). See :func:`component_from_fn` for
    the ``options``.

    Args:
        app: an AppDef, or a component reference (``"path/file.py:fn"``, ``"dist.ddp"``) run with its defaults.
        options: the options of :func:`component_from_fn` (``name``, ``outputs``, ``metrics``, ...).

    Returns:
        The component (called with no arguments).

    Raises:
        SpecError: an unknown or bad option, or an AppDef the ``kfp`` target cannot express.

    >>> from torchx import specs
    >>> app = specs.AppDef("echo", roles=[specs.Role("echo", image="python:3.11", entrypoint="echo", args=["hi"])])
    >>> component_from_app(app).name
    'echo'
    """
    from torchstep import materialize
    from torchstep.adapter import app_to_dict

    _check_options(options, set())
    appdef = materialize(app)
    plan = plan_of(appdef)
    spec = {"app": app_to_dict(appdef)}
    return _build(plan, spec, [], options, default_name=appdef.name, description=f"torchstep step {appdef.name}")


def component_from_fn(component: Any, **options: Any) -> StepComponent:
    """A KFP container component whose inputs are the parameters of ``component`` (a TorchX
    component function or its reference, ``"path/file.py:fn"`` / ``"pkg.module:fn"`` /
    ``"dist.ddp"``) with their types (str, int, float, bool, list, dict, Optional),
    defaults and docstring descriptions. At run time the container materialises the AppDef
    from the actual input values; image, resources and retries are fixed at compile time
    from the AppDef materialised with the defaults.

    Options (keyword-only):

    - ``defaults={param: value}`` (or ``param=value`` directly): new defaults for inputs;
      a required parameter needs one so the static fields can be computed.
    - ``name``: the component name (default: the function's name).
    - ``outputs``: rank-0 ``torchstep.output(name, value)`` values to publish as output
      parameters: ``{"loss": float}`` (typed) or ``["loss"]`` (strings; JSON for non-strings).
    - ``metrics=True`` (or the artifact's name): an ``Output[Metrics]`` named ``metrics`` from
      the rank-0 output ``"metrics"`` (a dict of numbers), else its numeric outputs.
    - ``model=True`` (or the artifact's name): an ``Output[Model]`` named ``model`` from the
      rank-0 output ``"model"`` (a path in the container: copied; a URI: referenced).
    - ``caching`` (default ``False``), ``role`` (the role a one-container step runs; default 0),
      ``cfg`` (run options of the step, ``torchstep runopts local`` / ``kubernetes``),
      ``launcher_image`` (the image of the launcher step of a multi-node AppDef).

    Every component has the output parameter ``result`` (the step result) and the inputs
    ``torchstep_job_id`` (and, for a launcher step of several pods, ``torchstep_task_id``),
    which the component sets from KFP's placeholders when called.

    Args:
        component: a TorchX component function or its reference.
        options: the options above (keyword-only).

    Returns:
        The component: its inputs are the function's parameters.

    Raises:
        SpecError: an unknown or bad option or default, a parameter named like an input or output
            the step uses itself, a required parameter without a default, or an AppDef (with the
            defaults) the ``kfp`` target cannot express.
    """
    from torchstep.adapter import component_of, parameters_of, reference_of, static_values

    fn, label = component_of(component)
    names = {p.name for p in parameters_of(component)}
    _check_options(options, names)
    defaults = dict(options.pop("defaults", None) or {})
    for key in list(options):
        if key in names and key not in _OPTIONS:
            defaults[key] = options.pop(key)
    for name in names & set(_RESERVED):
        raise SpecError(
            f"component.{name}",
            TARGET,
            f"{name!r} is a name the step component uses itself",
            fix="rename the parameter",
        )
    inputs, appdef = static_values(component, defaults, target=TARGET, builder="component_from_fn")
    plan = plan_of(appdef)
    spec = {"component": reference_of(component)}
    return _build(
        plan,
        spec,
        inputs,
        options,
        default_name=getattr(fn, "__name__", "step"),
        description=inspect.getdoc(fn) or label,
    )


class StepComponent(ContainerComponent):
    """A torchstep step as a KFP container component (a real ``ContainerComponent``:
    compile it, save its YAML, call it inside a ``@dsl.pipeline`` with its inputs as keyword
    arguments). The call gives a ``PipelineTask`` with the plan of that call applied
    (resources, ``set_retry``, env, kfp-kubernetes settings, caching off) and KFP's run and
    task ids as the step's app id. Each call is planned with the values known when the
    pipeline is compiled — its constants, the component's defaults for the rest (a pipeline
    parameter is known only at run time) — and the step checks at run time that its inputs
    leave the fields KFP fixed unchanged (:func:`torchstep_kfp.entry.check_compiled`). Under
    ``kfp.local`` with the SubprocessRunner (initialised before the call), the task runs the
    same argv as a lightweight Python component — the runner refuses container components.

    Args:
        component: the container component that :func:`component_from_fn` / :func:`component_from_app` built.
        plan: the step's plan, made with the component's defaults.
        role: the index of the role a one-container step runs.
        caching: KFP's caching of each task (``False``: a training step has side effects).
        spec: what the step reads at run time (``--spec``): the AppDef or component reference and the options.
        inputs: each parameter of the component function (a KFP input) with its compile-time default.
    """

    def __init__(
        self,
        component: Any,
        plan: StepPlan,
        role: int,
        caching: bool,
        spec: dict[str, Any],
        inputs: list[tuple[Any, Any]],
    ) -> None:
        super().__init__(component.component_spec, component.pipeline_func)
        self.plan = plan  # with the defaults
        self.role = role
        self.caching = caching
        self.spec = spec
        self.inputs = inputs
        self._local: Any = None
        self._docker: Any = None

    @property
    def component(self) -> ContainerComponent:
        """This component itself (kept for symmetry with wrappers that hold one)."""
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from kfp import dsl
        from kfp.dsl import pipeline_context
        from torchstep.adapter import unknown_parameter

        inputs = self.component_spec.inputs or {}
        for key in kwargs:  # before KFP's TypeError, which names no parameter
            if key not in inputs:
                raise unknown_parameter(self.name, key, [n for n in inputs if n not in _RESERVED], target=TARGET)
        plan, planned = self.plan_of_call(kwargs)
        kwargs = {k: literal(v) for k, v in kwargs.items()}
        kwargs.setdefault(JOB_ID_INPUT, dsl.PIPELINE_JOB_ID_PLACEHOLDER)
        if several_pods(self.plan):  # only a launcher names Jobs after the task
            kwargs.setdefault(TASK_ID_INPUT, dsl.PIPELINE_TASK_ID_PLACEHOLDER)
        kwargs[COMPILED_INPUT] = encode_spec({"fixed": entry.fixed_of(plan, self.spec), "planned_with": planned})
        runner = _kfp_local_runner()
        if runner == "subprocess":
            task = self.local_component()(*args, **kwargs)
        elif runner == "docker":
            task = self.docker_component()(*args, **kwargs)
        else:
            task = super().__call__(*args, **kwargs)
        if pipeline_context.Pipeline.get_default_pipeline() is not None:
            # this call's image (not for the SubprocessRunner's form: it runs in this Python)
            if runner != "subprocess" and not several_pods(plan) and task.container_spec is not None:
                task.container_spec.image = plan.roles[self.role].image
            queued = waits_in_queue("kubernetes", self.spec.get("cfg"))
            apply_plan(task, plan, role=self.role, caching=self.caching, launcher=several_pods(plan), queued=queued)
        return task

    def plan_of_call(self, kwargs: Mapping[str, Any]) -> tuple[StepPlan, dict[str, Any]]:
        """The plan of one call — the component's defaults, and the call's compile-time
        constants over them (a pipeline parameter or an upstream output keeps the default:
        its value exists only at run time) — and the input values it was made with."""
        from torchstep.adapter import check_value

        params = {p.name: p for p, _ in self.inputs}
        defaults = {p.name: default for p, default in self.inputs}
        planned = dict(defaults)
        for key, value in kwargs.items():
            if key in (JOB_ID_INPUT, TASK_ID_INPUT, COMPILED_INPUT):
                raise SpecError(key, TARGET, "is an input the step component sets itself", fix="do not pass it")
            if key in params and _constant(value):
                check_value(params[key], value, key, TARGET)
                planned[key] = value
        if planned == defaults:
            return self.plan, planned
        plan = plan_of(entry.appdef(self.spec, planned))
        if several_pods(plan) != several_pods(self.plan):
            shape = "several pods" if several_pods(plan) else "one container"
            raise SpecError(
                "inputs",
                TARGET,
                f"with these constants the AppDef needs {shape}, but the component was made for the other shape",
                fix="make a component for it: component_from_fn(..., defaults=...)",
            )
        return plan, planned

    def local_component(self) -> ContainerComponent:
        """The same step as a lightweight Python component (kfp.local's SubprocessRunner)."""
        if self._local is None:
            spec = copy.deepcopy(self.component_spec)
            container = spec.implementation.container
            container.args = [_LIGHTWEIGHT_SOURCE, "--function_to_execute", "torchstep_step", *(container.args or [])]
            container.command = ["sh", "-ec", _LIGHTWEIGHT_SCRIPT]
            # This form runs in this machine's Python, never in an image: name that, or the
            # runner warns about the step's image ("custom or non-Python base image") per task.
            container.image = _THIS_PYTHON
            self._local = ContainerComponent(spec, self.pipeline_func)
        return self._local

    def docker_component(self) -> ContainerComponent:
        """The container form for kfp.local's DockerRunner, which ignores ``set_retry`` too:
        ``--kfp-local`` makes the step spend the APPLICATION budget itself."""
        if self._docker is None:
            spec = copy.deepcopy(self.component_spec)
            container = spec.implementation.container
            container.args = [*(container.args or []), "--kfp-local"]
            self._docker = ContainerComponent(spec, self.pipeline_func)
        return self._docker


def _build(
    plan: StepPlan,
    spec: dict[str, Any],
    inputs: list[tuple[Any, Any]],
    options: dict[str, Any],
    *,
    default_name: str,
    description: str,
) -> StepComponent:
    from kfp import dsl
    from torchstep.adapter import check_cfg, task_function

    name = _component_name(options.get("name"), default_name)
    metrics = _artifact_name(options.get("metrics", False), METRICS_OUTPUT, "metrics")
    model = _artifact_name(options.get("model", False), MODEL_OUTPUT, "model")
    outputs = _outputs(options.get("outputs"), {n for n in (metrics, model) if n})
    role = options.get("role", 0)
    launcher = several_pods(plan)
    r = role_of(plan, role)
    caching = options.get("caching", False)
    if not isinstance(caching, bool):  # "false" would turn caching on
        raise SpecError(
            "caching",
            TARGET,
            f"must be True or False, got {caching!r}",
            fix="caching=False (the default: a training step has side effects) or caching=True",
        )
    launcher_image = options.get("launcher_image")
    if launcher_image is not None and (not isinstance(launcher_image, str) or not launcher_image.strip()):
        raise SpecError(
            "launcher_image",
            TARGET,
            f"must be an image reference (a string), got {launcher_image!r}",
            fix='e.g. launcher_image="ghcr.io/acme/torchstep:1"',
        )
    warn_inlined(plan, INLINED_INTO[TARGET])  # env values travel in the component (and the AppDef in its spec)
    # the step's run options: the local target in its one container, kubernetes for a launcher's Jobs
    cfg = check_cfg(options.get("cfg"), "kubernetes" if launcher else "local")
    image = launcher_image or r.image if launcher else r.image
    spec.update(
        {
            "version": 1,
            "name": name,
            "role": r.index,
            "launcher": launcher,
            "inputs": {p.name: p.type.__name__ for p, _ in inputs},
            "variadic": [p.name for p, _ in inputs if p.variadic],
            "outputs": outputs,
            "metrics": metrics,
            "model": model,
            "cfg": cfg,
            # what a call that passes no constants compiles with (a call passes its own: COMPILED_INPUT)
            "planned_with": {p.name: default for p, default in inputs},
        }
    )
    spec["fixed"] = entry.fixed_of(plan, spec)

    for out in outputs:
        if any(p.name == out for p, _ in inputs):
            raise SpecError(
                f"outputs.{out}",
                TARGET,
                f"{out!r} is also an input of the component (KFP names inputs and outputs in one namespace)",
                fix="publish the value under another name with torchstep.output",
            )
    params = [p.keyword(default) for p, default in inputs]
    params.append(inspect.Parameter(JOB_ID_INPUT, inspect.Parameter.KEYWORD_ONLY, default="", annotation=str))
    params.append(inspect.Parameter(COMPILED_INPUT, inspect.Parameter.KEYWORD_ONLY, default="", annotation=str))
    if launcher:  # its Jobs are named after KFP's task id; a one-pod step creates none
        params.append(inspect.Parameter(TASK_ID_INPUT, inspect.Parameter.KEYWORD_ONLY, default="", annotation=str))
    params.append(inspect.Parameter(RESULT_OUTPUT, inspect.Parameter.KEYWORD_ONLY, annotation=dsl.OutputPath(dict)))
    for out, kind in outputs.items():
        params.append(inspect.Parameter(out, inspect.Parameter.KEYWORD_ONLY, annotation=dsl.OutputPath(_TYPES[kind])))
    if metrics:
        params.append(inspect.Parameter(metrics, inspect.Parameter.KEYWORD_ONLY, annotation=dsl.Output[dsl.Metrics]))
    if model:
        params.append(inspect.Parameter(model, inspect.Parameter.KEYWORD_ONLY, annotation=dsl.Output[dsl.Model]))
    optional = {p.name for p, default in inputs if default is None}
    try:
        encoded = encode_spec(spec)
    except (TypeError, ValueError) as e:
        raise SpecError("cfg", TARGET, f"options must be JSON data: {e}", fix="use plain values") from e

    def body(*placeholders: Any) -> Any:
        values = dict(zip([p.name for p in params], placeholders, strict=True))
        # the executor input ({{$}}) carries the run and task ids and where each output goes
        args: list[Any] = ["--spec", encoded, "--executor_input", dsl.PIPELINE_TASK_EXECUTOR_INPUT_PLACEHOLDER]
        for p, _ in inputs:
            pair = ["--in", p.name, values[p.name]]
            args += [dsl.IfPresentPlaceholder(input_name=p.name, then=pair)] if p.name in optional else pair
        return dsl.ContainerSpec(image=image, command=["python3", "-m", ENTRY_MODULE], args=args)

    doc = _docstring(description, inputs, outputs, metrics, model)
    component = dsl.container_component(task_function(body, params, name=name, doc=doc))
    return StepComponent(component, plan, r.index, caching, spec, inputs)


_TYPES: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool, "list": list, "dict": dict}


def _artifact_name(value: Any, default: str, option: str) -> Any:
    """``True`` → ``default``; a name → that name; falsy → ``False``."""
    if not value:
        return False
    name = default if value is True else value
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or name in _RESERVED:
        raise SpecError(option, TARGET, f"{value!r} is not an artifact name", fix=f"{option}=True or {option}='a_name'")
    return name


def _outputs(value: Any, taken: set[Any]) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, str) or not isinstance(value, Mapping | Sequence):
        raise SpecError(
            "outputs",
            TARGET,
            f"must be a mapping name→type or a list of names, got {value!r}",
            fix='outputs={"loss": float} or outputs=["checkpoint"]',
        )
    items = value.items() if isinstance(value, Mapping) else [(n, str) for n in value]
    out = {}
    for name, kind in items:
        clash = name in _RESERVED or name in taken
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or clash:
            raise SpecError(
                f"outputs.{name}",
                TARGET,
                f"must be a Python identifier and not one of {list(_RESERVED)} or an artifact's name",
                fix="rename the output",
            )
        if kind not in _TYPES.values():
            raise SpecError(
                f"outputs.{name}",
                TARGET,
                f"type {kind!r} is not a KFP parameter type",
                fix="use str, int, float, bool, list or dict",
            )
        out[name] = kind.__name__
    return out


def _check_options(options: Mapping[str, Any], params: set[str]) -> None:
    for key in options:
        if key not in _OPTIONS and key not in params:
            raise SpecError(
                key,
                TARGET,
                "is not an option of the step component",
                fix=f"use one of {list(_OPTIONS)}" + (" or a component parameter" if params else ""),
            )


def _component_name(given: Any, default: str) -> str:
    """The component's Python name; KFP names the component and its tasks by an ASCII slug
    of it, so a name whose letters that slug would drop ("ünï 名前" → "n") is refused."""
    name = given or default
    dropped = "".join(c for c in str(name) if c.isalnum() and not c.isascii())
    if dropped:
        field = "name" if given else "name (the default: the AppDef's or the function's name)"
        raise SpecError(
            field,
            TARGET,
            f"{name!r}: KFP names components by an ASCII slug, which drops {dropped!r}",
            fix="name='train-model' (ASCII letters, digits, '-' and '_')",
        )
    return python_identifier(name)


def _docstring(
    description: str, inputs: list[tuple[Any, Any]], outputs: Mapping[str, str], metrics: bool, model: bool
) -> str:
    head = description.split("\n\nArgs:")[0].strip() or "torchstep step"
    if not inputs and not outputs and not metrics and not model:
        return head + "\n"  # nothing to describe (KFP parses every component's docstring)
    lines = [head, "", "Args:"]
    for p, _ in inputs:
        lines.append(f"    {p.name}: {' '.join(p.description.split()) or p.name}")
    lines.append(f"    {RESULT_OUTPUT}: the step result (torchstep result JSON, schema 1)")
    for name in outputs:
        lines.append(f"    {name}: rank-0 output {name!r}")
    if metrics:
        lines.append(f"    {metrics}: rank-0 metrics")
    if model:
        lines.append(f"    {model}: the model rank 0 saved")
    return "\n".join(lines) + "\n"


def literal(value: Any) -> Any:
    """A string argument that contains ``{{`` as text KFP never resolves as a placeholder
    (KFP resolves ``{{$.inputs…}}`` inside string constants): marked and JSON-escaped; the
    step decodes it back to the exact text. Anything else is returned as is.

    >>> text = literal("{{$.inputs.parameters['x']}}")
    >>> text.startswith(LITERAL_PREFIX), "{{" in text
    (True, False)
    >>> literal("plain")
    'plain'
    """
    if isinstance(value, str) and "{{channel:" in value:  # an f-string of pipeline parameters: KFP's to resolve
        return value
    if isinstance(value, str) and ("{{" in value or value.startswith(LITERAL_PREFIX)):
        return LITERAL_PREFIX + json.dumps(value).replace("{{", "{\\u007b").replace("python3", "\\u0070ython3")
    return value


def encode_spec(spec: Mapping[str, Any]) -> str:
    """``spec`` as JSON text that no placeholder engine rewrites: ``{{`` (KFP and Argo
    placeholders) and ``python3`` (which kfp.local rewrites in every argument) are written
    as JSON escapes, so literal ``{{$.inputs…}}`` text reaches the step verbatim.

    >>> encode_spec({"a": "{{$.inputs.parameters['x']}} python3"})
    '{"a":"{\\\\u007b$.inputs.parameters[\\'x\\']}} \\\\u0070ython3"}'
    >>> json.loads(encode_spec({"a": "{{x}} python3"}))["a"]
    '{{x}} python3'
    """
    compact = {
        k: v for k, v in spec.items() if not (v is None or v is False or v == {} or v == [] or (k == "role" and v == 0))
    }
    text = json.dumps(compact, sort_keys=True, separators=(",", ":"))
    return text.replace("{{", "{\\u007b").replace("python3", "\\u0070ython3")


def _constant(value: Any) -> bool:
    """Whether ``value`` is known when the pipeline is compiled (no pipeline parameter or
    upstream output in it, not an f-string of them)."""
    from kfp.dsl.pipeline_channel import PipelineChannel

    if isinstance(value, PipelineChannel) or (isinstance(value, str) and "{{channel:" in value):
        return False
    if isinstance(value, Mapping):
        return all(_constant(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_constant(v) for v in value)
    return True


def _kfp_local_runner() -> str | None:
    """``"subprocess"`` or ``"docker"`` when kfp.local is initialised in this process."""
    local = sys.modules.get("kfp.local.config")
    instance = getattr(getattr(local, "LocalExecutionConfig", None), "instance", None)
    if local is None or instance is None:
        return None
    if isinstance(instance.runner, local.SubprocessRunner):
        return "subprocess"
    return "docker" if isinstance(instance.runner, local.DockerRunner) else None
