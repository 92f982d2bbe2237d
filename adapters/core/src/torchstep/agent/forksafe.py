"""What the worker zygote checks before it forks a worker (``torchstep.agent.zygote``):
that the request is one the exec wrapper sends (:func:`parse_request`), and that the
worker forked from the zygote would be the same as an exec'd one (:func:`fork_refusal`:
no Python thread and no initialised accelerator runtime in the zygote, no
interpreter-start variable that differs). A refused worker is exec'd by its wrapper.

No torch import here (the zygote has imported it; the agent must not need to).

Example::

    >>> fork_refusal({"PYTHONHASHSEED": "7"}, {})
    "PYTHONHASHSEED differs from the agent's"
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from typing import Any

#: The longest request the zygote reads (exec's usual limit on arguments plus environment,
#: ``ARG_MAX``); a longer one is refused and that worker exec'd.
MAX_REQUEST = 2 << 20
#: Read only when an interpreter starts or torch loads: a worker whose environment differs
#: from the zygote's in one of them would not behave as a fresh one, so it is exec'd instead.
STARTUP_ENV = (
    *("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONPLATLIBDIR"),
    *("PYTHONHASHSEED", "PYTHONMALLOC", "PYTHONDEVMODE", "PYTHONUTF8", "PYTHONOPTIMIZE", "PYTHONWARNINGS"),
    *("PYTHONDONTWRITEBYTECODE", "PYTHONFAULTHANDLER", "PYTHONTRACEMALLOC", "PYTHONINTMAXSTRDIGITS", "PYTHONVERBOSE"),
    *("LD_PRELOAD", "LD_LIBRARY_PATH", "MKL_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY"),
)
#: torch's accelerator modules that keep an "initialised" flag (torch 2.13). ``torch.mps``
#: has none, and exists on macOS only, where the zygote is off.
_ACCELERATORS = ("cuda", "xpu", "mtia")
_CUDA_ERROR_NOT_INITIALIZED = 3


class BadRequest(ValueError):
    """A request that is not what the exec wrapper sends: refused, the zygote goes on."""


def parse_request(data: bytes, fds: list[int], flags: int = 0) -> dict[str, Any]:
    """Check one request of the exec wrapper: its message (JSON: ``argv``, ``module``,
    ``env``, ``cwd``) and its three file descriptors (the worker's stdin, stdout, stderr).

    Example: ``parse_request(b'{"argv": ["t.py"], "module": null, "env": {}, "cwd": "/"}', [5, 6, 7])``
    returns that request.

    Args:
        data: the message as received.
        fds: the file descriptors that came with it.
        flags: ``recvmsg``'s flags (``MSG_TRUNC``: longer than the zygote reads).

    Returns:
        The request, with exactly those four keys.

    Raises:
        BadRequest: what is wrong (the zygote refuses it; the wrapper then execs the worker).
    """
    if flags & socket.MSG_TRUNC:
        raise BadRequest(f"longer than {MAX_REQUEST >> 20} MiB")
    if flags & socket.MSG_CTRUNC or len(fds) != 3:
        raise BadRequest(f"{'more than 3' if flags & socket.MSG_CTRUNC else len(fds)} file descriptors, not 3")
    try:
        request = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise BadRequest(f"not JSON ({type(e).__name__})") from None
    if not isinstance(request, dict):
        raise BadRequest("not a JSON object")
    argv, module, env, cwd = (request.get(key) for key in ("argv", "module", "env", "cwd"))
    if not isinstance(argv, list) or not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise BadRequest("'argv' is not a list of strings")
    if module is not None and not (isinstance(module, str) and module and "\0" not in module):
        raise BadRequest("'module' is neither null nor a module name")
    if module is None and not argv:
        raise BadRequest("names neither a script nor a module")
    if not isinstance(env, dict) or not all(_env_entry(k, v) for k, v in env.items()):
        raise BadRequest("'env' is not a mapping of variable names to strings")
    if not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd:
        raise BadRequest("'cwd' is not an absolute path")
    return {"argv": argv, "module": module, "env": env, "cwd": cwd}


def _env_entry(key: object, value: object) -> bool:
    return (
        isinstance(key, str)
        and isinstance(value, str)
        and key != ""
        and not {"=", "\0"} & set(key)
        and "\0" not in value
    )


def fork_refusal(env: dict[str, str], startup_env: dict[str, str | None]) -> str:
    """Why a worker with environment ``env`` must not be forked from this process ("" if it
    may): a Python thread runs here, an accelerator runtime is initialised here, or ``env``
    differs from ``startup_env`` (the zygote's) in a variable only an interpreter's start or
    torch's load reads.

    Example: ``fork_refusal({"PYTHONHASHSEED": "7"}, {"PYTHONHASHSEED": None, ...})`` is
    ``"PYTHONHASHSEED differs from the agent's"``.

    Args:
        env: the worker's environment.
        startup_env: the zygote's values of :data:`STARTUP_ENV` and ``OMP_NUM_THREADS``.

    Returns:
        The reason, or "".
    """
    if threading.active_count() != 1:  # a thread could hold a lock the child then inherits
        return "the zygote runs a Python thread"
    accelerator = accelerator_in_use()
    if accelerator:  # the child could not use it (and torch would refuse to initialise it again)
        return f"{accelerator} in the zygote"
    for key in STARTUP_ENV:
        if env.get(key) != startup_env.get(key):
            return f"{key} differs from the agent's"
    omp = env.get("OMP_NUM_THREADS")
    if omp != startup_env.get("OMP_NUM_THREADS") and not (omp and omp.isdigit() and int(omp) > 0):
        return "OMP_NUM_THREADS differs from the agent's"  # a number is applied in the child
    return ""


def accelerator_in_use() -> str:
    """Which accelerator runtime this process has initialised ("" if none): forking then
    would hand each worker a runtime that does not work across ``fork``.

    Reads torch's own flags (``torch.cuda`` / ``torch.xpu`` / ``torch.mtia`` and a
    registered out-of-tree backend such as ``torch.npu``: ``is_initialized()`` and
    ``_is_in_bad_fork()``), which never initialise anything, and only if torch is already
    imported; then asks a CUDA driver that
    is already loaded (never loads one) whether ``cuInit`` ran — ``torch.cuda.is_available()``
    runs it without setting torch's flag.

    Example: in a process that ran only ``import torch``, ``accelerator_in_use()`` is "".

    Returns:
        e.g. ``"torch.cuda is initialised"``, or "".
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        from torchstep.agent import compat

        names = [f"torch.{name}" for name in _ACCELERATORS]
        custom = compat.privateuse1_backend(torch)
        if custom:
            names.append(f"torch.{custom}")
        for name in names:
            module = sys.modules.get(name)
            probe = getattr(module, "is_initialized", None)
            try:
                if callable(probe) and probe():
                    return f"{name} is initialised"
                if compat.in_bad_fork(module):  # this process is a fork of one that had it
                    return f"{name} was initialised before a fork"
            except Exception:  # a broken backend module: not ours to judge
                continue
    if _cuda_driver_initialised():
        return "the CUDA driver is initialised"
    return ""


def _cuda_driver_initialised() -> bool:
    try:
        import ctypes

        driver = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)  # never loads it
    except (OSError, AttributeError):  # not loaded: nothing here initialised it
        return False
    count = ctypes.c_int(0)
    try:  # before cuInit every driver call answers CUDA_ERROR_NOT_INITIALIZED, and initialises nothing
        return bool(driver.cuDeviceGetCount(ctypes.byref(count)) != _CUDA_ERROR_NOT_INITIALIZED)
    except (AttributeError, OSError):
        return False
