"""The ``kfp`` soak surface's pipeline driver: one pipeline whose one step is the soak AppDef
(tools/soak/component.py) made a KFP component by ``torchstep_kfp.component_from_app``, run
with ``kfp.local`` (SubprocessRunner), as a user runs it: ``python tools/soak/kfp_pipeline.py
--out driver.json ...``. The step's faults come from this process's ``SOAK_*`` environment
(kfp.local's task process inherits it, and the step's agents and workers inherit theirs).

kfp.local runs the step as this process -> ``sh -ec <launch script>`` -> ``python -m
kfp.dsl.executor_main`` (the KFP executor, which runs ``torchstep_kfp.entry``) and copies
the executor's output to this process's stdout. What this driver adds, for the harness:

- ``--out``: a JSON record (0600) of what kfp.local reported: ``state`` (SUCCEEDED when the
  pipeline returned, FAILED when kfp.local raised its "finished with status FAILURE", null
  when kfp.local reported nothing: interrupted), the step's ``result`` output parameter
  (when the pipeline returned it), the KFP task process's pid and exit status (read from
  the ``Popen`` kfp.local made; kfp.local itself keeps only SUCCESS / FAILURE);
- ``--pid-file``: the KFP task process's pid, written as soon as kfp.local starts it;
- ``kfp_retries`` in the record: the ``retryPolicy.maxRetryCount`` the pipeline compiles
  to (``set_retry``; kfp.local ignores it, a cluster would not), 0 when there is none.

On Ctrl-C (SIGINT), kfp.local's pipeline call raises ``KeyboardInterrupt`` after waiting
0.25 s for the task process (``Popen.__exit__``) and stops copying its output. The driver
then records that the run was interrupted, waits for the task process to end (it heard the
same Ctrl-C, or its ancestors watch stops it: torchstep's cancellation) so that the record
holds its exit status, and exits 130.
"""

# No `from __future__ import annotations`: KFP reads the pipeline function's annotations as types.
import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

#: Exit status of the driver when Ctrl-C interrupted kfp.local.
INTERRUPTED_EXIT = 130


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, mode 0600."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class _TaskSpy:
    """Records the KFP task process kfp.local's SubprocessRunner starts (its pid, its exit
    status) without changing what kfp.local does with it: ``subprocess.Popen`` as that
    module sees it, subclassed."""

    def __init__(self, pid_file: Path | None) -> None:
        self.procs: list[subprocess.Popen[Any]] = []
        self.pid_file = pid_file

    def install(self) -> None:
        """Make kfp.local's task handler start its processes through this spy."""
        from kfp.local import subprocess_task_handler

        spy = self

        class Popen(subprocess.Popen):  # type: ignore[type-arg]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                spy.procs.append(self)
                if spy.pid_file is not None:
                    _write_private(spy.pid_file, str(self.pid))

        class _Subprocess:  # the module, with Popen replaced
            def __getattr__(self, name: str) -> Any:
                return Popen if name == "Popen" else getattr(subprocess, name)

        subprocess_task_handler.subprocess = _Subprocess()  # type: ignore[assignment]

    def task(self) -> dict[str, Any]:
        """The task process's pid and exit status (None while it runs)."""
        if not self.procs:
            return {"task_pid": None, "task_rc": None}
        proc = self.procs[-1]
        return {"task_pid": proc.pid, "task_rc": proc.poll()}


def _compiled_retries(pipeline: Any, path: Path) -> int:
    """The KFP retries (``retryPolicy.maxRetryCount``) of the pipeline's one task, compiled
    to ``path`` (0600) with KFP's own compiler."""
    import yaml
    from kfp import compiler

    compiler.Compiler().compile(pipeline, str(path))
    path.chmod(0o600)
    spec = next(yaml.safe_load_all(path.read_text()))
    (task,) = spec["root"]["dag"]["tasks"].values()
    return int(task.get("retryPolicy", {}).get("maxRetryCount", 0))


def main(argv: list[str] | None = None) -> int:
    """Run the soak pipeline once under kfp.local and record what it reported.

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        0 when the pipeline succeeded, 1 when kfp.local reported a failure, 130 when
        interrupted (Ctrl-C).
    """
    # Ctrl-C raises KeyboardInterrupt, as in a terminal: a job of a non-interactive shell (a
    # campaign started with `make soak &`, a CI step) starts with SIGINT ignored, which Python
    # keeps; the interrupt would then do nothing at all (found by the soak, seed 20261127)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="where the JSON record goes")
    p.add_argument("--pid-file", type=Path, default=None, help="where the KFP task process's pid goes")
    p.add_argument("--root", required=True, type=Path, help="kfp.local's pipeline_root and workspace go under it")
    p.add_argument("--log-dir", required=True, help="the step's log_dir (cfg)")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--max-restarts", type=int, default=1)
    p.add_argument("--timeout", type=float, required=True, help="the step's timeout (cfg)")
    p.add_argument("--grace", type=float, required=True, help="the step's grace_period (cfg)")
    a = p.parse_args(argv)

    from kfp import dsl, local

    spy = _TaskSpy(a.pid_file)
    spy.install()
    workspace = a.root / "workspace"
    workspace.mkdir(mode=0o700, parents=True, exist_ok=True)
    # initialise kfp.local BEFORE the pipeline is defined (docs/kfp.md)
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(a.root / "outputs"),
        workspace_root=str(workspace),
        raise_on_error=True,
    )

    import component
    from torchstep_kfp import component_from_app

    cfg = {"log_dir": a.log_dir, "timeout": a.timeout, "grace_period": a.grace, "retry_delay": 0}
    op = component_from_app(component.soak(a.replicas, a.nproc, a.max_restarts), cfg=cfg)

    @dsl.pipeline(name="soak")
    def pipeline() -> dict:
        return op().outputs["result"]

    record: dict[str, Any] = {
        "state": None,
        "result": None,
        "error": None,
        "interrupted": False,
        "kfp_retries": _compiled_retries(pipeline, a.root / "pipeline.yaml"),
    }
    started = time.monotonic()
    rc = 0
    try:
        record["result"] = pipeline().output
        record["state"] = "SUCCEEDED"
    except RuntimeError as e:  # kfp.local: "Pipeline 'soak' finished with status FAILURE. ..."
        record["error"] = str(e)
        record["state"] = "FAILED" if "FAILURE" in str(e) else None
        rc = 1
    except KeyboardInterrupt:  # Ctrl-C: kfp.local stopped copying the step's output and returned nothing
        record["interrupted"] = True
        rc = INTERRUPTED_EXIT
        if spy.procs:
            try:
                spy.procs[-1].wait()
            except KeyboardInterrupt:  # a second Ctrl-C: stop waiting
                pass
    record["duration_s"] = time.monotonic() - started
    record.update(spy.task())
    _write_private(a.out, json.dumps(record))
    return rc


if __name__ == "__main__":
    sys.exit(main())
