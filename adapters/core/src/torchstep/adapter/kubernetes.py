"""Kubernetes for an adapter that hands a step's pod to its orchestrator's own Kubernetes
support (Airflow's KubernetesPodOperator, a Prefect work pool's base job template) instead
of running it through :func:`torchstep.steps.open_step`: the rendered objects, the pod's
container, its termination, and the ownership records that keep a later try from
attaching to a pod someone else created; and, for an orchestrator that waits for a run
somewhere else than its watcher (Airflow's triggerer), the run's JSON handle and its state
read through it (:mod:`torchstep.kubernetes.remote`). Imports the Kubernetes client only on use.

Example::

    >>> from torchstep.adapter.kubernetes import CONTAINER_NAME
    >>> CONTAINER_NAME
    'main'
"""

from __future__ import annotations

from torchstep.kubernetes import CONTAINER_NAME, OfficialClient, RenderedApp, render_app
from torchstep.kubernetes.apiobj import termination, uid_of
from torchstep.kubernetes.hostpod import host_pod
from torchstep.kubernetes.ownership import impostor_warning, record_uid, recorded_uids
from torchstep.kubernetes.preemption import Preemptions, disruption
from torchstep.kubernetes.remote import BARE_POD, GONE, RemoteRun, handle_of
from torchstep.kubernetes.runobjects import wait_until_gone

__all__ = [
    "BARE_POD",
    "CONTAINER_NAME",
    "GONE",
    "OfficialClient",
    "Preemptions",
    "RemoteRun",
    "RenderedApp",
    "disruption",
    "handle_of",
    "host_pod",
    "impostor_warning",
    "record_uid",
    "recorded_uids",
    "render_app",
    "termination",
    "uid_of",
    "wait_until_gone",
]
