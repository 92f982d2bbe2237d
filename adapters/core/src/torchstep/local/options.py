"""The local target's run options, declared as a TorchX ``runopts`` (typed, with defaults
and help; ``torchstep runopts local`` prints them).

Example::

    >>> from torchstep.local.options import resolve
    >>> opts = resolve({"grace_period": 5})
    >>> (opts.grace_period, opts.cpu_affinity)
    (5.0, True)
    >>> resolve({"grace_perod": 5})
    Traceback (most recent call last):
    ...
    torchstep.errors.SpecError: cfg['grace_perod'] (target 'local'): unknown option; fix: use one of: ...
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchstep.errors import SpecError

TARGET = "local"


def default_log_dir() -> str:
    """``<temp dir>/torchstep`` (as TorchX's local scheduler, logs go to the temp dir)."""
    return os.path.join(tempfile.gettempdir(), "torchstep")


# name -> (type, default, help). The single source for runopts() and LocalOptions.
_OPTS: dict[str, tuple[Any, Any, str]] = {
    "log_dir": (
        str,
        None,
        "where logs and results go: <log_dir>/<app_id>/<role>/<replica>/ (default: <temp dir>/torchstep)",
    ),
    "run_id": (
        str,
        None,
        "the orchestrator's run id: the app id becomes <app>-<hash of it>, as on the kubernetes target "
        "(the same id gives the same app id, so make it unique per attempt); default: <app>-<random id>",
    ),
    "retries": (
        int,
        None,
        "retries of the whole app by torchstep itself. Default: the AppDef's APPLICATION max_retries "
        "for `torchstep run`, 0 for run_local (the calling orchestrator retries)",
    ),
    "retry_delay": (float, None, "seconds between those retries (default: role metadata retry_delay, else 1)"),
    "grace_period": (float, 10.0, "seconds between SIGTERM and SIGKILL when a run is stopped or cancelled"),
    "timeout": (float, None, "seconds before the whole run is stopped and FAILED (default: app metadata)"),
    "gpus": (
        list,
        None,
        "GPU ids the run may use, ';'-separated (default: CUDA_VISIBLE_DEVICES if set, else every GPU "
        "the NVIDIA driver lists); each replica gets its own CUDA_VISIBLE_DEVICES slice",
    ),
    "cpu_affinity": (bool, True, "pin each replica to resource.cpu cores of its own and set OMP_NUM_THREADS"),
    "tee": (bool, True, "copy every process's output to stdout, prefixed [role/rank]"),
}


def runopts() -> Any:
    """The local target's options as a ``torchx.specs.runopts``.

    >>> print(runopts())  # doctest: +ELLIPSIS
        usage:
            [log_dir=LOG_DIR],...
    """
    from typing import List  # noqa: UP035 - torchx's runopts wants typing.List

    from torchx.specs import runopts as RunOpts

    opts = RunOpts()
    for name, (typ, default, help_) in _OPTS.items():
        opts.add(name, type_=List[str] if typ is list else typ, default=default, help=help_)  # noqa: UP006
    return opts


@dataclass(frozen=True)
class LocalOptions:
    """Resolved options of one local run (see :func:`runopts` for the meaning of each)."""

    log_dir: str
    run_id: str | None = None
    retries: int | None = None
    retry_delay: float | None = None
    grace_period: float = 10.0
    timeout: float | None = None
    gpus: tuple[str, ...] | None = None
    cpu_affinity: bool = True
    tee: bool = True


def resolve(cfg: Mapping[str, Any] | None, *, log_dir: str | None = None) -> LocalOptions:
    """Check ``cfg`` against :func:`runopts` and fill in defaults; ``log_dir`` (the
    ``run_local`` argument) wins over ``cfg["log_dir"]``. Bad keys or values raise a
    :class:`~torchstep.SpecError` naming ``cfg['<key>']``.
    """
    cfg = dict(cfg or {})
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        field = f"cfg[{key!r}]"
        if key not in _OPTS:
            raise SpecError(field, TARGET, "unknown option", fix=f"use one of: {', '.join(_OPTS)}")
        typ, _, _ = _OPTS[key]
        if value is None:
            continue
        out[key] = _convert(field, typ, value)
    if log_dir is not None:
        out["log_dir"] = _convert("log_dir", str, log_dir)
    out["log_dir"] = os.path.abspath(out.get("log_dir") or default_log_dir())
    if out.get("gpus") is not None:
        out["gpus"] = tuple(out["gpus"])
    for key in ("grace_period", "timeout"):
        if key in out and not out[key] > 0:
            raise SpecError(f"cfg[{key!r}]", TARGET, f"must be a positive number, got {out[key]}", fix="e.g. 10")
    if "run_id" in out and (not out["run_id"].strip() or not out["run_id"].isprintable()):
        raise SpecError(
            "cfg['run_id']", TARGET, "must be a printable, non-blank string", fix="e.g. the orchestrator's run id"
        )
    for key in ("retries", "retry_delay"):
        if key in out and out[key] < 0:
            raise SpecError(f"cfg[{key!r}]", TARGET, f"must not be negative, got {out[key]}", fix="e.g. 2")
    return LocalOptions(**out)


def _convert(field: str, typ: Any, value: Any) -> Any:
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
    elif typ is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif typ is str:
        if isinstance(value, str) and value and "\x00" not in value:
            return value
    elif typ is list:
        if isinstance(value, str):
            return [v.strip() for v in value.replace(",", ";").split(";") if v.strip()]
        if isinstance(value, list | tuple) and all(isinstance(v, str | int) for v in value):
            return [str(v) for v in value]
    name = "a list of strings" if typ is list else f"a {typ.__name__}"
    raise SpecError(field, TARGET, f"must be {name}, got {value!r}", fix="see `torchstep runopts local`")
