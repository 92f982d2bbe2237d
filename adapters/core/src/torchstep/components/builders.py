"""``materialize``: a TorchX component (reference or callable) plus its arguments → AppDef.

String arguments are parsed by TorchX's own builder (``materialize_appdef``), exactly as
``torchx run`` parses them; keyword arguments are passed to the function as Python values.

Example::

    >>> import torchstep
    >>> app = torchstep.materialize("utils.echo", ["--msg", "hello"])
    >>> app.roles[0].args
    ['hello']
    >>> torchstep.materialize("utils.echo", {"msg": "hi"}).roles[0].args
    ['hi']
"""

from __future__ import annotations

import collections.abc
import contextlib
import contextvars
import difflib
import functools
import importlib
import inspect
import io
import json
import os
import types
import typing
import weakref
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchstep.components import cache as component_cache
from torchstep.errors import SpecError

if TYPE_CHECKING:  # torchx is imported when a component is materialised, not with torchstep
    from torchx.specs import AppDef

ComponentRef = str | Callable[..., Any]


class UnknownParameterError(SpecError, TypeError):
    """A component argument names no parameter of the component: a typo in a name, which
    no value can fix (``--stpes 5``, ``{"nnodez": 2}``). ``field`` is ``component.<name>``
    and the fix lists the parameters there are. Also a ``TypeError``, as Python's own
    error for an unexpected keyword argument is.

    Args:
        field: ``component.<name>``.
        target: the target, when known.
        problem: what is wrong.
        fix: the parameters there are.

    >>> import torchstep
    >>> torchstep.materialize("utils.echo", ["--mgs", "hi"])
    Traceback (most recent call last):
    ...
    torchstep.components.builders.UnknownParameterError: component.mgs: utils.echo has no parameter 'mgs'; fix: use one of: msg, image, num_replicas (did you mean 'msg'?)
    """


def unknown_parameter(
    label: str, name: str, params: Collection[str], *, field: str | None = None, target: str | None = None
) -> UnknownParameterError:
    """The error for argument ``name``, which ``label`` (a component) does not have: the
    same words on every path (a command line, a mapping, keyword arguments, defaults).

    Args:
        label: the component's label (its reference or qualified name).
        name: the argument's name as given.
        params: the parameters the component has (listed in the fix; the closest is suggested).
        field: the error's field path; ``None``: ``component.<name>``.
        target: the target the error is about; ``None``: any.

    Returns:
        The error, to raise.

    >>> str(unknown_parameter("train.py:fn", "stpes", ["steps", "lr"]))
    "component.stpes: train.py:fn has no parameter 'stpes'; fix: use one of: steps, lr (did you mean 'steps'?)"
    """
    names = list(params)
    close = difflib.get_close_matches(name, names, n=1)
    fix = f"use one of: {', '.join(names) or '(none)'}" + (f" (did you mean {close[0]!r}?)" if close else "")
    return UnknownParameterError(field or f"component.{name}", target, f"{label} has no parameter {name!r}", fix=fix)


def check_parameter_names(component: Any, names: Iterable[Any]) -> None:
    """Raise :class:`UnknownParameterError` for the first of ``names`` that is not a
    parameter of ``component`` (a callable or a reference, as :func:`materialize` takes).
    Names are static where values may be templates: an orchestrator checks them when the
    pipeline is defined.

    Args:
        component: a component callable or reference.
        names: the argument names to check (non-strings are checked as their ``str``).

    Raises:
        UnknownParameterError: the first name the component has no parameter for.
        SpecError: the component cannot be found.

    >>> check_parameter_names("utils.echo", ["msg"])
    >>> check_parameter_names("utils.echo", ["mgs"])
    Traceback (most recent call last):
    ...
    torchstep.components.builders.UnknownParameterError: component.mgs: utils.echo has no parameter 'mgs'; fix: use one of: msg, image, num_replicas (did you mean 'msg'?)
    """
    fn, label = component_of(component)
    params = _parameters(fn, label)
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    for name in names:
        p = params.get(name) if isinstance(name, str) else None
        if p is None:
            raise unknown_parameter(label, str(name), params)


