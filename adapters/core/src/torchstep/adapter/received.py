"""An AppDef that arrives from the network (a DAG run's conf, a flow run's parameters):
the deployment's policy for it, under a name that says what it resolves.

Example::

    >>> from torchstep.policy import DEFAULT
    >>> resolve_policy(DEFAULT) is DEFAULT
    True
"""

from __future__ import annotations

from torchstep.policy import resolve as resolve_policy

__all__ = ["resolve_policy"]
