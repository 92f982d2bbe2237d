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
import sys
from collections.abc import Sequence

from torchstep.contract import INTERRUPTED_EXIT_CODE
from torchstep.errors import SpecError
from torchstep.plan.cmdline import split_component_args

#: subcommand -> "module:function" taking the remaining argv (lazy: no torch, no yaml until used)
SUBCOMMANDS = {
    "run": "torchstep.local.cli:main",
    "render": "torchstep.kubernetes.cli:main",
}


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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"explain": explain_main, "runopts": runopts_main, "builtins": builtins_main}
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