def materialize(
    component: Any,
    args: Sequence[str] | Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> AppDef:
    """Build the ``torchx.specs.AppDef`` of ``component``.

    ``component`` is an AppDef (returned as is), a callable, ``"path/file.py:fn"``,
    ``"package.module:fn"`` or a TorchX builtin such as ``"dist.ddp"``. ``args`` is a list
    of command-line strings (``["--lr", "0.1"]``), parsed by TorchX's own builder exactly
    as ``torchx run`` parses them, or a mapping of parameter name to value rendered to
    that command line (``--name value``; lists as ``a,b``, dicts as ``k=v,k2=v2`` — TorchX's
    encodings; ``None`` leaves the parameter at its default; a ``*args`` parameter takes a
    list). ``kwargs`` are passed to the function as Python values, unparsed. Every failure
    is a :class:`~torchstep.SpecError` (never ``SystemExit``) whose ``field`` is
    ``component``, ``component.<param>`` or ``component.args[i]``.

    Args:
        component: an AppDef, a callable or a reference string.
        args: command-line strings, or parameter name → value; ``None``: the defaults.
        **kwargs: parameters passed to the function as Python values (not with ``args``).

    Returns:
        The checked ``torchx.specs.AppDef``.

    Raises:
        UnknownParameterError: an argument names no parameter of the component.
        SpecError: the component cannot be found, an argument cannot be parsed or has the
            wrong type, the component raised, or it did not return an AppDef.

    >>> materialize("utils.sh", {"args": ["echo", "--not-a-flag"]}).roles[0].args
    ['-c', 'echo --not-a-flag']
    >>> materialize("dist.ddp", ["--script", "train.py", "--nope"])
    Traceback (most recent call last):
    ...
    torchstep.components.builders.UnknownParameterError: component.nope: dist.ddp has no parameter 'nope'; fix: use one of: ...

    Option names are never abbreviated (TorchX's parser would take ``--nnode`` for
    ``--nnodes``): a name must be given whole.
    """
    from torchx.specs import AppDef

    if isinstance(component, AppDef):
        if args or kwargs:
            raise SpecError(
                "component",
                None,
                "arguments were given with a ready AppDef",
                fix="pass the component function (or its reference) instead of an AppDef",
            )
        return component
    fn, label = component_of(component)
    return materialize_resolved(fn, label, args, kwargs)


def materialize_resolved(
    fn: Callable[..., Any], label: str, args: Sequence[str] | Mapping[str, Any] | None, kwargs: Mapping[str, Any]
) -> Any:
    """:func:`materialize` for a component already found by :func:`component_of` (the plan
    cache finds it once and keys on the function).

    Args:
        fn: the component function.
        label: its label, as :func:`component_of` returns it (errors are named by it).
        args: the component's command-line arguments, or a mapping of its parameters.
        kwargs: keyword arguments (not together with ``args``).

    Returns:
        The checked ``torchx.specs.AppDef``.

    Raises:
        SpecError: both ``args`` and ``kwargs``, an unknown or badly typed argument, the
            component raised, or it did not return an AppDef.
    """
    if kwargs and args:
        raise SpecError(
            "component",
            None,
            f"{label}: give either args or keyword arguments, not both",
            fix="merge them into one mapping",
        )
    if kwargs:
        _check_kwargs(fn, label, kwargs)
        try:
            app = fn(**kwargs)
        except SpecError:
            raise
        except Exception as e:  # the component's own validation
            raise SpecError(
                "component", None, f"{label} raised {type(e).__name__}: {e}", fix="fix the component arguments"
            ) from e
        return _check_app(app, label)
    argv = _argv_of(fn, label, args)
    return _check_app(_materialize_argv(fn, label, argv), label)


def component_of(component: Any) -> tuple[Callable[..., Any], str]:
    """The component function of ``component`` and its label (the reference as given, or
    the function's qualified name).

    Args:
        component: a callable, or a reference string as :func:`materialize` takes
            (``"dist.ddp"``, ``"components/train.py:trainer"``, ``"pkg.module:fn"``).

    Returns:
        ``(fn, label)``: the component function and the label its errors are named by.

    Raises:
        SpecError: the reference cannot be found or imported, or is not a function.
    """
    if callable(component):
        return component, getattr(component, "__qualname__", repr(component))
    if not isinstance(component, str) or not component.strip():
        raise SpecError(
            "component",
            None,
            f"expected an AppDef, a callable or a reference string, got {component!r}",
            fix='use e.g. "components/train.py:trainer" or "dist.ddp"',
        )
    ref = component.strip()
    path, sep, fn_name = ref.rpartition(":")
    if sep and path and not path.endswith(".py") and not os.path.exists(path) and "/" not in path:
        # "package.module:fn"
        try:
            module = importlib.import_module(path)
        except ImportError as e:
            raise SpecError(
                "component",
                None,
                f"cannot import module {path!r} of {ref!r}: {e}",
                fix="check the module path and that its package is installed",
            ) from e
        except Exception as e:  # the module itself fails: SyntaxError, errors at import time
            raise SpecError(
                "component",
                None,
                f"importing module {path!r} of {ref!r} raised {type(e).__name__}: {e}",
                fix=f"fix the module {path}",
            ) from e
        fn = getattr(module, fn_name, None)
        if not callable(fn):
            raise SpecError(
                "component",
                None,
                f"module {path!r} has no function {fn_name!r}",
                fix=f"define {fn_name}() in {path} or fix the reference",
            )
        return fn, ref
    from torchx.specs.finder import ComponentNotFoundException, ComponentValidationException, get_component

    if sep and not os.path.exists(path):
        raise SpecError(
            "component",
            None,
            f"component file {path!r} does not exist (relative paths are read from {os.getcwd()})",
            fix="give a path relative to the current directory or an absolute path",
        )
    if not sep and (ref.endswith(".py") or os.path.isfile(ref)):
        found_fns = component_functions(ref)
        raise SpecError(
            "component",
            None,
            f"{ref!r} is a file: a component reference names a function in it, {ref}:FUNCTION",
            fix=f"use one of: {', '.join(f'{ref}:{n}' for n in found_fns)}"
            if found_fns
            else f"{ref} defines no component function (a top-level def returning specs.AppDef)",
        )
    if sep and ":" not in path and os.path.isfile(path):
        check_component_file(path, fn_name)  # before TorchX executes the file
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            # TorchX's get_component, each step done once per file version / builtin name
            # (see torchstep.components.cache); a path with a ":" of its own goes to TorchX.
            if not sep:
                found = component_cache.resolve_builtin(ref)
            elif ":" not in path:
                found = component_cache.resolve_file(path, fn_name)
            else:
                found = get_component(ref).fn
    except ComponentNotFoundException as e:
        if sep:
            raise SpecError("component", None, " ".join(str(e).split()), fix="check the reference") from e
        close = difflib.get_close_matches(ref, builtin_names(), n=1)
        raise SpecError(
            "component",
            None,
            f"{ref!r} is not a TorchX builtin component" + (f" (did you mean {close[0]!r}?)" if close else ""),
            fix="list them with `torchstep builtins`, or use path/file.py:fn",
        ) from e
    except ComponentValidationException as e:
        raise SpecError(
            "component",
            None,
            " ".join(str(e).split()),
            fix="a TorchX component has type-annotated parameters, a docstring and returns specs.AppDef",
        ) from e
    except Exception as e:  # import errors of the user's file, syntax errors...
        fix = "fix the component file"
        if isinstance(e, AttributeError) and "BinOp" in str(e):  # TorchX 0.7's linter reads `X | None` so
            fix = "write parameter annotations as typing.Optional[...] / List[...] / Dict[...], not `X | None`"
        raise SpecError("component", None, f"cannot load {ref!r}: {type(e).__name__}: {e}", fix=fix) from e
    return found, ref


def builtin_names() -> list[str]:
    """The names of TorchX's builtin components (and of any registered through
    ``[torchx.components]`` entry points), sorted: what ``torchstep builtins`` lists.

    Returns:
        The names, e.g. ``["dist.ddp", "dist.spmd", ..., "utils.echo", ...]``.
    """
    from torchx.specs.finder import get_components

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return sorted(get_components())


@dataclass(frozen=True)
class _FileOutline:
    """What a component file defines, read with ``ast`` (nothing executed)."""

    functions: dict[str, str]  # top-level def name -> its return annotation as written ("" when none)
    side_effect_line: int  # the first top-level statement that runs code at import (0: none)


def _outline(path: str) -> _FileOutline | None:
    """The outline of the file ``path``; ``None`` when it cannot be read or parsed (TorchX
    then reports it as it does)."""
    try:
        st = os.stat(path)
        return _outline_cached(os.path.abspath(path), st.st_mtime_ns, st.st_size)
    except (OSError, SyntaxError, ValueError):
        return None


@functools.lru_cache(maxsize=64)
def _outline_cached(abspath: str, _mtime_ns: int, _size: int) -> _FileOutline:
    import ast

    with open(abspath, "rb") as f:
        tree = ast.parse(f.read(), abspath)
    functions = {
        node.name: ast.unparse(node.returns) if node.returns is not None else ""
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
    }
    return _FileOutline(functions, _first_side_effect(tree.body))


def _is_main_guard(node: Any) -> bool:
    import ast

    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
    )


