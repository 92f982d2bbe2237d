"""A rendezvous state that cannot run code when forged: it is refused instead.

torch's dynamic rendezvous (c10d and etcd-v2 backends) keeps its state as a pickle in the
rendezvous store and unpickles whatever it reads there on every sync
(``_BackendRendezvousStateHolder.sync``). The store has no authentication: anyone who can
reach it can write a pickle that runs code as the agent's user. torchstep wraps the handler's
backend so that every state read from the store is first checked by a restricted unpickler
that admits only the classes the state is made of, and then by its shape; anything else
fails the rendezvous (``RendezvousStateError``) before torch unpickles it, with a root cause
that names the store and the refused class.

Example::

    >>> import os, pickle
    >>> from torchstep.agent.rdzv_guard import check_state
    >>> check_state(pickle.dumps(os.system), "127.0.0.1:29500")
    Traceback (most recent call last):
    ...
    StateRefused: rendezvous state from 127.0.0.1:29500 refused: forged or corrupt (class posix.system)

and in the agent, once per handler (what the runner does)::

    guard_handler(handler, config.rdzv_endpoint)
"""

from __future__ import annotations

import datetime
import io
import pickle
from typing import Any

from torchstep.agent import compat

__all__ = ["ALLOWED_CLASSES", "StateRefused", "check_state", "guard_handler"]

#: ``(module, name)`` of every class a genuine rendezvous state pickle refers to (torch
#: 1.9 … 2.15 keep both state classes in ``dynamic_rendezvous``); builtins such as set,
#: dict and tuple are opcodes, not classes, in pickle protocol 2 and later.
ALLOWED_CLASSES: frozenset[tuple[str, str]] = frozenset(
    {
        (compat.RDZV_STATE_MODULE, compat.RDZV_STATE_CLASS),
        (compat.RDZV_STATE_MODULE, compat.RDZV_NODE_CLASS),
        ("datetime", "datetime"),
        ("datetime", "timedelta"),
        ("datetime", "timezone"),
    }
)

#: A state larger than this is refused (a genuine one holds a few hundred bytes per node).
MAX_STATE_BYTES = 64 * 1024 * 1024


class StateRefused(Exception):
    """The state read from the rendezvous store is not a genuine rendezvous state.

    Example: ``str(e)`` is ``"rendezvous state from host:29500 refused: forged or corrupt (class posix.system)"``.
    """


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED_CLASSES:
            raise StateRefused(f"class {module}.{name}")
        return super().find_class(module, name)


def _check_shape(state: Any, state_cls: type, node_cls: type) -> str | None:
    """What is wrong with an unpickled state's structure, or ``None``: torch would raise a
    TypeError deep in its sync on a state of the wrong shape."""
    if type(state) is not state_cls:
        return f"a {type(state).__name__}, not a rendezvous state"
    attrs = getattr(state, "__dict__", {})
    nodes = (set, dict)
    for name, kinds in (
        ("round", int),
        ("complete", bool),
        ("closed", bool),
        ("participants", dict),
        ("wait_list", set),
        ("redundancy_list", set),
        ("last_heartbeats", dict),
    ):
        if name in attrs and not isinstance(attrs[name], kinds):
            return f"field {name} is a {type(attrs[name]).__name__}"
    deadline = attrs.get("deadline")
    if deadline is not None and not isinstance(deadline, datetime.datetime):
        return f"field deadline is a {type(deadline).__name__}"
    for name in ("participants", "wait_list", "redundancy_list", "last_heartbeats"):
        value = attrs.get(name)
        if isinstance(value, nodes) and any(type(n) is not node_cls for n in value):
            return f"field {name} holds something that is not a node"
    for node in attrs.get("participants", {}):
        fields = getattr(node, "__dict__", {})
        if not (
            isinstance(fields.get("addr"), str)
            and isinstance(fields.get("pid"), int)
            and isinstance(fields.get("local_id"), int)
        ):
            return "a node without addr/pid/local_id"
    return None


def check_state(data: bytes, endpoint: str) -> None:
    """Check that ``data`` is a genuine rendezvous state pickle without running any of it.

    Args:
        data: the state's bytes as read from the store (base64 already decoded).
        endpoint: the store's ``host:port``, for the message.

    Raises:
        StateRefused: a class outside :data:`ALLOWED_CLASSES`, a state of the wrong shape,
            bytes that are no pickle, or more than :data:`MAX_STATE_BYTES`.
    """

    def refused(why: str) -> StateRefused:
        return StateRefused(f"rendezvous state from {endpoint} refused: forged or corrupt ({why})")

    if len(data) > MAX_STATE_BYTES:
        raise refused(f"{len(data)} bytes")
    try:
        state = _Restricted(io.BytesIO(data)).load()
    except StateRefused as e:
        raise refused(str(e)) from None
    except RecursionError:
        raise refused("nested too deeply") from None
    except Exception as e:  # any malformed pickle: its own exception type varies
        raise refused(f"not a pickle: {type(e).__name__}: {e}") from None
    why = _check_shape(state, compat.rdzv_state_class(), compat.rdzv_node_class())
    if why is not None:
        raise refused(why)


def guard_handler(handler: Any, endpoint: str) -> bool:
    """Make ``handler`` refuse forged states: its backend's reads are checked first.

    Args:
        handler: the rendezvous handler from torch's registry.
        endpoint: the rendezvous endpoint, named in the refusal.

    Returns:
        ``True`` when the handler's states are now checked; ``False`` for handlers that keep
        no pickled state (static, etcd v1) or whose internals this torch does not have.
    """
    backend = compat.rdzv_backend_of(handler)
    if backend is None or isinstance(backend, _GuardedBackend):
        return isinstance(backend, _GuardedBackend)
    return compat.set_rdzv_backend(handler, _GuardedBackend(backend, endpoint))


class _GuardedBackend:
    """A ``RendezvousBackend`` that checks each state it returns (duck-typed: torch only
    calls ``name``, ``get_state`` and ``set_state``)."""

    def __init__(self, inner: Any, endpoint: str) -> None:
        self._inner = inner
        self._endpoint = endpoint

    @property
    def name(self) -> str:
        return str(self._inner.name)

    def _checked(self, data: Any) -> None:
        try:
            check_state(bytes(data), self._endpoint)
        except StateRefused as e:
            raise compat.rendezvous_state_error()(str(e)) from None

    def get_state(self) -> Any:
        response = self._inner.get_state()
        if response is not None:
            self._checked(response[0])
        return response

    def set_state(self, state: bytes, token: Any = None) -> Any:
        response = self._inner.set_state(state, token)
        if response is not None:
            self._checked(response[0])
        return response

    def __getattr__(self, name: str) -> Any:  # anything else torch or a test reads
        return getattr(self._inner, name)
