"""Worker-side API: what a training script calls while it runs under ``torchstep-agent``.

Importing this module never imports torch (torch is loaded inside :func:`expires` only).
Every function is a cheap no-op when the script runs without the agent (plain ``python``
or plain ``torchrun``), so scripts stay portable.

How the worker talks to the agent — files named by environment variables the agent sets
for each worker; no sockets, no threads in the worker:

=============================  ==========================================================
``TORCHELASTIC_ERROR_FILE``    :func:`record` writes the error (torch's format) here
``TORCHELASTIC_TIMER_FILE``    FIFO of the agent's timer server (:func:`expires`)
``TORCHSTEP_HEARTBEAT_FILE``   :func:`heartbeat` touches it; the agent watches its mtime
``TORCHSTEP_OUTPUT_FILE``      :func:`output` keeps a JSON object of name -> value here
``TORCHSTEP_PROGRESS_FILE``    :func:`progress` keeps the last step, total and times here
``TORCHSTEP_STACKS_FILE``      where this worker's stacks go when the agent asks for them
                               (:func:`install_stack_dump`: ``faulthandler`` on a signal)
``TORCHSTEP_COLLECTIVES_FILE`` touched (at most once a second) when a ``torch.distributed``
                               collective returns (:func:`install_collective_hook`; set
                               with ``--hang-timeout`` only)
=============================  ==========================================================

Example::

    import torchstep

    @torchstep.record
    def main() -> None:
        for step in range(1000):
            with torchstep.expires(after=60):   # a stuck step is killed and restarted
                train_one_step()
            torchstep.heartbeat()               # for --heartbeat-timeout
            torchstep.progress(step + 1, 1000)  # the step's progress and ETA
        torchstep.output("accuracy", 0.93)      # rank 0's value lands in the step result

    if __name__ == "__main__":
        main()
"""

from __future__ import annotations

import faulthandler
import functools
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from torchstep.contract import (
    ENV_CHECKPOINT_DIR,
    ENV_COLLECTIVES_FILE,
    ENV_ERROR_FILE,
    ENV_HEARTBEAT_FILE,
    ENV_LAST_CHECKPOINT,
    ENV_OUTPUT_FILE,
    ENV_PROGRESS_FILE,
    ENV_STACKS_FILE,
    ENV_TIMER_FILE,
    NON_RETRYABLE_EXIT_CODE,
    STACKS_SIGNAL,
    error_record,
)
from torchstep.errors import NonRetryableError
from torchstep.result import write_text_atomic
from torchstep.untrusted import MAX_JSON_DEPTH, MAX_OUTPUTS_BYTES, json_safe, read_capped

__all__ = [
    "ERROR_FILE_ENV",
    "HEARTBEAT_FILE_ENV",
    "OUTPUT_FILE_ENV",
    "TIMER_FILE_ENV",
    "checkpoint_dir",
    "expires",
    "heartbeat",
    "install_collective_hook",
    "install_stack_dump",
    "last_checkpoint",
    "output",
    "progress",
    "record",
    "write_error_file",
]

#: Set by the agent: the error file, the timer FIFO, the heartbeat file, the outputs file.
ERROR_FILE_ENV = ENV_ERROR_FILE
TIMER_FILE_ENV = ENV_TIMER_FILE
HEARTBEAT_FILE_ENV = ENV_HEARTBEAT_FILE
OUTPUT_FILE_ENV = ENV_OUTPUT_FILE

# heartbeat() is meant to be called every step: skip the syscall when the last touch is
# this recent (far below any sensible --heartbeat-timeout).
_HEARTBEAT_MIN_INTERVAL_S = 0.05

_P = ParamSpec("_P")
_R = TypeVar("_R")

# progress() is meant to be called every step too: the file is rewritten at most this often
# (and always for the last step)
_PROGRESS_MIN_INTERVAL_S = 0.2

_lock = threading.Lock()  # output() from several threads of one worker
_last_heartbeat = 0.0
_progress_first: tuple[float, float] | None = None  # (step, unix time) of the first progress() call
_progress_written = 0.0
_stacks_file: Any = None  # the open file faulthandler writes to (kept open for the worker's life)
# the stacks file was there already: whether its handler is this process's (the exec wrapper's
# sitecustomize installed it) — decided once, not on every heartbeat()
_stacks_found: bool | None = None
# install_collective_hook(): the file a returning collective touches, and when it last did
_collectives_file: str | None = None
_collective_touched = 0.0
_timer_clients: dict[str, Any] = {}


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    return value or None