def _first_side_effect(body: list[Any]) -> int:
    """The line of the first statement of ``body`` that does work when the module is
    imported — a call, a loop, a ``with`` — outside ``if __name__ == "__main__":``; 0 when none.
    Definitions, imports and assignments are not counted (a component file has them)."""
    import ast

    for node in body:
        if _is_main_guard(node):
            continue
        if isinstance(node, ast.Expr) and not isinstance(node.value, ast.Constant):
            return int(node.lineno)
        if isinstance(node, ast.For | ast.While | ast.With | ast.AsyncFor | ast.AsyncWith):
            return int(node.lineno)
        if isinstance(node, ast.If | ast.Try):
            inner = [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            line = _first_side_effect(inner)
            if line:
                return line
    return 0


def component_functions(path: str) -> list[str]:
    """The component functions of the file ``path`` (top-level defs annotated to return an
    ``AppDef``), in file order, read without executing the file.

    Args:
        path: the component file.

    Returns:
        Their names; empty when there are none or the file cannot be parsed.

    >>> component_functions("no/such/file.py")
    []
    """
    outline = _outline(path)
    if outline is None:
        return []
    return [name for name, returns in outline.functions.items() if returns.strip("'\"").rpartition(".")[2] == "AppDef"]


_RUN_A_SCRIPT = (
    "run a training script with `torchstep run dist.ddp -- -j 1x2 --script {path}` (or utils.python --script)"
)


def check_component_file(path: str, fn_name: str) -> None:
    """Refuse ``path:fn_name`` before the file is executed when ``fn_name`` is not a
    component function of it: loading a component must not run a user's training script
    (a file whose top-level code calls ``init_process_group``...). Nothing is checked when
    the file cannot be parsed (TorchX reports that).

    Args:
        path: the component file.
        fn_name: the function named after the ``:``.

    Raises:
        SpecError: ``fn_name`` is not a top-level function of the file (the fix lists its
            component functions), or does not return an AppDef in a file that runs code
            when loaded (a training script's ``main``).
    """
    outline = _outline(path)
    if outline is None:
        return
    ref = f"{path}:{fn_name}"
    components = component_functions(path)
    script = (
        f"; {path} runs code when loaded (line {outline.side_effect_line}): it looks like a training script, "
        "not a component file"
        if outline.side_effect_line
        else ""
    )
    if fn_name not in outline.functions:
        close = difflib.get_close_matches(fn_name, components, n=1)
        if components:
            fix = f"use one of: {', '.join(components)}" + (f" (did you mean {close[0]!r}?)" if close else "")
        else:
            fix = _RUN_A_SCRIPT.format(path=path) if script else "define it as a top-level def returning specs.AppDef"
        raise SpecError("component", None, f"{path} has no function {fn_name!r}{script}", fix=fix)
    if fn_name not in components and script:  # else TorchX's linter names what is missing
        returns = outline.functions[fn_name] or "no annotation"
        raise SpecError(
            "component",
            None,
            f"{ref} is not a component: it does not return specs.AppDef ({returns}){script}",
            fix=_RUN_A_SCRIPT.format(path=path),
        )


def component_help(component: Any) -> str:
    """The parameters of a component, as TorchX's own argument parser prints them for
    ``torchx run COMPONENT --help`` (what ``torchstep run REF -- --help`` shows).

    Args:
        component: a component callable or a reference string.

    Returns:
        The help text.

    Raises:
        SpecError: the component cannot be found.

    >>> "--msg" in component_help("utils.echo")
    True
    """
    from torchx.specs.builders import materialize_appdef

    fn, _ = component_of(component)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            materialize_appdef(_with_evaluated_annotations(fn), ["--help"])
        except SystemExit:
            pass
    return out.getvalue()


def _function_info(fn: Callable[..., Any]) -> component_cache.FunctionInfo:
    try:
        params: Mapping[str, inspect.Parameter] | None = inspect.signature(fn).parameters
        error = ""
    except (TypeError, ValueError) as e:
        params, error = None, str(e)
    return component_cache.FunctionInfo(params, error, _evaluate_annotations(fn))


def _parameters(fn: Callable[..., Any], label: str) -> Mapping[str, inspect.Parameter]:
    info = component_cache.function_info(fn, _function_info)
    if info.parameters is None:
        raise SpecError(
            "component", None, f"{label} has no readable signature: {info.error}", fix="use a Python function"
        )
    return info.parameters


def _check_kwargs(fn: Callable[..., Any], label: str, kwargs: Mapping[str, Any]) -> None:
    params = _parameters(fn, label)
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    for key in kwargs:
        if key not in params:
            raise unknown_parameter(label, key, params)


def _argv_of(fn: Callable[..., Any], label: str, args: Sequence[str] | Mapping[str, Any] | None) -> list[str]:
    if args is None:
        return []
    if isinstance(args, str):
        raise SpecError(
            "component",
            None,
            f"args for {label} must be a list of strings or a mapping, got a string",
            fix='split it: ["--lr", "0.1"], never one shell string',
        )
    if isinstance(args, Mapping):
        return _argv_of_mapping(_parameters(fn, label), label, args)
    out = []
    for i, a in enumerate(args):
        if not isinstance(a, str):
            raise SpecError(
                f"component.args[{i}]",
                None,
                f"must be a string, got {type(a).__name__}",
                fix="convert every argument to str",
            )
        out.append(a)
    return out


def _argv_of_mapping(params: Mapping[str, inspect.Parameter], label: str, args: Mapping[str, Any]) -> list[str]:
    """``{"j": "2x2", "mounts": [...]}`` → the ``torchx run`` command line of those values."""
    argv: list[str] = []
    rest: list[str] = []
    for key, value in args.items():
        p = params.get(key) if isinstance(key, str) else None
        if p is None or p.kind == p.VAR_KEYWORD:
            raise unknown_parameter(label, str(key), params)
        if value is None:
            continue  # the parameter's default
        if p.kind == p.VAR_POSITIONAL:
            # after "--": a value that looks like a flag stays a value
            rest = ["--", *(str(v) for v in (value if isinstance(value, list | tuple) else [value]))]
        elif isinstance(value, list | tuple):
            argv += [f"--{key}", ",".join(str(v) for v in value)]
        elif isinstance(value, Mapping):
            argv += [f"--{key}", ",".join(f"{k}={v}" for k, v in value.items())]
        else:
            argv += [f"--{key}", str(value)]
    return argv + rest


#: Set while torchstep materialises a component: TorchX's parser builder (patched below)
#: then gives a parser without abbreviations. TorchX's own callers in this process (``torchx
#: run`` of a torchstep scheduler) keep TorchX's parser as it is.
_STRICT_PARSING: contextvars.ContextVar[bool] = contextvars.ContextVar("torchstep_strict_parsing", default=False)


def _cache_parsers() -> None:
    """Keep TorchX's argument parser per component function, without abbreviations.

    ``materialize_appdef`` builds an argparse parser (docstring parsing included) on every
    call, ~5 ms: a DAG of 50 tasks of one component paid ~0.3 s per parse (the Airflow
    adapter plans every task while the DAG is parsed). The parser depends only on the
    function, so one per function is enough; calls with defaults or a config are not cached.

    argparse takes any unique prefix of an option by default, so TorchX reads a typo such as
    ``--nnode 2`` as ``--nnodes 2``: torchstep's parsers take whole names only.
    """
    from torchx.specs import builders

    create = getattr(builders, "_create_args_parser", None)
    if create is None or getattr(create, "torchstep_cached", False):
        return
    parsers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def whole_names_only(parser: Any) -> Any:
        parser.allow_abbrev = False
        return parser

    def cached(fn: Any, defaults: Any = None, config: Any = None) -> Any:
        if not _STRICT_PARSING.get():
            return create(fn, defaults, config)
        if defaults or config:
            return whole_names_only(create(fn, defaults, config))
        try:
            return parsers[fn]
        except KeyError:
            parsers[fn] = parser = whole_names_only(create(fn))
            return parser
        except TypeError:  # not weak-referenceable: no cache
            return whole_names_only(create(fn))

    cached.torchstep_cached = True  # type: ignore[attr-defined]
    builders._create_args_parser = cached


def _with_evaluated_annotations(fn: Callable[..., Any]) -> Callable[..., Any]:
    """TorchX maps parameter annotations to argparse types and fails on string annotations
    (a component module with ``from __future__ import annotations``): give it a wrapper
    whose signature carries the evaluated types (one per function, so TorchX's argument
    parser is built once for it too).
    """
    return component_cache.function_info(fn, _function_info).evaluated


def _evaluate_annotations(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, or a wrapper of it whose ``__signature__`` has evaluated annotations.

    A plain function (cached per function) always gets the wrapper: TorchX reads the
    signature of what it is given on every call, and a ready ``__signature__`` spares that.
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn
    hints: Mapping[str, Any] = {}
    if any(isinstance(p.annotation, str) for p in sig.parameters.values()):
        try:
            hints = typing.get_type_hints(fn)
        except Exception:  # unresolvable names: let TorchX report the parameter
            hints = {}
    if not hints and not isinstance(fn, types.FunctionType):
        return fn
    params = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()]

    # The wrapper is kept with ``fn``'s cache entry: it holds ``fn`` weakly, or ``fn`` (a
    # component file's function, with the file's namespace) would never be freed.
    target = weakref.ref(fn)
    fn_name = getattr(fn, "__qualname__", "the component")

    @functools.wraps(fn)
    def component(*args: Any, **kwargs: Any) -> Any:
        live = target()
        if live is None:  # pragma: no cover - the caller holds fn while it calls this
            raise ReferenceError(f"{fn_name} no longer exists")
        return live(*args, **kwargs)

    del component.__wrapped__  # a strong reference to fn; the signature below replaces it
    component.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=params, return_annotation=hints.get("return", sig.return_annotation)
    )
    return component


