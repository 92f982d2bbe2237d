"""The ``torchstep`` command line.

    torchstep explain REF --target T [-- component args]
    torchstep run REF [options] [-- component args]      (or --app FILE.json)
    torchstep render REF --namespace NS [-- component args]
    torchstep runopts {local,kubernetes}
    torchstep builtins
    torchstep --version

REF is anything :func:`torchstep.materialize` takes: ``path/file.py:fn``,
``package.module:fn`` or a TorchX builtin such as ``dist.ddp``.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from collections.abc import Sequence

from torchstep.contract import INTERRUPTED_EXIT_CODE
from torchstep.errors import SpecError
from torchstep.plan.cmdline import split_component_args
from torchstep.result import CANCELLED

#: subcommand -> "module:function" taking the remaining argv (lazy: no torch, no yaml until used)
SUBCOMMANDS = {
    "render": "torchstep.kubernetes.cli:main",
}
#: What stops ``torchstep run`` (the first within the grace period, a second at once).
RUN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def explain_main(argv: Sequence[str]) -> int:
    from torchstep.components.materialize import materialize
    from torchstep.plan.explain import notes_of, render_table
    from torchstep.plan.model import TARGETS
    from torchstep.plan.planner import plan_decisions

    opts, comp_args = split_component_args(argv)
    p = argparse.ArgumentParser(prog="torchstep explain", description="print the translation table of an AppDef")
    p.add_argument("ref", help="component: path/file.py:fn, package.module:fn or a TorchX builtin (dist.ddp)")
    p.add_argument("--target", "-t", required=True, choices=TARGETS)
    ns = p.parse_args(opts)
    app = materialize(ns.ref, comp_args)
    decisions = plan_decisions(app, ns.target)
    notes = notes_of(app, ns.target)
    sys.stdout.write(render_table(decisions, app_name=getattr(app, "name", "?"), target=ns.target, notes=notes))
    return 2 if any(d.action == "rejected" for d in decisions) else 0


def runopts_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="torchstep runopts", description="print the options of a target")
    p.add_argument("target", choices=["local", "kubernetes"])
    ns = p.parse_args(list(argv))
    module = importlib.import_module(f"torchstep.{ns.target}")
    print(module.runopts())
    return 0


def builtins_main(argv: Sequence[str]) -> int:
    from torchx.specs.finder import get_components

    for name in sorted(get_components()):
        print(name)
    return 0


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
    ns = parser().parse_args(opts_argv)
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
        from torchstep.components.materialize import materialize

        app = materialize(ns.ref, comp_args)
    cfg = parse_cfg(ns.cfg)
    if ns.retries is not None:
        cfg["retries"] = ns.retries
    if ns.log_dir is not None:
        cfg["log_dir"] = ns.log_dir
    plan = build_plan(app, "local")
    opts = resolve(cfg)
    retries = opts.retries if opts.retries is not None else plan.step_retry.count
    cancel = threading.Event()
    display = make_display(show_output=opts.tee, live=ns.live)
    with stop_on_signals(cancel, RUN_SIGNALS) as received:
        try:
            result = run_tries(plan, attempt=cfg.pop("run_id", None), cfg=cfg, retries=retries, cancel=cancel,
                               display=display)  # fmt: skip
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
    if not argv or argv[0] in ("-h", "--help") or (argv[0] not in commands and argv[0] not in SUBCOMMANDS):
        print(__doc__.strip())
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    cmd, rest = argv[0], argv[1:]
    try:
        if cmd in commands:
            return commands[cmd](rest)
        module, _, fn = SUBCOMMANDS[cmd].partition(":")
        return int(getattr(importlib.import_module(module), fn)(rest) or 0)
    except SpecError as e:
        print(f"torchstep {cmd}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before the run started (a component function, an import)
        print(f"torchstep {cmd}: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
