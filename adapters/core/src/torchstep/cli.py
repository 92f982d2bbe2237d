"""The ``torchstep`` command line: :data:`HELP` says what it does (``torchstep --help``).

A misspelt subcommand is one line naming the closest one; options before ``--`` are
``torchstep``'s, component arguments go after it (``torchstep run REF -- --help`` lists a
component's parameters); a :class:`~torchstep.SpecError` is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from torchstep.contract import INTERRUPTED_EXIT_CODE
from torchstep.errors import SpecError
from torchstep.plan.cmdline import split_component_args
from torchstep.result import CANCELLED

#: What ``torchstep --help`` prints (plain text: no markup).
HELP = """\
usage: torchstep COMMAND [options] [-- component arguments]

commands:
  run REF [options] [-- ARGS]        run a component on this machine under torchstep-agent
                                     (or: run --app FILE.json)
  explain REF --target T [-- ARGS]   what each AppDef field becomes on target T
                                     (local, kubernetes or kfp)
  render REF -n NS [-- ARGS]         the Kubernetes objects of the kubernetes target, as YAML
  runopts local|kubernetes           the run options of a target (-c key=value)
  builtins                           TorchX's builtin components (dist.ddp, utils.echo, ...)
  --version                          the installed version

REF is a component: path/file.py:function, package.module:function or a TorchX
builtin such as dist.ddp. Its arguments go after --; `torchstep run REF -- --help`
lists them. `torchstep COMMAND --help` describes a command's options.

examples:
  torchstep run components/train.py:trainer -- --replicas 2
  torchstep run dist.ddp -- -j 1x2 --script train.py
  torchstep explain dist.ddp --target kfp -- -j 2x2 --script train.py
"""
#: Targets ``explain`` does not take, and what to use instead.
NOT_TARGETS = {
    "airflow": "Airflow steps run on the local or kubernetes target (AppDefOperator(target=...))",
    "prefect": "Prefect steps run on the local or kubernetes target (app_task(..., target=...))",
}
#: subcommand -> "module:function" taking the remaining argv (lazy: no torch, no yaml until used)
SUBCOMMANDS = {
    "render": "torchstep.kubernetes.cli:main",
}
#: What stops ``torchstep run`` (the first within the grace period, a second at once).
RUN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def explain_main(argv: Sequence[str]) -> int:
    from torchstep.components.builders import materialize
    from torchstep.plan.explain import notes_of, render_table
    from torchstep.plan.model import TARGETS
    from torchstep.plan.planner import plan_decisions

    opts, comp_args = split_component_args(argv)
    p = argparse.ArgumentParser(
        prog="torchstep explain",
        description="print the translation table of an AppDef",
        epilog="component arguments go after --; `torchstep explain REF --target T -- --help` lists them",
    )
    p.add_argument("ref", help="component: path/file.py:fn, package.module:fn or a TorchX builtin (dist.ddp)")
    p.add_argument("--target", "-t", required=True, metavar="{" + ",".join(TARGETS) + "}")
    ns = parse_options(p, opts, "torchstep explain REF --target T")
    if ns.target not in TARGETS:
        why = NOT_TARGETS.get(ns.target.lower(), "")
        p.error(
            f"argument --target: {ns.target!r} is not a target"
            + (f": {why}" if why else "")
            + f"; choose from {', '.join(TARGETS)}"
        )
    if component_help_asked(comp_args):
        return print_component_help(ns.ref, "explain", f"--target {ns.target} ")
    app = materialize(ns.ref, comp_args)
    decisions = plan_decisions(app, ns.target)
    notes = notes_of(app, ns.target)
    sys.stdout.write(render_table(decisions, app_name=getattr(app, "name", "?"), target=ns.target, notes=notes))
    return 2 if any(d.action == "rejected" for d in decisions) else 0


def parse_options(p: argparse.ArgumentParser, opts: Sequence[str], usage: str) -> argparse.Namespace:
    """``p.parse_args(opts)``, but words ``p`` does not know are an error that says that
    component arguments go after ``--`` (the usual slip: ``torchstep run REF --replicas 2``).

    Args:
        p: the command's parser.
        opts: the words before ``--``.
        usage: the command as the hint shows it (``torchstep run REF``).

    Returns:
        The parsed options.
    """
    ns, extra = p.parse_known_args(list(opts))
    if extra:
        p.error(
            f"unrecognized arguments: {' '.join(extra)} (component arguments go after '--': "
            f"{usage} -- {' '.join(extra)}; `{usage} -- --help` lists them)"
        )
    return ns


def component_help_asked(comp_args: Sequence[str]) -> bool:
    """Whether the component arguments ask for the component's help (``-- --help``)."""
    return bool(comp_args) and comp_args[0] in ("-h", "--help")