def _materialize_argv(fn: Callable[..., Any], label: str, argv: list[str]) -> Any:
    from torchx.specs.builders import materialize_appdef

    _cache_parsers()
    evaluated = _with_evaluated_annotations(fn)
    err = io.StringIO()
    strict = _STRICT_PARSING.set(True)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return materialize_appdef(evaluated, argv)
    except SystemExit as e:  # argparse: bad or missing argument, or --help
        lines = err.getvalue().strip().splitlines()
        detail = lines[-1].partition("error: ")[2] if lines and "error: " in lines[-1] else ""
        if not detail:
            detail = "--help is not a component argument" if e.code == 0 else f"argument parsing exited with {e.code}"
        unknown = _unrecognized_option(detail)
        if unknown is not None:
            raise unknown_parameter(label, unknown, _parameters(fn, label)) from None
        raise SpecError(
            "component",
            None,
            f"{label}: {detail}",
            fix=f"pass the component's arguments as `torchx run` takes them (`torchstep run {label} -- --help` "
            f"lists them); got {argv!r}",
        ) from None
    except SpecError:
        raise
    except Exception as e:
        raise SpecError(
            "component", None, f"{label} raised {type(e).__name__}: {e}", fix="fix the component arguments"
        ) from e
    finally:
        _STRICT_PARSING.reset(strict)