def write_error_file(exc: BaseException, *, retryable: bool = True, path: str | None = None) -> str | None:
    """Write ``exc`` to the worker's error file in torch's format (what ``@record`` writes).

    torch's ``ProcessFailure`` reads ``message`` (with an integer ``timestamp``); the
    ``torchstep`` key adds what torch's format lacks: the exception's qualified type, a
    sub-second timestamp and whether the failure may be retried.

    Args:
        exc: the exception to record (its message, type and traceback).
        retryable: ``False`` when retrying cannot help (the agent stops restarting).
        path: the file to write; ``None``: ``TORCHELASTIC_ERROR_FILE`` as the agent set it.

    Returns:
        The path written, or ``None`` when no error file is configured or it could not be
        written (said on stderr; the worker's own exception is never hidden).

    Example::

        try:
            train()
        except Exception as e:
            torchstep.worker.write_error_file(e)
            raise
    """
    target = path or _env(ERROR_FILE_ENV)
    if target is None:
        return None
    data = error_record(exc, retryable=retryable)
    try:
        write_text_atomic(target, json.dumps(data))
    except OSError as err:  # never hide the worker's own exception behind ours
        print(f"torchstep: cannot write error file {target}: {err}", file=sys.stderr)
        return None
    return target


def record(fn: Callable[_P, _R]) -> Callable[_P, _R | None]:
    """Decorate a worker's main function to report its failure to the agent.

    Like torch's ``@record``: an exception is written to ``TORCHELASTIC_ERROR_FILE`` (the
    agent puts its message and traceback in the step result) and re-raised. A
    :class:`torchstep.NonRetryableError` makes the worker exit with
    ``torchstep.NON_RETRYABLE_EXIT_CODE`` (82) after writing the file: the agent then stops
    restarting at once. ``sys.exit(0)`` inside ``fn`` returns ``None``, as in torch.

    Args:
        fn: the worker's main function.

    Returns:
        ``fn`` wrapped: same arguments and result (``None`` after ``sys.exit(0)``).

    Raises:
        SystemExit: with code 82 when ``fn`` raised :class:`torchstep.NonRetryableError`;
            any other exception of ``fn`` is re-raised as it is.

    Example::

        @torchstep.record
        def main() -> None:
            raise torchstep.NonRetryableError("bad config: lr must be > 0")
    """

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R | None:
        try:
            faulthandler.enable(all_threads=True)  # a segfault still prints a traceback
        except Exception:  # stderr may be closed; not worth failing for
            pass
        install_stack_dump()  # a worker the agent exec'd (no zygote) gets the handler here
        install_collective_hook()  # and its collectives count for --hang-timeout from here
        try:
            return fn(*args, **kwargs)
        except SystemExit as e:
            if e.code in (0, None):
                return None
            raise
        except NonRetryableError as e:
            write_error_file(e, retryable=False)
            traceback.print_exc()
            sys.stderr.flush()
            raise SystemExit(NON_RETRYABLE_EXIT_CODE) from e
        except Exception as e:
            write_error_file(e, retryable=True)
            raise

    return wrapper


def _timer_client(path: str) -> Any:
    client = _timer_clients.get(path)
    if client is None:
        from torch.distributed.elastic import timer  # lazy: only workers that use timers pay

        client = timer.FileTimerClient(path)
        # torch's own timer.expires() then works in this worker without more setup
        timer.configure(client)
        _timer_clients[path] = client
    return client


class expires:
    """Kill this worker (and restart the group within the budget) if the block takes
    longer than ``after`` seconds.

    Configures torch's ``FileTimerClient`` from ``TORCHELASTIC_TIMER_FILE`` (set by the
    agent) on first use, so torch's own ``torch.distributed.elastic.timer.expires()`` works
    afterwards too. Only the stuck worker's process group is killed, never the agent.
    ``scope`` names the timer in the step result (default: the caller's ``file#line``).
    Without the agent it does nothing.

    Args:
        after: seconds the block may take (> 0).
        scope: the timer's name in the step result; ``None``: the caller's ``file#line``.

    Raises:
        ValueError: ``after`` is not positive.

    Example::

        with torchstep.expires(after=120, scope="allreduce"):
            dist.all_reduce(t)
    """

    def __init__(self, after: float, scope: str | None = None) -> None:
        if after <= 0:
            raise ValueError(f"expires(after=...) must be > 0, got {after!r}")
        self.after = float(after)
        if scope is None:
            caller = sys._getframe(1)
            scope = f"{caller.f_code.co_filename}#{caller.f_lineno}"
        self.scope = scope
        self._client: Any = None

    def __enter__(self) -> expires:
        path = _env(TIMER_FILE_ENV)
        if path is not None:
            self._client = _timer_client(path)
            self._client.acquire(self.scope, time.time() + self.after)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._client is not None:
            self._client.release(self.scope)
            self._client = None


