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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchstep.errors import SpecError
from torchstep.files import state_root
from torchstep.plan.limits import MAX_RETRIES, MAX_SECONDS
from torchstep.plan.options import convert, parse_options, to_runopts

TARGET = "local"


def default_log_dir() -> str:
    """The per-user state directory (:func:`torchstep.files.state_root`):
    ``$XDG_STATE_HOME/torchstep``, else ``~/.local/state/torchstep``, else
    ``$TMPDIR/torchstep-<uid>``. Never a shared, predictable directory: logs hold
    tracebacks and values derived from the environment."""
    return str(state_root())


# name -> (type, default, help). The single source for cfg_table() and LocalOptions.
_OPTS: dict[str, tuple[Any, Any, str]] = {
    "log_dir": (
        str,
        None,
        "where logs and results go: <log_dir>/<app_id>/<role>/<replica>/ (default: $XDG_STATE_HOME/torchstep, "
        "else ~/.local/state/torchstep; run directories 0700, files 0600)",
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
    "checkpoint_dir": (
        str,
        None,
        "a directory kept across tries (created 0700; a symlink or another user's directory is refused): "
        "every rank gets it as TORCHSTEP_CHECKPOINT_DIR and the newest checkpoint in it as "
        "TORCHSTEP_LAST_CHECKPOINT (torchstep.last_checkpoint()), so a retried step resumes",
    ),
    "inherit_env": (
        bool,
        True,
        "the step inherits this process's environment (true), or gets only PATH, HOME, LANG, LC_*, TZ, "
        "TMPDIR, USER, CUDA_VISIBLE_DEVICES and TORCHSTEP_ZYGOTE from it plus the AppDef's own env (false: "
        "what the generic DAG and flow use for AppDefs from the network)",
    ),
}


def cfg_table() -> Any:
    """The local target's options as a ``torchx.specs.runopts``.

    >>> print(cfg_table())  # doctest: +ELLIPSIS
        usage:
            [log_dir=LOG_DIR],...
    """
    return to_runopts(_OPTS)


@dataclass(frozen=True)
class LocalOptions:
    """Resolved options of one local run (:func:`cfg_table` prints the same help).

    Args:
        log_dir: where logs and results go (``<log_dir>/<app_id>/<role>/<replica>/``).
        run_id: the orchestrator's run id: the app id becomes ``<app>-<hash of it>``;
            ``None``: ``<app>-<random id>``.
        retries: retries of the whole app by torchstep itself; ``None``: the caller's default.
        retry_delay: seconds between those retries; ``None``: the role's ``retry_delay``, else 1.
        grace_period: seconds between SIGTERM and SIGKILL when a run is stopped.
        timeout: seconds before the whole run is stopped and FAILED; ``None``: the app's metadata.
        gpus: GPU ids the run may use; ``None``: ``CUDA_VISIBLE_DEVICES`` or every GPU.
        cpu_affinity: pin each replica to cores of its own and set ``OMP_NUM_THREADS``.
        tee: copy every process's output to stdout, prefixed ``[role/rank]``.
        checkpoint_dir: a directory kept across tries (``TORCHSTEP_CHECKPOINT_DIR``); ``None``: none.
        inherit_env: whether the step inherits this process's environment (else only a
            few variables plus the AppDef's env).
    """

    log_dir: str
    run_id: str | None = None
    retries: int | None = None
    retry_delay: float | None = None
    grace_period: float = 10.0
    timeout: float | None = None
    gpus: tuple[str, ...] | None = None
    cpu_affinity: bool = True
    tee: bool = True
    checkpoint_dir: str | None = None
    inherit_env: bool = True


def resolve(cfg: Mapping[str, Any] | None, *, log_dir: str | None = None) -> LocalOptions:
    """Check ``cfg`` against :func:`cfg_table` and fill in defaults; ``log_dir`` (the
    ``run_local`` argument) wins over ``cfg["log_dir"]``.

    Args:
        cfg: option name → value (typed, or text); ``None``: all defaults.
        log_dir: the log directory; ``None``: ``cfg["log_dir"]``, else :func:`default_log_dir`.

    Returns:
        The resolved options.

    Raises:
        SpecError: an unknown key or a bad value, naming ``cfg['<key>']``.
    """
    out = parse_options(cfg, _OPTS, target=TARGET)
    if log_dir is not None:
        out["log_dir"] = convert("log_dir", str, log_dir, target=TARGET)
    out["log_dir"] = os.path.abspath(out.get("log_dir") or default_log_dir())
    if out.get("gpus") is not None:
        out["gpus"] = tuple(out["gpus"])
    for key in ("grace_period", "timeout", "retry_delay"):
        if key not in out:
            continue
        low_ok = out[key] >= 0 if key == "retry_delay" else out[key] > 0
        if not (low_ok and out[key] <= MAX_SECONDS):  # also refuses nan and inf
            kind = "non-negative" if key == "retry_delay" else "positive"
            raise SpecError(
                f"cfg[{key!r}]",
                TARGET,
                f"must be a {kind} finite number of seconds (at most {MAX_SECONDS}), got {out[key]}",
                fix="e.g. 10",
            )
    if "run_id" in out and (not out["run_id"].strip() or not out["run_id"].isprintable()):
        raise SpecError(
            "cfg['run_id']", TARGET, "must be a printable, non-blank string", fix="e.g. the orchestrator's run id"
        )
    if "checkpoint_dir" in out:
        path = out["checkpoint_dir"]
        if not path.strip() or not path.isprintable():
            raise SpecError(
                "cfg['checkpoint_dir']",
                TARGET,
                "must be a printable, non-blank path",
                fix="e.g. /data/ckpt/my-job (the same for every try of the step)",
            )
        out["checkpoint_dir"] = os.path.abspath(os.path.expanduser(path))
    if "retries" in out and not 0 <= out["retries"] <= MAX_RETRIES:
        raise SpecError("cfg['retries']", TARGET, f"must be 0..{MAX_RETRIES}, got {out['retries']}", fix="e.g. 2")
    return LocalOptions(**out)