def _unrecognized_option(detail: str) -> str | None:
    """The name of the first option argparse did not recognise (``--stpes=5`` → ``stpes``),
    or ``None`` when the error is another one (or names no option)."""
    prefix = "unrecognized arguments: "
    if not detail.startswith(prefix):
        return None
    for word in detail[len(prefix) :].split():
        if word.startswith("-") and word.strip("-") and not _is_number(word):
            return word.lstrip("-").partition("=")[0]
    return None


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _check_app(app: Any, label: str) -> Any:
    from torchx.specs import AppDef

    if not isinstance(app, AppDef):
        raise SpecError(
            "component",
            None,
            f"{label} returned {type(app).__name__}, not a torchx AppDef",
            fix="return torchx.specs.AppDef(...) from the component",
        )
    return app


@dataclass(frozen=True)
class ComponentParameter:
    """One parameter of a component function, typed for an orchestrator.

    ``type`` is one of :data:`PARAMETER_TYPES` (``Optional[X]`` → ``X`` with
    ``optional=True``; ``List[...]`` → ``list``; ``Dict[...]`` → ``dict``), ``default`` the
    function's default (:data:`inspect.Parameter.empty` when required), ``description`` from
    the docstring's ``Args:`` section, ``variadic`` for ``*args`` (a ``list`` parameter).

    Args:
        name: the parameter's name.
        type: one of :data:`PARAMETER_TYPES`.
        default: the function's default, or :data:`inspect.Parameter.empty` when required.
        optional: whether ``None`` is a valid value (``Optional[X]`` or a ``None`` default).
        description: its line in the component's docstring (empty when none).
        variadic: whether it is the ``*args`` parameter.

    >>> [p.name for p in parameters_of("utils.echo")]
    ['msg', 'image', 'num_replicas']
    """

    name: str
    type: type
    default: Any
    optional: bool
    description: str
    variadic: bool = False

    @property
    def required(self) -> bool:
        """Whether a value must be given: no default, not optional, not ``*args``."""
        return self.default is inspect.Parameter.empty and not self.optional and not self.variadic

    def keyword(self, default: Any) -> inspect.Parameter:
        """The parameter as a keyword-only one of an orchestrator's task function, with
        ``default`` (its value before run time): an optional type is ``typing.Optional``,
        which KFP's and Prefect's schemas read.

        Args:
            default: the parameter's value before run time.

        Returns:
            A keyword-only ``inspect.Parameter`` with this parameter's name and type.

        >>> p = next(p for p in parameters_of("utils.echo") if p.name == "msg")
        >>> p.keyword("hi")
        <Parameter "msg: str = 'hi'">
        """
        from typing import Optional

        kind = Optional[self.type] if self.optional else self.type  # noqa: UP045 (the schemas read Optional)
        return inspect.Parameter(self.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind)


