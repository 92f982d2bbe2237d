"""torchstep for Prefect 3.

- :func:`app_task` / :func:`torchstep_task`: an AppDef or a TorchX component function as a
  Prefect task — the component's parameters as the task's, retries from the AppDef
  (never for a non-retryable failure), timeouts and cancellation that stop every process of
  the step, each rank's lines in the task run's log, a table and an outputs artifact.
- :func:`job_variables` / :func:`base_job_template`: Kubernetes work-pool job variables
  derived from an AppDef (cpu, memory, GPU, volumes) and the base job template that has them.

Importing this package imports neither torch nor prefect (they load when a function runs).
"""

from torchstep.adapter import lazy_names

# these modules import Prefect inside their functions only: their names load eagerly
from torchstep_prefect.deploy import base_job_template, job_variables
from torchstep_prefect.tasks import StepFailed, app_task, torchstep_task

__all__ = ["StepFailed", "app_task", "base_job_template", "job_variables", "torchstep_task"]
__getattr__ = lazy_names(__name__, "torchstep-prefect", {})  # __version__, from the distribution's metadata
