"""``torchstep run``'s command line (its options and its final summary; the command itself
is :func:`torchstep.cli.run_main`): run an AppDef on this machine, retrying the whole app
itself (:func:`torchstep.steps.run_tries`).

    torchstep run REF [options] [-- component args]
    torchstep run --app FILE.json [options]

REF is anything :func:`torchstep.materialize` takes (``components/train.py:trainer``,
``dist.ddp``...). Options of the local target (``torchstep runopts local``) are given with
``-c key=value[,key=value]``. Unlike :func:`torchstep.run_local` called by an
orchestrator, ``torchstep run`` owns APPLICATION retries: ``retries`` defaults to the
AppDef's ``max_retries`` under the APPLICATION policy.

SIGTERM, SIGINT or SIGHUP stops every process within the grace period (a second signal
kills at once) and the run ends CANCELLED. Exit code: 0 when SUCCEEDED, the failure's
exit code (82: non-retryable) when FAILED, 128+signal when cancelled by a signal.

Example::

    torchstep run components/train.py:trainer -c grace_period=5 -- --replicas 2 --steps 100
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from torchstep.errors import SpecError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchstep run",
        description="run an AppDef on this machine under torchstep-agent (see docs/local.md)",
        epilog="component arguments go after --, e.g. torchstep run dist.ddp -- -j 2x2 --script train.py",
    )
    p.add_argument("ref", nargs="?", help="component: path/file.py:fn, package.module:fn or a TorchX builtin")
    p.add_argument("--app", metavar="FILE.json", help="run the AppDef in this JSON file instead of a component")
    p.add_argument(
        "-c",
        "--cfg",
        action="append",
        default=[],
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="run options (see `torchstep runopts local`); repeatable",
    )
    p.add_argument("--log-dir", help="where logs and results go (cfg log_dir)")
    p.add_argument(
        "--retries", type=int, help="retries of the whole app (default: the AppDef's APPLICATION max_retries)"
    )
    p.add_argument("--json", action="store_true", help="print the step result as JSON at the end")
    p.add_argument(
        "--live",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="live status table (default: when stdout is a terminal)",
    )
    return p


def parse_cfg(items: Sequence[str]) -> dict[str, Any]:
    """``["a=1,b=x", "c=2"]`` → ``{"a": "1", "b": "x", "c": "2"}`` (typed later by ``resolve``).

    Args:
        items: the ``--cfg`` values as given.

    Returns:
        Option name → text.

    Raises:
        SpecError: an item without ``=``.
    """
    out: dict[str, Any] = {}
    for item in items:
        for pair in item.split(","):
            if not pair.strip():
                continue
            key, sep, value = pair.partition("=")
            if not sep or not key.strip():
                raise SpecError("--cfg", "local", f"{pair!r} is not KEY=VALUE", fix="e.g. -c grace_period=5")
            out[key.strip()] = value.strip()
    return out


def summary(result: Any, *, retries: int = 0) -> str:
    """What happened, where the logs are — printed at the end of ``torchstep run``. The
    root cause is named by :func:`torchstep.result.root_cause_line`, as on every surface;
    a log or result file that could not be written is one ``warning:`` line each.

    Args:
        result: the run's :class:`~torchstep.StepResult`.
        retries: how many retries ``torchstep run`` had (said when they were used up).

    Returns:
        The text, several lines.
    """
    from torchstep.result import root_cause_line

    lines = [
        f"torchstep: {result.app_id} {result.state} in {result.duration_s:.1f} s "
        f"(attempt {result.attempts} of at most {retries + 1}, {result.restarts} restart(s), {len(result.ranks)} rank(s))"
    ]
    for rep in result.replicas:
        ranks = ",".join(str(r.rank) for r in rep.ranks) or "-"
        lines.append(
            f"  {rep.role} replica {rep.replica_id}: {rep.state} (exit {rep.exit_code}), ranks {ranks}, logs {rep.log_dir}"
        )
    rc = result.root_cause
    if rc is not None and not result.succeeded:
        where = (
            f"rank {rc.rank} ({rc.role} replica {rc.replica_id})"
            if rc.rank >= 0
            else f"{rc.role} replica {rc.replica_id}"
        )
        lines.append(f"  root cause: {where} exit {rc.exit_code}" + (f" ({rc.signal})" if rc.signal else ""))
        lines.append(f"    {root_cause_line(rc)}")
        if rc.log_file:
            lines.append(f"    log: {rc.log_file}")
    elif result.message and not result.succeeded:
        lines.append(f"  {result.message}")
    if result.outputs:
        lines.append(f"  outputs: {json.dumps(result.outputs, default=str)}")
    lines += [f"  warning: {w}" for w in result.warnings]
    path = f"{result.log_dir}/result.json"
    lost = any(w.startswith(f"result not written: {path}:") for w in result.warnings)
    lines.append(
        f"  result: {path}" + (" (not written: the disk is full or the file cannot be written)" if lost else "")
    )
    return "\n".join(lines)
