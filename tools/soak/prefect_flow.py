"""The ``prefect`` soak surface's served flow: one flow whose one task is the soak component
(tools/soak/component.py) made a Prefect task by ``torchstep_prefect.app_task``, served by a
long-lived ``flow.serve()`` Runner as a user serves it: ``python -m tools.soak.prefect_flow``
(with ``PREFECT_API_URL`` pointing at a ``prefect server``). The harness
(tools/soak/surfaces/prefect.py) creates one flow run per soak run through the API and
cancels it with ``prefect flow-run cancel``.

The Runner executes each flow run in a process of its own (a ``multiprocessing`` spawn
child of the Runner): that process runs the task, the task runs the step's agents as its
children, so it is "the process watching the step". What the flow adds for the harness:

- ``pid_file``: the flow-run process writes its pid there first (0600), so that the
  harness can SIGKILL it (``sigkill_watcher``) and check that it ended;
- ``env``: the run's ``SOAK_*`` environment (the fault, the leftover marker ``SOAK_MARK``,
  the checkpoint and progress directories), put into the flow-run process's environment
  before the step starts, so that every process of the step (agents, workers, the
  rendezvous store) inherits it, as they inherit a deployment's environment;
- ``record``: what the task returned (the step result dict) or the ``result`` of the
  :class:`~torchstep_prefect.StepFailed` it raised, as JSON (0600), to compare with the
  step's ``result.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from prefect import flow
from torchstep_prefect import StepFailed, app_task

HERE = Path(__file__).resolve().parent
#: The soak component and its job script.
COMPONENT, JOB = HERE / "component.py", HERE / "job.py"
#: The flow's and the deployment's names: the deployment is ``soak/soak``.
FLOW, DEPLOYMENT = "soak", "soak"


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, mode 0600, never through a symlink.

    Args:
        path: the file.
        text: its content.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


@flow(name=FLOW)
def soak_flow(
    env: dict[str, str],
    log_dir: str,
    pid_file: str,
    record: str,
    timeout: float,
    grace_period: float,
    replicas: int = 2,
    nproc: int = 2,
) -> str:
    """Run the soak component once as a torchstep Prefect task.

    Args:
        env: the run's environment (``SOAK_*``), inherited by every process of the step.
        log_dir: the step's ``cfg log_dir``.
        pid_file: where this flow-run process writes its pid.
        record: where the task's result (or its StepFailed's) goes as JSON.
        timeout: the step's ``cfg timeout``.
        grace_period: the step's ``cfg grace_period`` (SIGTERM to SIGKILL on a cancel).
        replicas: agents of the soak job.
        nproc: processes per agent.

    Returns:
        The step's state.

    Raises:
        StepFailed: the step did not succeed (the task run is Failed).
    """
    write_private(Path(pid_file), str(os.getpid()))
    os.environ.update(env)
    step = app_task(f"{COMPONENT}:soak", cfg={"log_dir": log_dir, "timeout": timeout, "grace_period": grace_period})
    try:
        result = step(replicas=replicas, nproc=nproc, job=str(JOB))
    except StepFailed as e:
        write_private(Path(record), json.dumps({"result": e.result, "error": str(e)}))
        raise
    write_private(Path(record), json.dumps({"result": result}))
    return str(result["state"])


if __name__ == "__main__":
    soak_flow.serve(name=DEPLOYMENT)
