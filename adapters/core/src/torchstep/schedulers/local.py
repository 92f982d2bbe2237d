"""``torchx run -s torchstep_local``: an AppDef on this machine under ``torchstep.run_local``,
detached from the ``torchx`` command that submitted it.

``schedule`` records the request in the per-user state directory
(:mod:`~torchstep.schedulers.records`) and starts a supervisor process in a session of its
own (``python -m torchstep.schedulers.supervisor``). The supervisor runs the app through
the local target — every replica under ``torchstep-agent``, logs and ``result.json`` under
``<log_dir>/<app_id>/`` as with ``torchstep run`` — and keeps a status file next to the
record. ``torchx status``, ``log``, ``cancel`` and ``list`` read those files, so they work
from any process of the same user. ``cancel`` sends the supervisor SIGTERM: every process
of the run is stopped within ``grace_period`` and the app ends CANCELLED.

The dry run makes every check the supervisor's run makes before it starts anything (the
options, the AppDef, this machine's GPUs, secret variables, mounts and directories), so a
submission that passes it does not fail after ``torchx run`` returned. ``torchx log`` gives
the app's lines: a replica of one process as it wrote them, one of several with each line's
``[role/rank]`` prefix; the agent's own informational lines are in ``agent.log``.

Example::

    torchx run -s torchstep_local utils.echo --msg hi
    torchx run -s torchstep_local -cfg grace_period=5 dist.ddp -j 2x2 --script train.py
    torchx log torchstep_local://torchx/echo-1a2b3c/echo/0
    torchx cancel torchstep_local://torchx/ddp-4d5e6f
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from torchx.schedulers.api import DescribeAppResponse
from torchx.specs import AppDef, AppDryRunInfo, ReplicaStatus, RoleStatus, runopts

from torchstep.errors import SpecError
from torchstep.files import open_private
from torchstep.result import FAILED, TERMINAL_STATES
from torchstep.schedulers import base, records

if TYPE_CHECKING:
    from torchstep.local.options import LocalOptions

BACKEND = "torchstep_local"
_FINAL = TERMINAL_STATES

# -- options: the local target's own (torchstep.local.options: one table, resolve() -> the
# frozen LocalOptions, cfg_table()), the same as `torchstep run` takes.


@dataclass
class LocalRequest:
    """What ``schedule`` starts: the AppDef as JSON data and the local target's options."""

    app_id: str
    app: dict[str, Any]
    cfg: dict[str, Any]
    log_dir: str
    explain: str

    def __str__(self) -> str:
        cfg = json.dumps(self.cfg, sort_keys=True, default=str)
        return (
            f"torchstep_local: {self.app_id} (detached), logs and result under {self.log_dir}/{self.app_id}/\n"
            f"cfg: {cfg}\n{self.explain}"
        )


def check_machine(app: AppDef, opts: LocalOptions, app_id: str) -> None:
    """What the supervisor's run checks on this machine before it starts anything (GPUs,
    secret variables, mounts, ports: :func:`torchstep.local.prepare.prepare`; the log and
    checkpoint directories when they exist), without creating anything."""
    from torchstep.files import UnsafePathError, check_private_dir, private_root
    from torchstep.local.prepare import prepare
    from torchstep.plan.planner import build_plan

    prepare(build_plan(app, "local"), opts, app_id=app_id)
    for field, path, check in (
        ("log_dir", opts.log_dir, private_root),
        ("cfg['checkpoint_dir']", opts.checkpoint_dir, check_private_dir),
    ):
        if path is not None and os.path.lexists(path):
            try:
                check(path)
            except UnsafePathError as e:
                raise SpecError(field, "local", f"{e.path}: {e.problem}", fix=e.fix) from None


def status_path(app_id: str) -> str:
    """The supervisor's status file of ``app_id`` (beside the record)."""
    return str(records.records_dir(BACKEND) / f"{records.check_app_id(app_id)}.status")