def task_function(
    fn: Callable[..., Any],
    params: Sequence[inspect.Parameter],
    *,
    name: str,
    doc: str,
    returns: Any = inspect.Signature.empty,
    module: str | None = None,
) -> Callable[..., Any]:
    """``fn`` made an orchestrator's task function of a component: ``params`` (e.g.
    :meth:`ComponentParameter.keyword`) as its signature and annotations, which KFP and
    Prefect read its inputs from, and ``name`` and ``doc`` as its own.

    Args:
        fn: the function (taking ``**values``); changed in place.
        params: its parameters.
        name: its ``__name__`` and ``__qualname__``.
        doc: its docstring.
        returns: its return annotation (none by default).
        module: its ``__module__`` (unchanged by default).

    Returns:
        ``fn``.
    """
    fn.__signature__ = inspect.Signature(params, return_annotation=returns)  # type: ignore[attr-defined]
    fn.__annotations__ = {p.name: p.annotation for p in params}
    if returns is not inspect.Signature.empty:
        fn.__annotations__["return"] = returns
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    if module is not None:
        fn.__module__ = module
    return fn


#: The parameter types an orchestrator can type natively (KFP inputs, Prefect parameters).
PARAMETER_TYPES = (str, int, float, bool, list, dict)


def reference_of(component: Any) -> str:
    """The reference another process (a pipeline step's container) resolves ``component``
    by: a reference string as it is; a function's ``module:qualname`` when importable by
    that name, else ``file.py:name`` (relative to the working directory when under it).

    Args:
        component: a component callable or a reference string.

    Returns:
        The reference, stripped.

    Raises:
        SpecError: a function that cannot be found again by name (nested, a lambda).

    >>> reference_of(" utils.echo ")
    'utils.echo'
    """
    if isinstance(component, str):
        return component.strip()
    fn, _ = component_of(component)
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module and module != "__main__" and "<" not in qualname and "." not in qualname:
        return f"{module}:{qualname}"
    source = inspect.getsourcefile(fn)
    if source is None or "<" in qualname or "." in qualname:
        raise SpecError(
            "component",
            None,
            f"{qualname or fn!r} cannot be found again in another process",
            fix='define it at the top level of a module and pass "pkg.module:fn" or "file.py:fn"',
        )
    rel = os.path.relpath(source)
    return f"{rel if not rel.startswith('..') else source}:{fn.__name__}"


