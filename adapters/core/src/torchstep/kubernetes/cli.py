"""``torchstep render``: print an AppDef's Kubernetes objects as YAML for ``kubectl apply``.

    torchstep render REF [--namespace NS] [--cfg KEY=VALUE ...] [--run-id ID] [-- component args]

``--cfg`` takes the options of ``torchstep runopts kubernetes`` (repeat it; lists are
``a;b``, mappings ``k:v;k2:v2``). The header comments name the run's app id and the label
selector that lists or deletes every object of the run.

Example::

    torchstep render dist.ddp -n ml --cfg queue=team-a -- -j 2x8 --script train.py | kubectl apply -f -
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from torchstep.errors import SpecError


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (2 for a SpecError, printed to stderr)."""
    import yaml

    from torchstep.components.materialize import materialize
    from torchstep.kubernetes.render import render_app
    from torchstep.plan.cmdline import split_component_args

    opts, comp_args = split_component_args(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="torchstep render", description="print the Kubernetes objects of an AppDef")
    p.add_argument("ref", help="component: path/file.py:fn, package.module:fn or a TorchX builtin (dist.ddp)")
    p.add_argument("--namespace", "-n", default="default", help="namespace of every object (default: default)")
    p.add_argument("--cfg", action="append", default=[], metavar="KEY=VALUE", help="a kubernetes run option")
    p.add_argument("--run-id", help="the orchestrator's run id (object names end in a hash of it)")
    ns = p.parse_args(opts)
    try:
        cfg = dict(_pair(item) for item in ns.cfg)
        if ns.run_id is not None:
            cfg["run_id"] = ns.run_id
        rendered = render_app(materialize(ns.ref, comp_args), namespace=ns.namespace, cfg=cfg)
    except SpecError as e:
        print(f"torchstep render: error: {e}", file=sys.stderr)
        return 2
    header = [
        f"# torchstep: app {rendered.plan.app_name!r}, run {rendered.app_id}, namespace {rendered.namespace}",
        f"# list or delete the run: kubectl -n {rendered.namespace} get jobs,pods,services -l {rendered.label_selector}",
        *(f"# note: {n}" for r in rendered.roles for n in r.notes),
    ]
    sys.stdout.write("\n".join(header) + "\n")
    sys.stdout.write(yaml.safe_dump_all(rendered.objects, sort_keys=False, explicit_start=True))
    return 0


def _pair(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise SpecError("--cfg", "kubernetes", f"{item!r} is not KEY=VALUE", fix="e.g. --cfg queue=team-a")
    return key.strip(), value


if __name__ == "__main__":
    sys.exit(main())
