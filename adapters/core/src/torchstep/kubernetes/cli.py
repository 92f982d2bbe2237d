"""``torchstep render``: print an AppDef's Kubernetes objects as YAML for ``kubectl apply``.

    torchstep render REF [--namespace NS] [--image IMAGE] [--cfg KEY=VALUE ...] [--run-id ID] [-- component args]

``--cfg`` takes the options of ``torchstep runopts kubernetes`` (repeat it; lists are
``a;b``, mappings ``k:v;k2:v2``). ``--image`` replaces the image of every role (for a
component without an image argument; ``dist.ddp`` takes ``--image`` itself). The header
comments name the run's app id and the label selector that lists or deletes every object
of the run. An image known to lack torchstep (TorchX's default image) is a warning on
stderr: such pods would fail at once.

Example::

    torchstep render dist.ddp -n ml --cfg queue=team-a -- -j 2x8 --script train.py --image ghcr.io/acme/train:1 \\
        | kubectl apply -f -
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

from torchstep.errors import SpecError


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command.

    Args:
        argv: the arguments after the program name; ``None``: ``sys.argv[1:]``.

    Returns:
        The exit status (2 for a SpecError, printed to stderr).
    """
    import yaml

    from torchstep.components.builders import materialize
    from torchstep.kubernetes.render import render_app
    from torchstep.plan.cmdline import split_component_args

    opts, comp_args = split_component_args(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="torchstep render", description="print the Kubernetes objects of an AppDef")
    p.add_argument("ref", help="component: path/file.py:fn, package.module:fn or a TorchX builtin (dist.ddp)")
    p.add_argument("--namespace", "-n", default="default", help="namespace of every object (default: default)")
    p.add_argument("--cfg", action="append", default=[], metavar="KEY=VALUE", help="a kubernetes run option")
    p.add_argument("--run-id", help="the orchestrator's run id (object names end in a hash of it)")
    p.add_argument(
        "--image",
        help="the container image of every role (with torchstep[agent] in it), replacing the component's; "
        "a component's own image argument (dist.ddp: -- --image IMG) does the same",
    )
    ns = p.parse_args(opts)
    try:
        cfg = dict(_pair(item) for item in ns.cfg)
        if ns.run_id is not None:
            cfg["run_id"] = ns.run_id
        app = materialize(ns.ref, comp_args)
        if ns.image is not None:
            app = with_image(app, ns.image)
        rendered = render_app(app, namespace=ns.namespace, cfg=cfg)
    except SpecError as e:
        print(f"torchstep render: error: {e}", file=sys.stderr)
        return 2
    for w in rendered.plan.warnings:  # the objects are valid, but their pods would fail
        print(f"torchstep render: warning: {w.field}: {w.becomes}; fix: {w.fix}", file=sys.stderr)
    header = [
        f"# torchstep: app {rendered.plan.app_name!r}, run {rendered.app_id}, namespace {rendered.namespace}",
        f"# list or delete the run: kubectl -n {rendered.namespace} get jobs,pods,services -l {rendered.label_selector}",
        *(f"# note: {n}" for r in rendered.roles for n in r.notes),
    ]
    sys.stdout.write("\n".join(header) + "\n")
    sys.stdout.write(yaml.safe_dump_all(rendered.objects, sort_keys=False, explicit_start=True))
    return 0


def with_image(app: Any, image: str) -> Any:
    """``app`` with ``image`` as the image of every role (a copy; ``app`` is not changed).

    Args:
        app: the ``torchx.specs.AppDef``.
        image: the container image every role runs.

    Returns:
        The changed copy.

    >>> from torchx.specs import AppDef, Role
    >>> app = AppDef("a", [Role("r", image="x"), Role("s", image="y")])
    >>> [r.image for r in with_image(app, "ghcr.io/acme/train:1").roles], [r.image for r in app.roles]
    (['ghcr.io/acme/train:1', 'ghcr.io/acme/train:1'], ['x', 'y'])
    """
    if not image or not image.strip():
        raise SpecError("--image", "kubernetes", "is empty", fix="give an image reference, e.g. ghcr.io/acme/train:1")
    return dataclasses.replace(app, roles=[dataclasses.replace(r, image=image) for r in app.roles])


def _pair(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise SpecError("--cfg", "kubernetes", f"{item!r} is not KEY=VALUE", fix="e.g. --cfg queue=team-a")
    return key.strip(), value


if __name__ == "__main__":
    sys.exit(main())