def parameters_of(component: Any) -> list[ComponentParameter]:
    """The typed parameters of a component function (see :class:`ComponentParameter`), in
    order. A parameter whose annotation is not a plain type an orchestrator can carry is a
    :class:`~torchstep.SpecError` naming it.

    Args:
        component: a component callable or a reference string.

    Returns:
        One :class:`ComponentParameter` per parameter, in the function's order.

    Raises:
        SpecError: the component cannot be found, has a ``**kwargs`` parameter, or a
            parameter whose type an orchestrator cannot carry.
    """
    from torchx.specs.file_linter import get_fn_docstring

    fn, label = component_of(component)
    fn_eval = _with_evaluated_annotations(fn)
    _, descriptions = get_fn_docstring(fn)
    out = []
    for p in _parameters(fn_eval, label).values():
        if p.kind == p.VAR_KEYWORD:
            raise SpecError(
                f"component.{p.name}",
                None,
                f"{label}: **{p.name} cannot be typed",
                fix="give each parameter its own name",
            )
        variadic = p.kind == p.VAR_POSITIONAL
        kind, optional = _plain_type(p.annotation, f"component.{p.name}", label)
        if variadic:
            kind = list
        default = p.default
        if default is None:
            optional = True
        out.append(ComponentParameter(p.name, kind, default, optional, descriptions.get(p.name, ""), variadic))
    return out