def heartbeat() -> None:
    """Tell the agent this worker is alive (for ``--heartbeat-timeout``).

    Cheap enough to call every step: it touches a file at most every 50 ms. A worker that
    has not called it for ``--heartbeat-timeout`` seconds (counted from its start) is
    killed with its process group and the group restarts within the budget.

    Example::

        for batch in loader:
            train(batch)
            torchstep.heartbeat()
    """
    global _last_heartbeat
    install_stack_dump()
    path = _env(HEARTBEAT_FILE_ENV)
    if path is None:
        return
    now = time.monotonic()
    if now - _last_heartbeat < _HEARTBEAT_MIN_INTERVAL_S:
        return
    _last_heartbeat = now
    try:
        os.utime(path)
    except FileNotFoundError:
        with open(path, "a"):
            pass


def install_stack_dump() -> bool:
    """Let the agent collect this worker's Python stacks (all threads) when it stops the
    group (a timeout, a cancel, a timer, the watchdog, ``--hang-timeout``).

    Registers :func:`faulthandler.register` for :data:`torchstep.contract.STACKS_SIGNAL`,
    writing to ``TORCHSTEP_STACKS_FILE`` (set by the agent); the file's first line names this
    process, which tells the agent the handler is there (it never sends the signal to a
    process without it). The agent's worker zygote calls it for every worker it forks; a
    Python worker the agent exec'd has it from the exec wrapper's ``sitecustomize`` (then
    this finds it and returns True), else from :func:`record`, :func:`heartbeat` or
    :func:`progress`. Idempotent; without the agent it does nothing.

    Returns:
        Whether the handler is installed (now or before).

    Example::

        torchstep.worker.install_stack_dump()   # first thing in a script not using @torchstep.record
    """
    global _stacks_file, _stacks_found
    path = _env(ENV_STACKS_FILE)
    if path is None:
        return False
    if _stacks_file is not None:  # here, or in the worker this process was forked from
        return True
    if _stacks_found is not None:
        return _stacks_found
    try:
        # O_EXCL: the file is the rank's main process's; a subprocess that inherited the
        # variable leaves it alone
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        try:
            existing = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                first = os.read(existing, 128).split(b"\n", 1)[0]
            finally:
                os.close(existing)
        except OSError:
            first = b""
        _stacks_found = first == f"torchstep stacks of pid {os.getpid()}".encode()
        return _stacks_found
    except OSError as e:  # the agent then says "no stack handler"
        print(f"torchstep: no stack dump handler: {e}", file=sys.stderr)
        return False
    f = os.fdopen(fd, "w")
    try:
        faulthandler.register(STACKS_SIGNAL, file=f, all_threads=True, chain=False)
        f.write(f"torchstep stacks of pid {os.getpid()}\n")  # after: the agent signals only a handled pid
        f.flush()
    except (OSError, ValueError, RuntimeError) as e:
        print(f"torchstep: no stack dump handler: {e}", file=sys.stderr)
        return False
    _stacks_file = f
    return True


#: The module-level ``torch.distributed`` calls that talk to peers (any torch 2.4 and later
#: has most of them; a name the installed torch lacks is skipped). A blocking one returning
#: means the peers took part; an ``async_op=True`` one returning means it was issued.
COLLECTIVES = (
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "monitored_barrier",
    "recv",
    "recv_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
    "send_object_list",
)
# a returning collective touches the file at most this often: a training loop calls them
# thousands of times a second, --hang-timeout counts in seconds
_COLLECTIVE_MIN_INTERVAL_S = 1.0