def print_component_help(ref: str, command: str, options: str = "") -> int:
    """Print the parameters of component ``ref`` (TorchX's own argument help) and how to
    pass them to ``torchstep COMMAND``; 0."""
    from torchstep.components.builders import component_help

    prefix = "torchx run <run args...> "
    lines = component_help(ref).splitlines()
    for i, line in enumerate(lines):  # TorchX's usage block, without the `torchx run` words
        if i == 0:
            lines[0] = line.replace(prefix, "", 1)
        elif not line.strip():
            break
        elif line.startswith(" " * len(prefix)):
            lines[i] = line[len(prefix) :]
    text = "\n".join(lines)
    print(f"{ref}: the component's parameters; pass them after --, e.g. torchstep {command} {ref} {options}-- ...")
    print(text.rstrip())
    return 0


#: torchrun flags that take no value (every other flag before the script takes one).
_TORCHRUN_BOOL_FLAGS = frozenset(
    {
        "--standalone",
        "--no-python",
        "--no_python",
        "--run-path",
        "--run_path",
        "--virtual-local-rank",
        "--virtual_local_rank",
    }
)


def script_of(entrypoint: str, args: Sequence[str]) -> str | None:
    """The Python script a role's command runs (``python train.py ...``, ``torchrun ...
    train.py``, TorchX's ``bash -c "torchrun ... train.py"``), or ``None`` when it runs
    a module, code, another program or a shell line it cannot read.

    Args:
        entrypoint: the role's entrypoint.
        args: the role's arguments.

    Returns:
        The script's path as written, or ``None``.

    >>> script_of("bash", ["-c", "torchrun --nnodes 1 --nproc_per_node 2 --tee 3 --role '' nope.py --lr 1"])
    'nope.py'
    >>> script_of("python", ["-u", "train.py"]), script_of("python", ["-m", "pkg.train"])
    ('train.py', None)
    """
    import os
    import shlex

    exe = os.path.basename(entrypoint)
    words = list(args)
    if exe in ("bash", "sh") and len(words) == 2 and words[0] == "-c":
        try:
            words = shlex.split(words[1])
        except ValueError:
            return None
        if not words or os.path.basename(words[0]) not in ("torchrun", "torchstep-agent"):
            return None
        exe, words = os.path.basename(words[0]), words[1:]
    if exe in ("torchrun", "torchstep-agent"):
        i = 0
        while i < len(words) and words[i].startswith("-"):
            flag = words[i]
            if flag in ("-m", "--module", "--no-python", "--no_python"):
                return None
            i += 1 if "=" in flag or flag in _TORCHRUN_BOOL_FLAGS else 2
        script = words[i] if i < len(words) else None
    elif exe.startswith("python"):
        script = next((w for w in words if not w.startswith("-")), None)
        if any(w in ("-m", "-c") for w in words[: words.index(script) if script else len(words)]):
            return None
    else:
        return None
    return script if script and script.endswith(".py") and "$" not in script else None


def check_scripts(plan: Any, ref: str | None = None) -> None:
    """Before anything starts on this machine: every role's Python script exists (in the
    role's working directory), so a typo is one line, not every rank's failure report.

    Args:
        plan: the local target's plan.
        ref: the component reference run (``path/file.py:fn``): when the script is found
            next to the component file or above it, the fix names that directory.

    Raises:
        SpecError: a role's script does not exist, naming the role and the directory.
    """
    import os

    for role in plan.roles:
        script = script_of(role.entrypoint, role.args)
        where = role.workdir or os.getcwd()
        if not script or os.path.isfile(os.path.join(where, script)):
            continue
        fix = "check the script's path (relative to that directory); nothing was started"
        path, sep, _ = (ref or "").rpartition(":")
        if sep and path.endswith(".py") and not os.path.isabs(script):
            here = os.path.dirname(os.path.abspath(path))
            found = next((d for d in [here, *_parents(here)] if os.path.isfile(os.path.join(d, script))), None)
            if found:
                fix = (
                    f"run torchstep from {found}, where {script} is (a script's path is relative to the "
                    "working directory); nothing was started"
                )
        raise SpecError(
            f"roles[{role.index}].args",
            "local",
            f"role {role.name!r} runs the script {script!r}, which does not exist in {where}",
            fix=fix,
        )


def _parents(path: str) -> list[str]:
    import os

    out = []
    while os.path.dirname(path) != path:
        path = os.path.dirname(path)
        out.append(path)
    return out


def runopts_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="torchstep runopts", description="print the options of a target")
    p.add_argument("target", choices=["local", "kubernetes"])
    ns = p.parse_args(list(argv))
    module = importlib.import_module(f"torchstep.{ns.target}")
    print(module.cfg_table())
    return 0


