"""The cfg table check: the run options (``cfg``) of a step, checked against their target's
cfg table where they are written: when the component, task or operator is made, not when
the remote run fails. (TorchX's ``runopts`` class is what the tables are declared as.)

Every adapter calls :func:`check_cfg` with the target the options are for (KFP: ``local``
for a one-container step, ``kubernetes`` for a launcher step); the target's own option
table decides (``torchstep runopts local|kubernetes``), so an unknown key, a value of the
wrong type, a negative or NaN timeout or a namespace Kubernetes would refuse is one line
naming the option and the fix — and nothing is submitted.

Example::

    >>> check_cfg({"timeout": "600"}, "local")
    {'timeout': '600'}
    >>> check_cfg({"timeout": float("nan")}, "local")
    Traceback (most recent call last):
    ...
    torchstep.errors.SpecError: cfg['timeout'] (target 'local'): must be a positive finite number of seconds ...
    >>> check_cfg("timeout=60", "local")
    Traceback (most recent call last):
    ...
    torchstep.errors.SpecError: cfg (target 'local'): must be a mapping of run options, got str; fix: ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchstep.errors import SpecError

__all__ = ["check_cfg"]


def check_cfg(cfg: Any, target: str, *, orchestrated: bool = True, field: str = "cfg") -> dict[str, Any]:
    """``cfg`` checked against ``target``'s option table; a copy of it.

    Args:
        cfg: the run options as the user wrote them (``None``: none). A value ``None``
            stands for one only known later (an Airflow template): its key is still checked.
        target: ``local`` or ``kubernetes``.
        orchestrated: the options of an orchestrator's step, whose run id and APPLICATION
            retries the orchestrator owns (``run_id`` and local ``retries`` are refused).
        field: how the options are called in errors (``cfg``, ``step_cfg``).

    Returns:
        A plain ``dict`` copy of ``cfg``.

    Raises:
        SpecError: naming the option (``cfg['timeout']``) and the fix.
    """
    if cfg is None:
        return {}
    if not isinstance(cfg, Mapping):
        raise SpecError(
            field,
            target,
            f"must be a mapping of run options, got {type(cfg).__name__}",
            fix=f'e.g. {{"timeout": 3600}} (`torchstep runopts {target}` lists them)',
        )
    if target == "local":
        from torchstep.local.options import resolve as resolve_local

        opts: Any = resolve_local(cfg)
    elif target == "kubernetes":
        from torchstep.kubernetes.options import resolve as resolve_kubernetes

        opts = resolve_kubernetes(cfg)
    else:
        raise SpecError("target", None, f"unknown target {target!r}", fix="local or kubernetes")
    if orchestrated and opts.run_id is not None:
        raise SpecError(f"{field}['run_id']", target, "the orchestrator sets the run id of every try", fix="remove it")
    if orchestrated and getattr(opts, "retries", None):
        raise SpecError(
            f"{field}['retries']",
            target,
            "the orchestrator owns the step's retries",
            fix="remove it; set max_retries (RetryPolicy.APPLICATION) in the AppDef",
        )
    return dict(cfg)