def install_collective_hook() -> bool:
    """Count every ``torch.distributed`` collective that returns as progress for
    ``--hang-timeout`` (a rank that prints nothing but whose ``all_reduce`` calls complete
    is not hung).

    Wraps the module-level calls of :data:`COLLECTIVES` in ``torch.distributed`` and
    ``torch.distributed.distributed_c10d``; each wrapper calls the original and returns its
    result as it is (an ``async_op=True`` work handle too, its exceptions unchanged), then
    touches ``TORCHSTEP_COLLECTIVES_FILE`` at most once a second: under 1 µs a call
    otherwise (a gloo ``all_reduce`` of a small tensor takes 30-150 µs). Collectives that torch calls from C++ (DDP's gradient buckets) or code that
    bound a collective before the hook (``from torch.distributed import all_reduce`` in a
    module imported earlier) are not seen: print or call :func:`progress` there. The
    agent's worker zygote calls it for every worker it forks; a worker the agent exec'd
    gets it from :func:`record`. Idempotent; without ``--hang-timeout`` (no such variable)
    or before ``torch.distributed`` is imported it does nothing.

    Returns:
        Whether the collectives are wrapped (now or before).

    Example::

        import torch.distributed as dist
        torchstep.worker.install_collective_hook()   # a script not using @torchstep.record
    """
    global _collectives_file
    path = _env(ENV_COLLECTIVES_FILE)
    if path is None:
        return False
    if _collectives_file is not None:
        return True
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    dist = sys.modules.get("torch.distributed")
    if c10d is None or dist is None:  # never import torch for it: the script did not use it (yet)
        return False
    compiling = _is_compiling(sys.modules.get("torch.compiler"))
    wrapped: dict[int, Callable[..., Any]] = {}  # one wrapper per function, whichever module names it
    for name in COLLECTIVES:
        for module in (c10d, dist):
            original = getattr(module, name, None)
            if callable(original) and not getattr(original, "__torchstep_collective__", False):
                if id(original) not in wrapped:
                    wrapped[id(original)] = _counted(original, compiling)
                setattr(module, name, wrapped[id(original)])
    _collectives_file = path
    return True


def _is_compiling(compiler: Any) -> Callable[[], bool]:
    """``torch.compiler.is_compiling`` (torch >= 2.3), else always False."""
    fn = getattr(compiler, "is_compiling", None)
    return fn if callable(fn) else (lambda: False)


def _counted(original: Callable[..., Any], compiling: Callable[[], bool]) -> Callable[..., Any]:
    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        # under torch.compile the check folds to True: nothing of ours enters the graph
        if not compiling():
            _collective_returned()
        return result

    collective.__torchstep_collective__ = True  # type: ignore[attr-defined]
    return collective


def _collective_returned() -> None:
    global _collective_touched
    now = time.monotonic()
    path = _collectives_file
    if path is None or now - _collective_touched < _COLLECTIVE_MIN_INTERVAL_S:
        return
    _collective_touched = now
    try:
        os.utime(path)
    except FileNotFoundError:
        try:
            with open(path, "a"):
                pass
        except OSError:
            pass
    except OSError:  # advisory: never fail the user's collective for it
        pass


def progress(step: float, total: float | None = None) -> None:
    """Report how far this worker is: ``step`` of ``total`` (e.g. batches or epochs).

    The agent logs it every 30 s (``progress 120/1000 (12%), ETA 3m20s``), puts the lowest
    rank's last report in the step result (``progress``: step, total, rate, ETA) and counts
    it as progress for ``--hang-timeout``. Cheap enough to call every step: the file is
    rewritten at most every 0.2 s (and always when ``step`` reaches ``total``). It also
    counts as a :func:`heartbeat`. Without the agent it does nothing.

    Args:
        step: steps done so far (>= 0).
        total: steps in all; ``None``: not known (no percentage, no ETA).

    Raises:
        ValueError: ``step`` is negative or not a number, or ``total`` is not positive.

    Example::

        for i, batch in enumerate(loader):
            train(batch)
            torchstep.progress(i + 1, len(loader))
    """
    global _progress_first, _progress_written
    if isinstance(step, bool) or not isinstance(step, int | float) or not step >= 0:
        raise ValueError(f"progress(step=...) must be a number >= 0, got {step!r}")
    if total is not None and (isinstance(total, bool) or not isinstance(total, int | float) or not total > 0):
        raise ValueError(f"progress(total=...) must be a number > 0 or None, got {total!r}")
    heartbeat()
    path = _env(ENV_PROGRESS_FILE)
    if path is None:
        return
    now = time.time()
    if _progress_first is None or step < _progress_first[0]:  # a restart from an earlier step
        _progress_first = (float(step), now)
    last = total is not None and step >= total
    if not last and now - _progress_written < _PROGRESS_MIN_INTERVAL_S:
        return
    _progress_written = now
    data = {
        "step": step,
        "total": total,
        "time": now,
        "first_step": _progress_first[0],
        "first_time": _progress_first[1],
    }
    try:
        write_text_atomic(path, json.dumps(data))
    except OSError as e:  # progress is advisory: never fail a training step for it
        print(f"torchstep: cannot write progress file {path}: {e}", file=sys.stderr)


