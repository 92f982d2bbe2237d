"""The stack handler of a worker the agent exec'd (stdlib only; never imported by torchstep).

The agent's exec wrapper (``torchstep.agent._exec``) puts this file's directory first on
``PYTHONPATH`` of a Python worker it execs (not forked from the zygote), so that the worker's
``site`` imports it at startup, before the user's script, whether or not the script ever
imports torchstep. It then leaves the worker as the user's program would have been:

1. ``PYTHONPATH`` back as it was (``TORCHSTEP_SITE_PYTHONPATH``: ``set:<value>`` or
   ``unset``) and this directory off ``sys.path``, so nothing the program sees or starts
   (a subprocess, a DataLoader worker) carries it;
2. ``faulthandler`` registered for the agent's stacks signal (``SIGRTMIN + 6``:
   ``torchstep.contract.STACKS_SIGNAL``), writing all threads to ``TORCHSTEP_STACKS_FILE``
   under the header line the agent looks for (as ``torchstep.worker.install_stack_dump``);
3. the image's own ``sitecustomize``, if any, imported by its name from the rest of
   ``sys.path``, as ``site`` would have imported it: it runs, with its own ``__file__``, and
   is ``sys.modules["sitecustomize"]`` afterwards; its errors reach ``site`` unchanged.

Never raises for its own part: a worker without the handler still runs (the agent then says
"no stack handler").
"""

import os
import sys

_ORIGINAL = "TORCHSTEP_SITE_PYTHONPATH"  # what PYTHONPATH was before the wrapper prepended us
_STACKS_FILE = "TORCHSTEP_STACKS_FILE"
_STACKS_FILE_REF: list = []  # the open stacks file, for the worker's life


def _restore_path() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    original = os.environ.pop(_ORIGINAL, None)
    if original is not None:
        if original.startswith("set:"):
            os.environ["PYTHONPATH"] = original[4:]
        else:
            os.environ.pop("PYTHONPATH", None)
    # the entry is the wrapper's string (this file's path came from it): no realpath, no syscall
    sys.path[:] = [p for p in sys.path if not p or os.path.abspath(p) != here]


def _install_handler() -> None:
    path = os.environ.get(_STACKS_FILE)
    if not path:
        return
    try:
        # the C modules only (the interpreter has _signal loaded already): ``signal`` would
        # import enum, functools and collections into every worker's startup (~10 ms)
        import _signal
        import faulthandler

        signum = _signal.SIGRTMIN + 6 if hasattr(_signal, "SIGRTMIN") else _signal.SIGUSR2
        # O_EXCL: the file is the rank's main process's (as install_stack_dump opens it)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        return
    except Exception as e:  # a worker without the handler still runs
        sys.stderr.write(f"torchstep: no stack dump handler: {e}\n")
        return
    f = os.fdopen(fd, "w")
    try:
        faulthandler.register(signum, file=f, all_threads=True, chain=False)
        f.write(f"torchstep stacks of pid {os.getpid()}\n")  # after: the agent signals only a handled pid
        f.flush()
    except Exception as e:
        sys.stderr.write(f"torchstep: no stack dump handler: {e}\n")
        return
    _STACKS_FILE_REF.append(f)


def _chain() -> None:
    """Import the image's own ``sitecustomize`` (this module's name, the rest of sys.path)."""
    ours = sys.modules.pop(__name__, None)
    try:
        __import__("sitecustomize")
    except ImportError as e:
        if e.name != "sitecustomize":
            raise
        if ours is not None:  # none in the image: the import machinery expects a module here
            sys.modules[__name__] = ours


if __name__ == "sitecustomize":
    _restore_path()
    _install_handler()
    _chain()
