"""The contract between the launchers, the agent and the workers: environment variable
names, reserved exit codes, the worker error-file format and signal names.

Standard library only: the agent, the worker API, the local supervisor, the Kubernetes
renderer and every adapter import it, and nothing here may pull in more than that.

Example::

    >>> from torchstep import contract
    >>> contract.NON_RETRYABLE_EXIT_CODE
    82
    >>> contract.signal_name(-9)
    'SIGKILL'
    >>> contract.exit_signal_name(137)
    'SIGKILL'
"""

from __future__ import annotations

import signal
import time
import traceback
from pathlib import Path
from typing import Any

# -- environment variables set by a launcher for the agent ---------------------------------
ENV_APP_ID = "TORCHSTEP_APP_ID"
ENV_ROLE = "TORCHSTEP_ROLE"
ENV_REPLICA_ID = "TORCHSTEP_REPLICA_ID"
ENV_RDZV_BACKEND = "TORCHSTEP_RDZV_BACKEND"
ENV_RDZV_ENDPOINT = "TORCHSTEP_RDZV_ENDPOINT"
ENV_RDZV_ID = "TORCHSTEP_RDZV_ID"
ENV_RDZV_CONF = "TORCHSTEP_RDZV_CONF"
#: The run's rendezvous key: the agent signs and checks the rendezvous state with it
#: (environment only, never argv; the agent removes it before anything else starts).
ENV_RDZV_KEY = "TORCHSTEP_RDZV_KEY"
ENV_RESULT_FILE = "TORCHSTEP_RESULT_FILE"
ENV_LOG_DIR = "TORCHSTEP_LOG_DIR"
#: Where the agent writes its result summary (Kubernetes: the container's termination log).
ENV_TERMINATION_LOG = "TORCHSTEP_TERMINATION_LOG"
ENV_HEARTBEAT_TIMEOUT = "TORCHSTEP_HEARTBEAT_TIMEOUT"
ENV_GRACE_PERIOD = "TORCHSTEP_GRACE_PERIOD"
ENV_STOP_TIMEOUT = "TORCHSTEP_STOP_TIMEOUT"
ENV_EXIT_BARRIER_TIMEOUT = "TORCHSTEP_EXIT_BARRIER_TIMEOUT"
ENV_WATCHDOG_TIMEOUT = "TORCHSTEP_WATCHDOG_TIMEOUT"
ENV_HANG_TIMEOUT = "TORCHSTEP_HANG_TIMEOUT"
#: The interpreter the ``torchrun`` shim execs the agent with.
ENV_PYTHON = "TORCHSTEP_PYTHON"
#: A token in the environment of every process a local run starts (the leak sweep finds them).
ENV_LAUNCH_TOKEN = "TORCHSTEP_LAUNCH_TOKEN"
#: Where the agent creates its private run state (FIFOs, heartbeats): a launcher that
#: removes this directory at its end leaves nothing behind even when agents were killed.
ENV_RUN_DIR = "TORCHSTEP_RUN_DIR"
#: ``1``: the agent prefixes console lines ``[role/rank]`` and merges a binary worker's
#: stderr into its log (``--log-prefix``); launchers get it by setting ``TORCHSTEP_APP_ID``.
ENV_LOG_PREFIX = "TORCHSTEP_LOG_PREFIX"
#: ``TORCHSTEP_PORT_<NAME>``: a role's declared port on the local target.
ENV_PORT_PREFIX = "TORCHSTEP_PORT_"
#: ``1``: Python workers are forked from a pre-imported zygote (the agent's ``--zygote``).
ENV_ZYGOTE = "TORCHSTEP_ZYGOTE"
#: Where the agent writes its readiness file: present while this node's workers run in a
#: formed gang (after the rendezvous); a Kubernetes readinessProbe checks it.
ENV_READY_FILE = "TORCHSTEP_READY_FILE"

# -- environment variables set by the agent for its workers ---------------------------------
#: torch's name: where ``record`` writes the worker's error file.
ENV_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
#: torch's name: the FIFO of the file-based timer server.
ENV_TIMER_FILE = "TORCHELASTIC_TIMER_FILE"
#: The file ``torchstep.heartbeat()`` touches.
ENV_HEARTBEAT_FILE = "TORCHSTEP_HEARTBEAT_FILE"
#: The JSON file ``torchstep.output()`` writes.
ENV_OUTPUT_FILE = "TORCHSTEP_OUTPUT_FILE"
#: The file a worker's stack dump handler writes to (``faulthandler``, on :data:`STACKS_SIGNAL`).
ENV_STACKS_FILE = "TORCHSTEP_STACKS_FILE"
#: The JSON file ``torchstep.progress()`` writes.
ENV_PROGRESS_FILE = "TORCHSTEP_PROGRESS_FILE"
#: The file a worker touches when a ``torch.distributed`` collective returns (at most once a
#: second; set only with ``--hang-timeout``, which counts it as progress).
ENV_COLLECTIVES_FILE = "TORCHSTEP_COLLECTIVES_FILE"
#: The signal the agent sends a worker for its stacks: a real-time one, which no library
#: handles and whose default action (terminate) the agent never triggers: it signals only a
#: worker whose stacks file says the handler is installed.
STACKS_SIGNAL = signal.SIGRTMIN + 6 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2
#: The step's checkpoint directory (local run option ``checkpoint_dir``), the same for every try.
ENV_CHECKPOINT_DIR = "TORCHSTEP_CHECKPOINT_DIR"
#: The newest checkpoint in it when the replica started (``torchstep.last_checkpoint()`` looks again).
ENV_LAST_CHECKPOINT = "TORCHSTEP_LAST_CHECKPOINT"