def _plain_type(annotation: Any, field_path: str, label: str) -> tuple[type, bool]:
    if annotation is inspect.Parameter.empty:
        return str, False
    optional = False
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            raise SpecError(
                field_path,
                None,
                f"{label}: a union {annotation!r} cannot be typed",
                fix="use one type, or Optional[one type]",
            )
        optional, annotation = True, args[0]
        origin = typing.get_origin(annotation)
    base = origin or annotation
    for kind in PARAMETER_TYPES:
        if base is kind:
            return kind, optional
    if base in (collections.abc.Sequence, collections.abc.Mapping):
        return (list if base is collections.abc.Sequence else dict), optional
    raise SpecError(
        field_path,
        None,
        f"{label}: parameter type {annotation!r} cannot be passed by an orchestrator",
        fix="use str, int, float, bool, List[...] or Dict[...] (or Optional of one)",
    )


def static_values(
    component: Any, defaults: Mapping[str, Any] | None, *, target: str, builder: str
) -> tuple[list[tuple[ComponentParameter, Any]], Any]:
    """Each parameter of ``component`` with its value before run time — ``defaults[name]``,
    else the function's default (``[]`` for ``*args``, ``None`` for an Optional) — and the
    AppDef materialised with those values: what an orchestrator fixes when the pipeline is
    defined (image, resources, the retry budget). A required parameter with no value, a
    value of the wrong type or a name the component lacks is a :class:`~torchstep.SpecError`
    whose fix names ``builder`` (e.g. ``"component_from_fn"``).

    Args:
        component: a component callable or a reference string.
        defaults: parameter name → value fixed when the pipeline is defined; ``None``: none.
        target: the orchestrator's target, for the errors.
        builder: the adapter function the user called, named in the fix.

    Returns:
        ``(params, app)``: each parameter with its static value, and the AppDef built from them.

    Raises:
        UnknownParameterError: ``defaults`` names a parameter the component lacks.
        SpecError: a required parameter has no value, or a value has the wrong type.
    """
    _, label = component_of(component)
    params = parameters_of(component)
    names = {p.name for p in params}
    given = dict(defaults or {})
    for key in given:
        if key not in names:
            raise unknown_parameter(label, str(key), [p.name for p in params], field=f"defaults.{key}", target=target)
    out = []
    static: dict[str, Any] = {}
    for p in params:
        value = given.get(p.name, p.default)
        if value is inspect.Parameter.empty:
            if p.variadic:
                value = []
            elif p.optional:
                value = None
            else:
                raise SpecError(
                    f"component.{p.name}",
                    target,
                    f"has no default, and {target} fixes image, resources and retries before run time "
                    "from the AppDef materialised with the defaults",
                    fix=f"{builder}(..., defaults={{{p.name!r}: ...}})",
                )
        check_value(p, value, f"defaults.{p.name}", target)
        out.append((p, value))
        if value is not None:
            static[p.name] = value
    return out, materialize(component, static)


def check_value(p: ComponentParameter, value: Any, field_path: str, target: str | None) -> None:
    """Check that ``value`` fits parameter ``p`` (``None`` always does).

    Args:
        p: the parameter.
        value: the value to check (must also be JSON data).
        field_path: the error's field path (``defaults.lr``).
        target: the error's target; ``None``: any.

    Raises:
        SpecError: ``value`` is not of ``p``'s type, or not JSON data.
    """
    if value is None:
        return
    ok = isinstance(value, p.type) and not (p.type is not bool and isinstance(value, bool))
    if p.type is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if p.type is list and isinstance(value, tuple):
        ok = True
    if not ok:
        raise SpecError(field_path, target, f"{value!r} is not a {p.type.__name__}", fix=f"give a {p.type.__name__}")
    try:
        json.dumps(value)
    except (TypeError, ValueError) as e:
        raise SpecError(field_path, target, f"is not JSON data: {e}", fix="use plain values") from e
