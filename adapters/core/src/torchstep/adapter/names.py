"""Orchestrator-safe names: one module for every identifier an adapter derives from a
user's name (an AppDef's, a component's, a task's).

- :func:`python_identifier`: KFP component and task names, a Python function's name;
- :func:`artifact_key`: Prefect artifact keys (``[a-z0-9-]``);
- :func:`is_airflow_id`: Airflow's rule for DAG and task ids;
- :func:`dns_label` / :func:`is_dns_label` / :func:`is_dns_subdomain`: Kubernetes names
  (core's rules, the same the renderer uses).

Example::

    >>> python_identifier("2 Train-Model"), artifact_key("Train_Step 1", "ranks")
    ('step_2_train_model', 'train-step-1-ranks')
    >>> is_airflow_id("torchstep_torchx.q-1"), is_airflow_id("a b"), dns_label("Trainer_Main")
    (True, False, 'trainer-main')
"""

from __future__ import annotations

import re

from torchstep.plan.names import dns_label, is_airflow_id, is_dns_label, is_dns_subdomain

__all__ = ["artifact_key", "dns_label", "is_airflow_id", "is_dns_label", "is_dns_subdomain", "python_identifier"]


def python_identifier(name: str) -> str:
    """``name`` as a lowercase Python identifier: each non-word character becomes ``_``, a
    leading digit gets ``step_`` (KFP names components and tasks this way).

    Args:
        name: any name.

    Returns:
        The identifier (``"step"`` when nothing is left).

    >>> python_identifier("__"), python_identifier("Train.v2")
    ('step', 'train_v2')
    """
    out = re.sub(r"\W", "_", str(name)).strip("_").lower() or "step"
    return f"step_{out}" if out[0].isdigit() else out


def artifact_key(name: str, kind: str) -> str:
    """A Prefect artifact key for ``kind`` of the task ``name``: ``[a-z0-9-]``, the name cut
    at 80 characters.

    Args:
        name: the task (run) name.
        kind: what the artifact holds (``"ranks"``, ``"outputs"``).

    Returns:
        ``"<name>-<kind>"``.

    >>> artifact_key("!!", "outputs")
    'step-outputs'
    """
    base = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "step"
    return f"{base[:80]}-{kind}"