def output(name: str, value: Any) -> None:
    """Publish a JSON-serialisable ``value`` under ``name``.

    The values of global rank 0 (its last value per name, from the last attempt) land in
    the step result's ``outputs`` — Airflow XCom, Prefect task result, KFP output. Other
    ranks may call it too; their values are kept in their own files but not reported.
    Without the agent (no output file configured) the value is checked, then dropped.

    A non-finite number (``float("nan")``, a diverged loss) is published as the string
    ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``, and the result's ``warnings`` say so:
    JSON has no such numbers and orchestrators refuse them.

    Args:
        name: the output's name (non-empty); a later value under the same name wins.
        value: any JSON-serialisable value, nested at most 64 levels
            (:data:`~torchstep.untrusted.MAX_JSON_DEPTH`).

    Raises:
        ValueError: ``name`` is empty or not a string, ``value`` is not JSON-serialisable
            or nested too deep, or the outputs would exceed
            :data:`~torchstep.untrusted.MAX_OUTPUTS_BYTES` (1 MiB: save large data to a
            file and publish its path).

    Example::

        if dist.get_rank() == 0:
            torchstep.output("checkpoint", "s3://bucket/ckpt/step-1000")
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"output name must be a non-empty string, got {name!r}")
    if json_safe(value, max_depth=MAX_JSON_DEPTH)[0] is None and value is not None:
        raise ValueError(f"output {name!r} is nested deeper than {MAX_JSON_DEPTH} levels: publish a flatter value")
    try:
        encoded = json.dumps(value)  # NaN stays NaN here: the agent's reader makes it "NaN" with a warning
    except (TypeError, ValueError) as e:
        raise ValueError(f"output {name!r} is not JSON-serialisable: {e}") from e
    if len(encoded) > MAX_OUTPUTS_BYTES:
        raise ValueError(
            f"output {name!r} is {len(encoded)} bytes of JSON, over the {MAX_OUTPUTS_BYTES}-byte cap on a step's "
            "outputs: save large data to a file (or a URI) and publish its path"
        )
    path = _env(OUTPUT_FILE_ENV)
    if path is None:
        return
    with _lock:
        raw, _ = read_capped(path, MAX_OUTPUTS_BYTES, what="outputs file")  # never blocks on a FIFO
        try:  # json, not parse_json: a NaN stays NaN for the agent to warn about
            data = json.loads(raw) if raw else {}
        except (ValueError, RecursionError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        data[name] = json.loads(encoded)
        text = json.dumps(data)
        if len(text) > MAX_OUTPUTS_BYTES:
            raise ValueError(
                f"the outputs with {name!r} are {len(text)} bytes of JSON, over the {MAX_OUTPUTS_BYTES}-byte cap "
                "on a step's outputs: save large data to a file (or a URI) and publish its path"
            )
        write_text_atomic(path, text)


def checkpoint_dir() -> str | None:
    """The step's checkpoint directory (local run option ``checkpoint_dir``: the same for
    every try of the step), or ``None`` when the step has none.

    Example::

        ckpt_dir = torchstep.checkpoint_dir() or "/tmp/ckpt"
    """
    return os.environ.get(ENV_CHECKPOINT_DIR) or None


def last_checkpoint() -> str | None:
    """The newest complete checkpoint in :func:`checkpoint_dir` *now* (a worker restarted
    by the agent sees what its predecessor saved), else the one the launcher saw when the
    replica started, else ``None``. See :mod:`torchstep.checkpoints` for what counts: the
    directory and the chosen entry are checked on every call, and an entry another user
    owns (or could have written) is never returned (a ``CheckpointWarning`` says why).

    Example::

        start = load(path) if (path := torchstep.last_checkpoint()) else 0

    Returns:
        The path, or ``None``.

    Raises:
        torchstep.files.UnsafePathError: the checkpoint directory, or one above it, could be
            written by someone else (the message names it and the fix).
    """
    directory = checkpoint_dir()
    if directory is not None:
        from torchstep.checkpoints import latest_checkpoint

        return latest_checkpoint(directory)
    return os.environ.get(ENV_LAST_CHECKPOINT) or None
