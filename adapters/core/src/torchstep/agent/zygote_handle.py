"""The agent's side of the worker zygote (``torchstep.agent.zygote``): start it, hand it
its listening socket, notice its death, hear which workers it did not fork, stop it.

No torch import here.

Example (what :mod:`torchstep.agent.cli` and :mod:`torchstep.agent.runner` do)::

    zygote = ZygoteProcess.fork(startup_env)       # right after the agent imported torch
    zygote.configure(run_dir, reaper.command_fd()) # later: wrappers now find it
    zygote.running()                               # False once it died (one warning)
    zygote.stop()
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from typing import Any

from torchstep.agent.forksafe import accelerator_in_use
from torchstep.agent.zygote import forked, listen_at

log = logging.getLogger("torchstep.agent")

#: Where the exec wrapper finds the zygote (set in the agent's environment, so every worker's).
SOCKET_ENV = "TORCHSTEP_ZYGOTE_SOCKET"
#: Where the agent finds the wrapper of a zygote-forked worker pid (for its timers).
MAP_DIR_ENV = "TORCHSTEP_ZYGOTE_MAP_DIR"
#: The longest AF_UNIX socket path Linux binds (sun_path is 108 bytes with its NUL). A run
#: dir deeper than that gets the socket in a new 0700 directory of its own under
#: SHORT_SOCKET_ROOT (sticky and root-owned: nobody else can take or replace the name).
SOCKET_PATH_MAX = 107
SHORT_SOCKET_ROOT = "/tmp"


class ZygoteProcess:
    """The agent's handle on its zygote: :meth:`stop` kills it and every worker it forked.

    :meth:`fork` makes it a child of the agent right after the agent imported torch (no
    second import: the pages are shared); :meth:`prestart` starts a fresh interpreter
    instead (which imports torch itself), where forking the agent is not safe.
    :meth:`configure` then hands it its listening socket, once the agent has its run
    directory and reaper.
    :meth:`running` notices its death (then the wrappers stop using it); :meth:`fallbacks`
    says which workers it declined to fork, and why.
    """

    def __init__(self, proc: Any, control: socket.socket) -> None:
        self.proc = proc
        self.control = control
        self.socket_path: str | None = None
        self.short_dir: str | None = None  # the socket's own directory when the run dir is too deep
        self._gone = False  # stopped, or found dead (and said so)

    @staticmethod
    def fork(startup_env: dict[str, str | None]) -> ZygoteProcess:
        """Fork the zygote from this process, which has imported torch; a fresh interpreter
        (:meth:`prestart`) where that is not safe: another thread runs here, or an
        accelerator runtime is initialised here (an embedding program's).

        Args:
            startup_env: ``zygote.startup_environment()`` taken before torch loaded.

        Returns:
            The handle; :meth:`configure` it next.
        """
        why = "another thread runs" if threading.active_count() != 1 else accelerator_in_use()
        if why:
            log.info("the worker zygote is a new interpreter, not a fork of the agent: %s", why)
            return ZygoteProcess.prestart()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for stream in (sys.stdout, sys.stderr):  # nothing buffered twice
            with contextlib.suppress(Exception):
                stream.flush()
        parent = os.getpid()
        # no agent signal handler may run in the child before it has its own
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the zygote (tested end to end)
                try:
                    ours.close()
                    forked(theirs, startup_env, parent, mask)
                finally:
                    os._exit(1)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        theirs.close()
        return ZygoteProcess(_Forked(pid), ours)

    @staticmethod
    def prestart() -> ZygoteProcess:
        """Start the zygote (it imports torch, then waits for :meth:`configure`)."""
        import subprocess

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-m", "torchstep.agent.zygote", "--control", str(theirs.fileno())]
        try:
            proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        return ZygoteProcess(proc, ours)

    def configure(self, run_dir: str, reaper_fd: int | None) -> None:
        """Listen in the private ``run_dir`` and hand the zygote the only copy of the
        listening socket (so a connect is refused the moment it is gone), with ``reaper_fd``
        for the groups it forks; point the wrappers at it (through the environment)."""
        if self.proc.poll() is not None:
            raise OSError(f"the worker zygote exited ({self.proc.returncode})")
        map_dir = os.path.join(run_dir, "zygote")
        os.mkdir(map_dir, 0o700)
        path = os.path.join(map_dir, "socket")
        if len(os.fsencode(path)) > SOCKET_PATH_MAX:  # a deep run dir (TMPDIR, --log-dir)
            self.short_dir = tempfile.mkdtemp(prefix="torchstep-z", dir=SHORT_SOCKET_ROOT)  # 0700, a new name
            path = os.path.join(self.short_dir, "s")
        listener = listen_at(path)  # before the zygote has imported torch: a connect waits, not fails
        self.socket_path = path
        try:
            config = json.dumps({"socket": path, "map_dir": map_dir}).encode()
            fds = [listener.fileno(), *([] if reaper_fd is None else [reaper_fd])]
            socket.send_fds(self.control, [config], fds)
        except OSError:
            self._remove_socket()
            raise
        finally:
            listener.close()
        self.control.setblocking(False)
        os.environ[SOCKET_ENV] = path
        os.environ[MAP_DIR_ENV] = map_dir

    @staticmethod
    def start(run_dir: str, reaper_fd: int | None) -> ZygoteProcess:
        """:meth:`prestart` and :meth:`configure` at once."""
        zygote = ZygoteProcess.prestart()
        try:
            zygote.configure(run_dir, reaper_fd)
        except OSError:
            zygote.stop()
            raise
        return zygote

    def running(self) -> bool:
        """Whether the zygote still serves. The first call that finds it dead says so in one
        warning and stops its use: the wrappers are no longer pointed at it (they exec) and
        its socket is removed."""
        if self._gone:
            return False
        code = self.proc.poll()
        if code is None:
            return True
        self._gone = True
        self._forget()
        how = f"killed by {_signal_name(-code)}" if code < 0 else f"exit {code}"
        if getattr(self.proc, "unknown", False):
            how = "exit status unknown"
        log.warning(
            "the worker zygote died (%s): workers start by exec from now on; any it had forked died with it", how
        )
        return False

    def fallbacks(self) -> list[tuple[int, str]]:
        """``(wrapper pid, why)`` of every worker the zygote declined to fork since the last
        call (its wrapper exec'd the worker)."""
        found = []
        while True:
            try:
                data = self.control.recv(4096, socket.MSG_DONTWAIT)
            except OSError:  # nothing more (or stopped)
                break
            if not data:
                break
            kind, _, rest = data.decode("utf-8", "replace").partition(" ")
            pid, _, why = rest.partition(" ")
            if kind == "exec" and pid.isdigit():
                found.append((int(pid), why))
        return found

    def stop(self) -> None:
        """Kill the zygote (its SIGTERM handler SIGKILLs every group it forked), wait, and
        remove its socket."""
        self._gone = True
        self._forget()
        self.control.close()  # an unconfigured zygote exits on its own at this end of input
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(10)
        except Exception:
            self.proc.kill()
            self.proc.wait()
        self._remove_socket()

    def _forget(self) -> None:
        if os.environ.get(SOCKET_ENV) == self.socket_path:
            os.environ.pop(SOCKET_ENV, None)
        self._remove_socket()

    def _remove_socket(self) -> None:
        if self.socket_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.socket_path)
        if self.short_dir is not None:
            with contextlib.suppress(OSError):
                os.rmdir(self.short_dir)


class _Forked:
    """What :class:`ZygoteProcess` needs of ``subprocess.Popen``, for a child made by ``os.fork``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.unknown = False  # its exit status was collected elsewhere

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: gone, how is unknown
                self.returncode, self.unknown = 255, True
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"pid {self.pid} still running after {timeout} s")
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def worker_ended(wrapper: int, *, forget: bool = False) -> float | None:
    """When the zygote-forked worker behind exec wrapper ``wrapper`` ended (the worker's own
    clock just before it exited, or when the zygote reaped a killed one), or None: not one,
    or not ended. The wrapper itself exits a moment later. ``forget``: remove the record
    (the wrapper is gone: its pid may be reused).

    Example: ``worker_ended(w.pid) or exit_info.time`` orders failures by the worker's end.
    """
    map_dir = os.environ.get(MAP_DIR_ENV)
    if not map_dir:
        return None
    path = os.path.join(map_dir, f"exited.{wrapper}")
    try:
        with open(path) as f:
            return float(f.read())
    except (OSError, ValueError):
        return None
    finally:
        if forget:
            with contextlib.suppress(OSError):
                os.unlink(path)


def wrapper_of(pid: int) -> int | None:
    """The exec wrapper's pid of the zygote-forked worker ``pid`` (None: not one)."""
    map_dir = os.environ.get(MAP_DIR_ENV)
    if not map_dir:
        return None
    try:
        with open(os.path.join(map_dir, str(pid))) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None
