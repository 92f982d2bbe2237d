"""Every private name of torch that the agent uses, in one place.

The agent runs in the user's step image on the user's torch (2.4 … newest): a private name
that moves or disappears in some version must break in this module only, where each use
says which torch versions it was checked on and what happens without it.

Example::

    >>> from torchstep.agent import compat
    >>> compat.RDZV_STATE_CLASS
    '_RendezvousState'
"""

from __future__ import annotations

from typing import Any

# ---------------------------------------------------------------------------------------
# Rendezvous state guard (torchstep.agent.rdzv_guard)
#
# torch's dynamic rendezvous pickles its state into the store. These are the classes a
# genuine state is made of and where the handler keeps its backend; checked on torch 2.4.1,
# 2.6.0, 2.13.0 and 2.15.0 (unchanged since 1.9). Without them the guard is not installed
# and the agent says so.
# ---------------------------------------------------------------------------------------

#: Module of the rendezvous state classes.
RDZV_STATE_MODULE = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
#: The state's class (a plain class with a ``__dict__``).
RDZV_STATE_CLASS = "_RendezvousState"
#: A node's description (a frozen dataclass: addr, pid, local_id).
RDZV_NODE_CLASS = "_NodeDesc"


def _dynamic_rendezvous() -> Any:
    import torch.distributed.elastic.rendezvous.dynamic_rendezvous as dr

    return dr


def rdzv_state_class() -> type:
    """torch's ``_RendezvousState`` class.

    Returns:
        The class.
    """
    cls: type = getattr(_dynamic_rendezvous(), RDZV_STATE_CLASS)
    return cls


def rdzv_node_class() -> type:
    """torch's ``_NodeDesc`` class.

    Returns:
        The class.
    """
    cls: type = getattr(_dynamic_rendezvous(), RDZV_NODE_CLASS)
    return cls


def rendezvous_state_error() -> type[Exception]:
    """torch's ``RendezvousStateError`` (a ``RendezvousError``: the agent's run fails as a
    rendezvous failure).

    Returns:
        The exception class.
    """
    from torch.distributed.elastic.rendezvous import RendezvousStateError

    return RendezvousStateError


def rdzv_backend_of(handler: Any) -> Any:
    """The backend of a dynamic rendezvous handler (``handler._state_holder._backend``).

    Args:
        handler: a rendezvous handler.

    Returns:
        The backend, or ``None`` for handlers without one (static, etcd v1).
    """
    holder = getattr(handler, "_state_holder", None)
    return getattr(holder, "_backend", None)


def set_rdzv_backend(handler: Any, backend: Any) -> bool:
    """Replace the backend a dynamic rendezvous handler's state holder syncs through.

    Args:
        handler: a rendezvous handler that has one (:func:`rdzv_backend_of`).
        backend: the new backend.

    Returns:
        ``True`` when it was replaced.
    """
    holder = getattr(handler, "_state_holder", None)
    if holder is None or not hasattr(holder, "_backend"):
        return False
    holder._backend = backend
    return True
