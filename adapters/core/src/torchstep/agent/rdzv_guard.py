"""A rendezvous state that cannot run code when forged: it is refused instead.

torch's dynamic rendezvous (c10d and etcd-v2 backends) keeps its state as a pickle in the
rendezvous store and unpickles whatever it reads there on every sync
(``_BackendRendezvousStateHolder.sync``). The store has no authentication: anyone who can
reach it can write a pickle that runs code as the agent's user. torchstep wraps the handler's
backend so that every state read from the store is first checked by a restricted unpickler
that admits only the classes the state is made of, and then by its shape; anything else
fails the rendezvous (``RendezvousStateError``) before torch unpickles it, with a root cause
that names the store and the refused class.

A forged state made only of these classes still passes that check (``closed=True`` with
this node among the spares makes torch end the agent as a graceful exit). So when the
launcher hands every agent of a run the same secret (``TORCHSTEP_RDZV_KEY``, in the
environment only: the local target does), every state the agent writes is signed
(HMAC-SHA256, :data:`MAC_PREFIX` + MAC + state) and every state it reads must carry a valid
MAC before anything unpickles it; a state without one fails the rendezvous as a forged
class does. Without a key (torchrun-style use, Kubernetes) the state is unauthenticated.

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
import hashlib
import hmac
import io
import os
import pickle
from collections.abc import MutableMapping
from typing import Any

from torchstep.agent import compat
from torchstep.contract import ENV_RDZV_KEY

__all__ = [
    "ALLOWED_CLASSES",
    "MAC_PREFIX",
    "StateRefused",
    "check_state",
    "guard_backend",
    "guard_handler",
    "sign_state",
    "take_key",
    "unauthenticated_note",
    "verify_state",
]

#: What a signed state starts with (then the 32-byte HMAC-SHA256 of the state, then the state).
MAC_PREFIX = b"torchstep-hmac-sha256:"
_MAC_LEN = 32

#: The run's key, taken from the environment by :func:`take_key` (``None``: unauthenticated).
_key: bytes | None = None

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


def take_key(env: MutableMapping[str, str] | None = None) -> bytes | None:
    """Take the run's rendezvous key out of the environment, so that no process the agent
    starts (zygote, workers) inherits it, and keep it for :func:`guard_handler`.

    Args:
        env: the environment to take it from (default ``os.environ``).

    Returns:
        The key, or ``None`` when the launcher gave none (the state is then unauthenticated).
    """
    global _key
    value = (os.environ if env is None else env).pop(ENV_RDZV_KEY, None)
    if value:
        _key = value.encode()
    return _key


def unauthenticated_note(config: Any) -> str:
    """A note for the settings line when other processes share this rendezvous but no key
    authenticates its state (``""`` otherwise).

    Args:
        config: torch's ``LaunchConfig``.

    Returns:
        The note, or ``""``.
    """
    backend = str(getattr(config, "rdzv_backend", "") or "")
    endpoint = str(getattr(config, "rdzv_endpoint", "") or "")
    private = getattr(config, "max_nodes", 0) == 1 and endpoint.endswith(":0")
    if _key is not None or private or backend not in ("c10d", "etcd-v2"):
        return ""
    return f"rendezvous state unauthenticated (no {ENV_RDZV_KEY})"


def sign_state(state: bytes, key: bytes) -> bytes:
    """The state as it goes into the store: :data:`MAC_PREFIX`, its HMAC-SHA256, the state.

    Args:
        state: the state pickle torch wants to write.
        key: the run's key.

    Returns:
        The signed bytes.
    """
    return MAC_PREFIX + hmac.new(key, state, hashlib.sha256).digest() + state


def verify_state(data: bytes, key: bytes, endpoint: str) -> bytes:
    """The state inside signed ``data``, once its MAC is checked (nothing is unpickled).

    Args:
        data: the bytes read from the store.
        key: the run's key.
        endpoint: the store's ``host:port``, for the message.

    Returns:
        The state pickle.

    Raises:
        StateRefused: ``data`` is not signed, or not with ``key``.
    """
    body = data[len(MAC_PREFIX) + _MAC_LEN :]
    mac = data[len(MAC_PREFIX) : len(MAC_PREFIX) + _MAC_LEN]
    expected = hmac.new(key, body, hashlib.sha256).digest()
    if not data.startswith(MAC_PREFIX) or not hmac.compare_digest(mac, expected):
        raise StateRefused(f"rendezvous state from {endpoint} refused: not signed with this run's key")
    return body


def guard_handler(handler: Any, endpoint: str) -> bool:
    """Make ``handler`` refuse forged states: its backend's reads are checked first.

    Args:
        handler: the rendezvous handler from torch's registry.
        endpoint: the rendezvous endpoint, named in the refusal.

    Returns:
        ``True`` when the handler's states are now checked; ``False`` for handlers that keep
        no pickled state (static, etcd v1) or whose internals this torch does not have.

    With a key from :func:`take_key`, the states are also signed and their MACs checked.
    """
    backend = compat.rdzv_backend_of(handler)
    if backend is None or isinstance(backend, _GuardedBackend):
        return isinstance(backend, _GuardedBackend)
    return compat.set_rdzv_backend(handler, _GuardedBackend(backend, endpoint, _key))


def guard_backend(backend: Any, endpoint: str) -> Any:
    """``backend`` with the same checks and signing :func:`guard_handler` gives a handler's
    (for a second reader of the state: :mod:`torchstep.agent.liveness`).

    Args:
        backend: a rendezvous backend (``get_state``/``set_state``).
        endpoint: the rendezvous endpoint, named in a refusal.

    Returns:
        The guarded backend.
    """
    return backend if isinstance(backend, _GuardedBackend) else _GuardedBackend(backend, endpoint, _key)


class _GuardedBackend:
    """A ``RendezvousBackend`` that signs each state it writes (with a key) and checks each
    state it returns (duck-typed: torch only calls ``name``, ``get_state`` and ``set_state``)."""

    def __init__(self, inner: Any, endpoint: str, key: bytes | None = None) -> None:
        self._inner = inner
        self._endpoint = endpoint
        self._key = key

    @property
    def name(self) -> str:
        return str(self._inner.name)

    def _checked(self, data: Any) -> bytes:
        """The state in ``data`` (MAC removed), refused as torch's RendezvousStateError."""
        try:
            state = bytes(data)
            if self._key is not None:
                state = verify_state(state, self._key, self._endpoint)
            check_state(state, self._endpoint)
        except StateRefused as e:
            raise compat.rendezvous_state_error()(str(e)) from None
        return state

    def get_state(self) -> Any:
        response = self._inner.get_state()
        if response is None:  # no state yet: the first node creates it
            return None
        return (self._checked(response[0]), *response[1:])

    def set_state(self, state: bytes, token: Any = None) -> Any:
        # the store holds the signed bytes; torch's "did my write win" compares them whole
        payload = sign_state(state, self._key) if self._key is not None else state
        response = self._inner.set_state(payload, token)
        if response is None:
            return None
        return (self._checked(response[0]), *response[1:])

    def __getattr__(self, name: str) -> Any:  # anything else torch or a test reads
        return getattr(self._inner, name)