def shim_dir() -> str:
    """The directory holding the ``torchrun`` shim that execs ``torchstep-agent`` (put it
    first on PATH and every ``torchrun ...`` command line runs under the agent)."""
    return str(Path(__file__).resolve().parent / "shims")


# -- exit codes ------------------------------------------------------------------------------
#: A worker that exits with this code (or raises ``NonRetryableError`` under
#: ``torchstep.record``) stops every retry layer at once: the agent does not restart it and
#: exits with this same code; adapters tell their orchestrator not to retry.
NON_RETRYABLE_EXIT_CODE = 82
#: The agent failed on its own account: rendezvous timeout, the no-progress watchdog,
#: or an internal error. The result file says which.
AGENT_ERROR_EXIT_CODE = 83
#: A usage error on the agent's or the CLI's command line (argparse's code).
USAGE_EXIT_CODE = 2
#: The step ran past its timeout (coreutils ``timeout``'s code).
TIMEOUT_EXIT_CODE = 124
#: Interrupted by Ctrl-C (the shell's 128 + SIGINT).
INTERRUPTED_EXIT_CODE = 130
#: 128 + SIGKILL / 128 + SIGTERM: how a container runtime reports a killed process.
SIGKILLED_EXIT_CODE = 128 + signal.SIGKILL
SIGTERMED_EXIT_CODE = 128 + signal.SIGTERM


def signal_name(returncode: int | None) -> str | None:
    """``-9`` (how ``Popen`` and torch report "killed by signal 9") → ``"SIGKILL"``;
    ``None`` for a normal exit."""
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"SIG{-returncode}"


def exit_signal_name(exit_code: int | None) -> str | None:
    """``137`` (a shell's or container runtime's 128 + N) → ``"SIGKILL"``; else ``None``."""
    if exit_code is None or not 128 < exit_code < 128 + 65:
        return None
    return signal_name(128 - exit_code)


# -- the worker error file ---------------------------------------------------------------------
#: The key of torchstep's own block in an error file (torch reads only ``message``).
ERROR_FILE_KEY = "torchstep"
NON_RETRYABLE_NAME = "NonRetryableError"


def error_record(exc: BaseException, *, retryable: bool = True, now: float | None = None) -> dict[str, Any]:
    """The JSON an error file holds for ``exc``: torch's format (``message`` with an
    integer ``timestamp``, what ``ProcessFailure`` reads) plus torchstep's block with the
    qualified exception type, a sub-second timestamp and whether a retry may help.

    Example::

        >>> rec = error_record(ValueError("bad lr"), retryable=False, now=1.5)
        >>> rec["message"]["message"], rec["torchstep"]["retryable"]
        ('ValueError: bad lr', False)
    """
    now = time.time() if now is None else now
    kind = type(exc)
    qualname = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return {
        "message": {
            "message": f"{kind.__name__}: {exc}",
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(exc)),
                "timestamp": str(int(now)),
            },
        },
        ERROR_FILE_KEY: {"exception": qualname, "retryable": retryable, "timestamp": now},
    }


def error_details(data: Any) -> tuple[str | None, str | None]:
    """``(message, traceback)`` from an error file's JSON (torch's or ours).

    Example::

        >>> error_details({"message": "<NONE>"})
        (None, None)
    """
    if not isinstance(data, dict):
        return None, None
    message = data.get("message")
    if isinstance(message, dict):
        extra = message.get("extraInfo") or {}
        return (str(message.get("message")) if message.get("message") else None), extra.get("py_callstack")
    if isinstance(message, str) and message != "<NONE>":
        return message, None
    return None, None


def is_non_retryable(exit_code: int | None, error_data: Any) -> bool:
    """Whether a worker's failure must stop every retry layer: the reserved exit code,
    an error file that says so, or a ``NonRetryableError`` recorded by torch's ``@record``.

    Example::

        >>> is_non_retryable(1, {"message": "NonRetryableError: dataset missing"})
        True
    """
    if exit_code == NON_RETRYABLE_EXIT_CODE:
        return True
    if not isinstance(error_data, dict):
        return False
    ours = error_data.get(ERROR_FILE_KEY)
    if isinstance(ours, dict) and ours.get("retryable") is False:
        return True
    message, stack = error_details(error_data)
    text = message or ""
    last = (stack or "").rstrip().splitlines()
    marker = NON_RETRYABLE_NAME + ":"
    return text.startswith(marker) or bool(last and marker in last[-1])
