"""The generic flow behind ``torchx run -s prefect``: one Prefect flow that runs any AppDef.

The ``prefect`` TorchX scheduler (:mod:`torchstep.schedulers.prefect`) submits an
AppDef as a flow run of a deployment of this flow, ``torchstep-torchx``, with the AppDef as
JSON data (``torchstep.components.appjson``) in the ``app`` parameter. On arrival the flow checks
the AppDef again and against the deployment's policy (:mod:`torchstep.policy`: the file
``serve --policy`` or ``TORCHSTEP_POLICY`` names, else ``torchstep.policy.DEFAULT``): bad data
or a field the policy does not allow fails the flow run at once, without retry, with a
``SpecError`` naming the field, before anything is created. Then it runs the AppDef as one
step through :func:`~torchstep_prefect.app_task`: retries from the AppDef, timeouts,
cancellation that stops every process, each rank's lines in the run's log, the ranks table
and outputs artifacts. On the local target the step does not inherit the flow run's
environment (``inherit_env=False``). Whoever may create flow runs of the deployment chooses
what runs (docs/security.md).

Serve it (a long-lived process that runs the flow runs on this machine)::

    PREFECT_API_URL=http://127.0.0.1:4200/api python -m torchstep_prefect.torchx_flow serve --name torchx \
        --policy /etc/torchstep/policy.toml

or deploy it to a work pool (its flow-run image needs ``torchstep-prefect`` and
``torchstep[agent]``; the entrypoint is the module path, found in any image that has them)::

    from prefect.deployments.runner import EntrypointType
    from torchstep_prefect.torchx_flow import torchx_app

    torchx_app.deploy(name="torchx", work_pool_name="gpu-pool", image="ghcr.io/acme/train:1",
                      build=False, push=False, entrypoint_type=EntrypointType.MODULE_PATH)

then ``torchx run -s prefect utils.echo --msg hi``.

No ``from __future__ import annotations`` here: Prefect reads the flow's parameter types.
"""

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from prefect import flow
from torchstep.adapter import ENV_POLICY, Policy, PolicyError, resolve_policy, untrusted_cfg

#: The flow's name: deployments are ``torchstep-torchx/<deployment name>``.
FLOW_NAME = "torchstep-torchx"
#: The deployment name ``serve`` uses by default (the scheduler's default ``deployment``).
DEPLOYMENT_NAME = "torchx"


def load_app(
    data: Any, target: str, policy: Policy | str | None = None, *, cfg: Mapping[str, Any] | None = None
) -> Any:
    """The ``torchx.specs.AppDef`` of the JSON data ``data``, checked for ``target`` and
    against the deployment's policy.

    Args:
        data: the AppDef as JSON data (``torchstep.components.appjson``).
        target: ``local`` or ``kubernetes``.
        policy: a :class:`torchstep.policy.Policy` or the path of its TOML file; ``None``:
            the file ``TORCHSTEP_POLICY`` names, else ``torchstep.policy.DEFAULT``.
        cfg: the run options sent with it (checked by the policy too).

    Returns:
        The AppDef.

    Raises:
        SpecError: a bad field (``app.roles[1].entrypoint``).
        torchstep.policy.PolicyError: a field the policy does not allow.

    Example::

        app = load_app(parameters["app"], "kubernetes", cfg={"namespace": "ml"})
    """
    return _received(data, target, policy, cfg=cfg)[0]


def _received(
    data: Any, target: str, policy: Policy | str | None = None, *, cfg: Mapping[str, Any] | None = None
) -> tuple[Any, Any]:
    """The AppDef of ``data`` and its plan for ``target``, checked (see :func:`load_app`)."""
    from torchstep.adapter import step_received

    conf = {"app": data, "target": target, "cfg": cfg or {}}
    app, plan, _, _ = step_received(conf, policy, field=None, what="the flow run", scheduler="prefect")
    return app, plan


@flow(name=FLOW_NAME, retries=0, persist_result=False, validate_parameters=True)
def torchx_app(app: dict[str, Any], target: str = "local", cfg: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run a TorchX AppDef (JSON data, as ``torchx run -s prefect`` sends it) as one
    torchstep step; returns the step result (state, exit codes, root cause, outputs).

    Args:
        app: the AppDef as JSON data (torchstep.components.appjson)
        target: where the step runs: local (this flow run's machine) or kubernetes (Jobs)
        cfg: the target's run options (torchstep runopts local|kubernetes)
    """
    from torchstep.adapter import StepTask

    from torchstep_prefect.tasks import TARGETS, task_of

    app_def, plan = _received(app, target, cfg=cfg)  # checked and planned once, on arrival
    step = task_of(StepTask(app_def, target=target, cfg=untrusted_cfg(target, cfg), targets=TARGETS, plan=plan))
    result: dict[str, Any] = step()
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m torchstep_prefect.torchx_flow serve [--name torchx] [--limit N] [--policy FILE]``.

    ``--policy FILE`` is read at once (a bad file: exit status 2, nothing served) and handed
    to every flow run as ``TORCHSTEP_POLICY``."""
    parser = argparse.ArgumentParser(
        prog="python -m torchstep_prefect.torchx_flow",
        description=f"Serve the {FLOW_NAME} flow that `torchx run -s prefect` submits to "
        "(flow runs execute on this machine; PREFECT_API_URL names the server).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the flow until interrupted")
    serve.add_argument("--name", default=DEPLOYMENT_NAME, help=f"deployment name (default {DEPLOYMENT_NAME})")
    serve.add_argument("--limit", type=int, default=None, help="flow runs at once (default: Prefect's)")
    serve.add_argument(
        "--policy",
        default=None,
        metavar="FILE",
        help=f"what a flow run's AppDef may do (TOML, docs/security.md; default: ${ENV_POLICY}, "
        "else torchstep.policy.DEFAULT)",
    )
    args = parser.parse_args(argv)
    if args.policy is not None:  # the flow runs (child processes) read it from their environment
        os.environ[ENV_POLICY] = os.path.abspath(args.policy)
    try:
        resolve_policy()
    except PolicyError as e:
        print(f"torchx_flow serve: error: {e}", file=sys.stderr)
        return 2
    named = os.environ.get(ENV_POLICY, "").strip()
    print(
        f"torchx_flow: every flow run is checked against the policy {named or 'torchstep.policy.DEFAULT'}", flush=True
    )
    from prefect.deployments.runner import EntrypointType

    from torchstep_prefect.torchx_flow import torchx_app as served  # its real module, also under -m

    # the entrypoint by module path: flow runs load it from any working directory
    served.serve(name=args.name, limit=args.limit, entrypoint_type=EntrypointType.MODULE_PATH)
    return 0


if __name__ == "__main__":
    sys.exit(main())