def read_status(app_id: str) -> dict[str, Any] | None:
    try:
        fd = os.open(status_path(app_id), os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    with os.fdopen(fd) as f:
        try:
            data = json.load(f)
        except ValueError:  # never half-written (atomic rename), but never trust a file blindly
            return None
    return data if isinstance(data, dict) else None


def process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (``/proc/<pid>/stat`` field 22), or ``None`` when
    it is gone: with the pid it names one process, never a recycled pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    if fields and fields[0] == b"Z":  # a zombie has finished
        return None
    return fields[19].decode() if len(fields) > 19 else None


class TorchstepLocalScheduler(base.TorchstepScheduler):
    """The ``torchstep_local`` TorchX scheduler (see the module docstring)."""

    BACKEND = BACKEND

    def _run_opts(self) -> runopts:
        from torchstep.local.options import cfg_table

        return cfg_table()  # type: ignore[no-any-return]

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, Any]) -> AppDryRunInfo:
        from torchstep.local.options import resolve
        from torchstep.plan.explain import explain

        given = {k: v for k, v in cfg.items() if v is not None}
        opts = resolve(given)  # SpecError naming cfg['<key>'] for a bad option
        payload = base.app_payload(app, "local")
        app_id = base.new_app_id(app.name)
        check_machine(app, opts, app_id)  # what the supervisor would find only after `torchx run` returned
        request = LocalRequest(app_id, payload, given, opts.log_dir, explain(app, target="local"))
        return AppDryRunInfo(request, str)

    def schedule(self, dryrun_info: AppDryRunInfo) -> str:
        req: LocalRequest = dryrun_info.request
        record = {"app": req.app, "cfg": req.cfg, "log_dir": req.log_dir, "submitted": time.time()}
        records.save(BACKEND, req.app_id, record)
        console = records.records_dir(BACKEND) / f"{req.app_id}.console"
        fd = open_private(console, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "torchstep.schedulers.supervisor", req.app_id],
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives `torchx run`, and its Ctrl-C
                close_fds=True,
            )
        finally:
            os.close(fd)
        record.update(pid=proc.pid, pid_start=process_start(proc.pid))
        records.save(BACKEND, req.app_id, record)
        proc.returncode = 0  # detached on purpose: never reaped (or warned about) here
        return req.app_id

    # -- reading state ---------------------------------------------------------------------
    def _state(self, app_id: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        record = self._record(app_id)
        return None if record is None else (record, read_status(app_id) or {})

    @staticmethod
    def _alive(record: Mapping[str, Any]) -> bool:
        pid = record.get("pid")
        return isinstance(pid, int) and process_start(pid) == record.get("pid_start") is not None

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        found = self._state(app_id)
        if found is None:
            return None
        record, status = found
        state = status.get("state") or "SUBMITTED"
        msg = status.get("message") or ""
        if state not in _FINAL and not self._alive(record):
            # looked again: the supervisor may have written its final status and exited
            status = read_status(app_id) or status
            state = status.get("state") or state
            if state not in _FINAL:
                state = FAILED
                msg = (
                    f"the torchstep_local supervisor (pid {record.get('pid')}) ended without a result "
                    "(killed?); its processes were stopped with it"
                )
        resp = base.response(app_id, base.app_state(state), msg)
        resp.num_restarts = int(status.get("restarts", 0))
        resp.roles_statuses = self._roles(status)
        resp.roles = base.roles_of(record.get("app"))
        resp.ui_url = status.get("run_dir")
        return resp

    @staticmethod
    def _roles(status: Mapping[str, Any]) -> list[RoleStatus]:
        roles: dict[str, list[ReplicaStatus]] = {}
        for key, rep_state in sorted((status.get("replicas") or {}).items()):
            role, _, rid = key.rpartition("/")
            roles.setdefault(role, []).append(
                ReplicaStatus(id=int(rid), state=base.app_state(rep_state), role=role, hostname="localhost")
            )
        return [RoleStatus(role=name, replicas=reps) for name, reps in roles.items()]

    def _cancel_existing(self, app_id: str) -> None:
        found = self._state(app_id)
        if found is None:
            return
        record, status = found
        if status.get("state") in _FINAL:
            return
        if self._alive(record):
            os.kill(int(record["pid"]), signal.SIGTERM)  # the supervisor stops the run: CANCELLED
            return
        # no supervisor: kill whatever of the run survived it (agents die with it anyway)
        from torchstep.agent.procs import tagged_pids

        for pid in tagged_pids(f"{app_id}."):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass

    # -- logs ---------------------------------------------------------------------------
    def _log_lines(
        self, app_id: str, role_name: str, k: int, *, since: datetime | None, until: datetime | None, tail: bool
    ) -> Iterable[str]:
        """The app's lines of replica ``k`` of ``role_name`` in the current attempt (its
        ``console.log`` without the agent's informational lines, which are in ``agent.log``
        beside it). A replica of one process gives its lines as they were written; one of
        several keeps each line's ``[role/rank]`` prefix, the only thing telling its ranks
        apart (as torchrun's own prefix does under TorchX's ``local_cwd``)."""
        found = self._state(app_id)
        if found is None:
            raise ValueError(f"{BACKEND}: no app {app_id!r} was submitted by this user on this machine")
        record = found[0]
        roles = {r["name"]: r for r in record["app"].get("roles", [])}
        if role_name not in roles:
            raise ValueError(f"{BACKEND}: app {app_id} has no role {role_name!r}; fix: use one of {sorted(roles)}")
        prefix = re.compile(rf"\[{re.escape(role_name)}/\d+\] ") if _one_rank(record["app"], role_name) else None

        def path() -> str:
            run_dir = (read_status(app_id) or {}).get("run_dir") or os.path.join(record["log_dir"], app_id)
            return os.path.join(run_dir, role_name, str(k), "console.log")

        current = {"path": path()}

        def fetch(cursor: int, final: bool) -> tuple[list[str], int]:
            p = path()
            if p != current["path"]:  # a retry started: its own logs, from the top
                current["path"], cursor = p, 0
            try:
                fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
            except FileNotFoundError:
                return [], cursor
            with os.fdopen(fd, "rb") as f:
                f.seek(cursor)
                data = f.read()
            cut = len(data) if final else data.rfind(b"\n") + 1  # whole lines while it runs
            lines = base.app_lines(data[:cut].decode("utf-8", "replace").splitlines(keepends=True))
            return [prefix.sub("", line, count=1) if prefix else line for line in lines], cursor + cut

        return base.follow(fetch, lambda: self.finished(app_id), tail=tail, until=until)


def _one_rank(app: Mapping[str, Any], role_name: str) -> bool:
    """Whether each replica of ``role_name`` in the recorded AppDef runs one process."""
    from torchstep.components.appjson import app_from_dict
    from torchstep.plan.planner import build_plan

    try:
        plan = build_plan(app_from_dict(app), "local")
    except ValueError:  # a record planned on submit always plans: keep the prefixes if not
        return False
    return any(r.name == role_name and r.nproc_per_node == 1 for r in plan.roles)


def create_scheduler(session_name: str, **kwargs: Any) -> TorchstepLocalScheduler:
    """The ``torchx.schedulers`` entry point of ``torchstep_local``."""
    return TorchstepLocalScheduler(session_name, **kwargs)