def builtins_main(argv: Sequence[str]) -> int:
    from torchstep.components.builders import builtin_names

    argparse.ArgumentParser(prog="torchstep builtins", description=builtins_main.__doc__).parse_args(list(argv))
    for name in builtin_names():
        print(name)
    return 0


builtins_main.__doc__ = "list TorchX's builtin components (each is a REF: torchstep run dist.ddp -- --help)"


def one_line(text: str) -> str:
    """``text`` on one line (a TorchX message may span several).

    >>> one_line("has validation errors: \\n  a\\n  b")
    'has validation errors: a b'
    """
    return " ".join(text.split())


def version_line(prog: str) -> str:
    """What ``--version`` prints: the program and the version of the installed ``torchstep``
    distribution (read from its metadata; the version is written once, in pyproject.toml).

    Example::

        >>> version_line("torchstep").split()[0]
        'torchstep'
    """
    from importlib.metadata import version

    return f"{prog} {version('torchstep')}"


def run_main(argv: Sequence[str]) -> int:
    """``torchstep run`` (its options and summary: :mod:`torchstep.local.cli`): the AppDef on
    this machine, the whole app retried by :func:`torchstep.steps.run_tries` (``retries``:
    the AppDef's APPLICATION ``max_retries`` unless given). Exit code: 0 when SUCCEEDED, the
    failure's exit code (82: non-retryable) when FAILED, 128+signal when a signal stopped it."""
    from torchstep.local.cli import parse_cfg, parser, summary
    from torchstep.local.options import resolve
    from torchstep.local.status import make_display
    from torchstep.plan.planner import build_plan
    from torchstep.steps import run_tries, stop_on_signals

    opts_argv, comp_args = split_component_args(list(argv))
    ns = parse_options(
        parser(), opts_argv, f"torchstep run {next((a for a in opts_argv if not a.startswith('-')), 'REF')}"
    )
    if ns.ref and component_help_asked(comp_args):
        return print_component_help(ns.ref, "run")
    if bool(ns.ref) == bool(ns.app):
        raise SpecError("REF", "local", "give a component reference or --app FILE.json (one of them)", fix="see --help")
    if ns.app:
        from torchstep.local.appfile import load_app

        if comp_args:
            raise SpecError(
                "--app", "local", "component arguments make no sense with --app", fix="drop what follows --"
            )
        app = load_app(ns.app)
    else:
        from torchstep.components.builders import materialize

        app = materialize(ns.ref, comp_args)
    cfg = parse_cfg(ns.cfg)
    if ns.retries is not None:
        cfg["retries"] = ns.retries
    if ns.log_dir is not None:
        cfg["log_dir"] = ns.log_dir
    plan = build_plan(app, "local")
    check_scripts(plan, ns.ref)
    opts = resolve(cfg)
    retries = opts.retries if opts.retries is not None else plan.step_retry.count
    cancel = threading.Event()
    display = make_display(show_output=opts.tee, live=ns.live)
    with stop_on_signals(cancel, RUN_SIGNALS) as received:
        try:
            result = run_tries(
                plan, attempt=cfg.pop("run_id", None), cfg=cfg, retries=retries, cancel=cancel, display=display
            )
        except KeyboardInterrupt:
            return 128 + (received[0] if received else signal.SIGINT)
        finally:
            display.close()
    print(result.to_json() if ns.json else summary(result, retries=retries))
    if result.succeeded:
        return 0
    if result.state == CANCELLED:
        return 128 + (received[0] if received else signal.SIGTERM)
    code = result.exit_code
    return code if isinstance(code, int) and 0 < code < 256 else 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"explain": explain_main, "run": run_main, "runopts": runopts_main, "builtins": builtins_main}
    if argv == ["--version"]:
        print(version_line("torchstep"))
        return 0
    if argv and argv[0] in ("-h", "--help"):
        print(HELP, end="")
        return 0
    if not argv:
        print(HELP, end="", file=sys.stderr)
        return 2
    if argv[0] not in commands and argv[0] not in SUBCOMMANDS:
        known = sorted([*commands, *SUBCOMMANDS])
        close = difflib.get_close_matches(argv[0], known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else f"; commands: {', '.join(known)}"
        print(f"torchstep: unknown command {argv[0]!r}{hint}; see torchstep --help", file=sys.stderr)
        return 2
    cmd, rest = argv[0], argv[1:]
    try:
        if cmd in commands:
            return commands[cmd](rest)
        module, _, fn = SUBCOMMANDS[cmd].partition(":")
        return int(getattr(importlib.import_module(module), fn)(rest) or 0)
    except SpecError as e:
        print(f"torchstep {cmd}: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before the run started (a component function, an import)
        print(f"torchstep {cmd}: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
