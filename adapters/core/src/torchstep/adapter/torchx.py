"""The chassis of a TorchX scheduler an adapter ships (``torchx run -s NAME``, registered
under ``torchx.schedulers``): ``scheduler`` is :mod:`torchstep.schedulers.base` (the base
class, option parsing, endpoints, Secrets, responses) and ``records`` what a scheduler
keeps of each run it submitted (:mod:`torchstep.schedulers.records`); ``DAG_ID``, ``TASK_ID``
and ``dag_id_for`` name the generic DAG that ``torchx run -s airflow`` triggers.

Example::

    >>> from torchstep.adapter.torchx import scheduler
    >>> scheduler.TorchstepScheduler.__name__
    'TorchstepScheduler'
"""

from __future__ import annotations

from torchstep.schedulers import base as scheduler
from torchstep.schedulers import records
from torchstep.schedulers.airflow import DAG_ID, TASK_ID, dag_id_for

__all__ = ["DAG_ID", "TASK_ID", "dag_id_for", "records", "scheduler"]
