"""The worker zygote (on by default; ``--no-zygote`` / ``TORCHSTEP_ZYGOTE=0`` turn it off):
one process per agent, forked from the agent right after it imported torch (:func:`forked`;
a fresh interpreter that imports torch itself where that is not safe), that forks every
Python worker, so a worker (re)start costs a fork instead of a new interpreter plus
``import torch`` (most of a restart's time).

    python -m torchstep.agent.zygote --socket PATH --map-dir DIR [--reaper-fd FD]

The agent still starts each worker through its exec wrapper (``_exec.py``), so torch
elastic sees the same process as without the zygote; the wrapper, instead of ``exec``,
sends the worker's argv, environment, working directory and its stdin/stdout/stderr (fd
passing, ``SCM_RIGHTS``) here, receives the worker's pid, forwards every signal it gets to
the worker's process group and exits as the worker did. So:

- a worker is in its own session and process group, like a wrapper-exec'd one;
- the wrapper killed (SIGKILL included) → this process sees its connection close and
  SIGKILLs the worker's group; this process dying (the agent died: PDEATHSIG) kills every
  group it forked; each forked group is also registered with the agent's reaper;
- ``<map-dir>/<worker pid>`` holds the wrapper's pid, so the agent maps a worker's
  ``torchstep.expires()`` timer (which reports the worker's own pid) to its rank;
- ``<map-dir>/exited.<wrapper pid>`` holds when the worker ended (its own clock just
  before it exits, else when this process reaped it): the wrapper learns of the end a
  moment later, and the agent orders failures by the worker's time, as it would an exec'd
  worker's.

Never worse than no zygote: the agent binds the listening socket and hands this process
the only copy, so once the zygote is gone (crash, OOM kill) a wrapper's connect is refused
at once and it execs the worker; a request that is not what a wrapper sends is refused
(the wrapper execs) and harms nothing; a worker that cannot be forked safely — a Python
thread or an initialised accelerator runtime here, an interpreter-start variable that
differs — is refused too (``forksafe.py``), and the agent is told why. The agent's side
is ``zygote_handle.py``.

Single-threaded on purpose (a selector loop): forking from a process with other Python
threads could copy a held lock into the child. torch is imported before the first fork
and no accelerator is initialised here (CUDA cannot be used across fork: every forked
worker initialises its own); ``forksafe.accelerator_in_use`` checks that before every fork.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import json
import os
import runpy
import selectors
import signal
import socket
import stat
import struct
import sys
import threading
import time
import traceback
from typing import Any

from torchstep.agent.forksafe import (
    MAX_REQUEST,
    STARTUP_ENV,
    BadRequest,
    accelerator_in_use,
    fork_refusal,
    parse_request,
)
from torchstep.worker import install_collective_hook, install_stack_dump

#: Signals a worker gets back with their default action (the zygote changes them).
_RESET = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_PR_SET_PDEATHSIG = 1


def _pdeathsig(sig: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except Exception:  # not Linux: the agent's reaper still kills the groups
        pass


def _own_group() -> None:
    """Leave the agent's process group. A launcher that signals the agent's whole group (the
    local target's timeout or cancel) means the agent, which first takes the workers' stacks
    and then forwards the signal with its grace period; the zygote would kill every worker at
    once. It still dies with the agent (``PR_SET_PDEATHSIG``), and so do its workers."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def listen_at(path: str) -> socket.socket:
    """A listening ``SOCK_SEQPACKET`` socket at ``path`` (mode 0600). A socket file left
    there by a zygote that died without removing it (nobody listens: a connect is refused)
    is replaced; anything else at ``path`` is an error.

    Example: ``listen_at(os.path.join(private_dir, "socket"))``.

    Args:
        path: where to listen (in a directory private to the user).

    Returns:
        The listening socket.

    Raises:
        OSError: ``path`` is taken (a live zygote, another file) or cannot be bound.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        try:
            sock.bind(path)
        except OSError as e:
            if e.errno != errno.EADDRINUSE or not _stale(path):
                raise
            os.unlink(path)
            sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def _stale(path: str) -> bool:
    """Whether ``path`` is a socket of ours that nobody listens on any more."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        probe.close()
    return False  # a live zygote listens there


class Zygote:
    """The fork server (see the module docstring): serves ``listener`` until SIGTERM or
    until the agent closes ``control``."""

    def __init__(
        self,
        listener: socket.socket,
        path: str,
        map_dir: str,
        reaper_fd: int | None,
        startup_env: dict[str, str | None],
        control: socket.socket | None = None,
    ) -> None:
        self.pid = os.getpid()
        self.path = path
        self.path_inode = os.stat(path).st_ino  # just bound (by us or the agent): ours to remove
        self.map_dir = map_dir
        self.reaper_fd = reaper_fd
        self.startup_env = startup_env  # the environment torch was imported under
        self.listener = listener
        self.listener.setblocking(False)
        self.control = control  # the agent's socketpair: why a worker was not forked goes there
        self.children: dict[int, socket.socket | None] = {}  # worker pid -> its wrapper's connection
        self.wrappers: dict[int, int] = {}  # worker pid -> its wrapper's pid
        self.conns: dict[socket.socket, int | None] = {}  # wrapper connection -> worker pid
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the loop through the wakeup fd
        signal.signal(signal.SIGTERM, self._terminate)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the agent
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        if control is not None:
            self.sel.register(control, selectors.EVENT_READ, "control")

    def serve(self) -> None:
        while True:
            for key, _ in self.sel.select():
                try:
                    self._on_event(key)
                except Exception:  # a bug here must not end this process: its workers would die with it
                    traceback.print_exc()
                    if key.data == "conn":
                        self._drop(key.fileobj)  # type: ignore[arg-type]

    def _on_event(self, key: selectors.SelectorKey) -> None:
        if key.data == "accept":
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            conn.setblocking(True)
            self.conns[conn] = None
            self.sel.register(conn, selectors.EVENT_READ, "conn")
        elif key.data == "wake":
            with contextlib.suppress(BlockingIOError, InterruptedError):
                os.read(self.wake_r, 4096)
            self._reap()
        elif key.data == "control":
            with contextlib.suppress(BlockingIOError, InterruptedError):
                if not self.control or not self.control.recv(4096, socket.MSG_DONTWAIT):
                    self._terminate(signal.SIGTERM, None)  # the agent is gone or stopped us
        else:
            self._on_conn(key.fileobj)  # type: ignore[arg-type]

    def _on_conn(self, conn: socket.socket) -> None:
        try:
            data, fds, flags, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
        except OSError:
            data, fds, flags = b"", [], 0
        pid = self.conns.get(conn)
        if not data and not fds:  # the wrapper is gone (killed): its worker goes too
            self._drop(conn)
            if pid is not None and pid in self.children:
                self.children[pid] = None
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            return
        if pid is not None:  # one request per connection: anything later is ignored
            _close_all(fds)
            return
        try:
            self._fork(conn, data, fds, flags)
        except BaseException:
            _close_all(fds)  # whatever went wrong, the passed descriptors do not leak here
            raise

    def _fork(self, conn: socket.socket, data: bytes, fds: list[int], flags: int) -> None:
        wrapper = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        try:
            request = parse_request(data, fds, flags)
            refusal = fork_refusal(request["env"], self.startup_env)
        except BadRequest as e:
            request, refusal = {}, f"bad request: {e}"
        if refusal:  # the wrapper execs the worker instead (and says why in the worker's log)
            self._refuse(conn, fds, wrapper, refusal)
            return
        exited = os.path.join(self.map_dir, f"exited.{wrapper}")
        with contextlib.suppress(OSError):
            os.unlink(exited)  # an earlier wrapper's with the same pid
        try:
            child = os.fork()
        except OSError as e:
            self._refuse(conn, fds, wrapper, f"fork failed: {e.strerror}")
            return
        if child == 0:  # pragma: no cover - runs in the forked worker (tested end to end)
            self._become_worker(request, fds, conn, exited)
        _close_all(fds)
        self.children[child] = conn
        self.wrappers[child] = wrapper
        self.conns[conn] = child
        self._note(f"g {child}")
        with contextlib.suppress(OSError):
            with open(os.path.join(self.map_dir, str(child)), "w") as f:
                f.write(str(wrapper))
        try:
            conn.send(f"pid {child}".encode(), socket.MSG_DONTWAIT)
        except OSError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child, signal.SIGKILL)

    def _refuse(self, conn: socket.socket, fds: list[int], wrapper: int, why: str) -> None:
        _close_all(fds)
        with contextlib.suppress(OSError):
            conn.send(f"refused {why}".encode(), socket.MSG_DONTWAIT)
        self._drop(conn)
        if self.control is not None:  # the agent logs it (at INFO) with the worker's rank
            with contextlib.suppress(OSError):
                self.control.send(f"exec {wrapper} {why}".encode()[:4096], socket.MSG_DONTWAIT)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            wrapper = self.wrappers.pop(pid, None)
            if wrapper is not None and not os.path.exists(os.path.join(self.map_dir, f"exited.{wrapper}")):
                _write_exit_time(os.path.join(self.map_dir, f"exited.{wrapper}"))  # killed: no time of its own
            self._note(f"ug {pid}")
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.map_dir, str(pid)))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # what the worker left in its group goes with it
            if conn is not None:
                sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
                with contextlib.suppress(OSError):
                    conn.send((f"signal {sig}" if sig else f"exit {os.waitstatus_to_exitcode(status)}").encode())
                self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        self.conns.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn)
        conn.close()

    def _note(self, line: str) -> None:
        """Tell the agent's reaper about a worker group (one line: atomic on a pipe)."""
        if self.reaper_fd is not None:
            try:
                os.write(self.reaper_fd, line.encode() + b"\n")
            except OSError:
                self.reaper_fd = None

    def remove_socket(self) -> None:
        """Unlink our socket (only if it is still ours: a new zygote may have replaced a stale one)."""
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self.path_inode:
                os.unlink(self.path)

    def _terminate(self, signum: int, frame: Any) -> None:
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        self.remove_socket()
        os._exit(0)

    # -- in the forked child --------------------------------------------------------------------
    def _become_worker(self, request: dict[str, Any], fds: list[int], conn: socket.socket, exited: str) -> None:
        code = 1
        worker = os.getpid()
        try:
            os.setsid()
            _pdeathsig(signal.SIGKILL)  # the zygote (our parent) gone: so are we
            if os.getppid() != self.pid:  # it died before prctl: nobody would kill us
                os._exit(137)
            signal.set_wakeup_fd(-1)
            for sig in _RESET:
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            self.sel.close()
            ours = {*fds, self.wake_r, self.wake_w, self.listener.fileno(), conn.fileno()}
            ours.update(c.fileno() for c in self.conns)
            if self.control is not None:
                ours.add(self.control.fileno())
            if self.reaper_fd is not None:
                ours.add(self.reaper_fd)
            for fd in ours:
                if fd > 2:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            os.environ.clear()
            os.environ.update(request["env"])
            os.chdir(request["cwd"])
            omp = os.environ.get("OMP_NUM_THREADS")
            if omp != self.startup_env["OMP_NUM_THREADS"] and omp and int(omp) > 0:
                # OpenMP read the zygote's value when torch loaded: apply the worker's
                sys.modules["torch"].set_num_threads(int(omp))
            _unbuffered_stdio()
            install_stack_dump()  # the agent can ask for this worker's stacks when it stops the group
            install_collective_hook()  # with --hang-timeout: a returning collective is progress
            code = _run(request)
        except BaseException:  # our own setup failed: say so in the worker's log
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            if os.getpid() == worker:  # not a child the worker forked that returned here
                _write_exit_time(exited)  # before our sockets close: peers see the end after this time
            os._exit(code)


def _write_exit_time(path: str) -> None:
    """``time.time()`` into ``path`` (written whole, then renamed: never read half-written)."""
    with contextlib.suppress(Exception):
        tmp = f"{path}.tmp{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, repr(time.time()).encode())
        finally:
            os.close(fd)
        os.rename(tmp, path)


def _unbuffered_stdio() -> None:
    """``python -u``: stdout and stderr written through, on the worker's fds 0-2."""
    enc = os.environ.get("PYTHONIOENCODING", "utf-8").split(":")[0] or "utf-8"
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding=enc)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding=enc, write_through=True)
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding=enc, errors="backslashreplace", write_through=True
    )


def _run(request: dict[str, Any]) -> int:
    """Run the worker's script or module as ``__main__``; its exit status as a process's."""
    import atexit

    argv = list(request["argv"])
    try:
        try:
            if request.get("module"):
                sys.argv = [request["module"], *argv]
                sys.path[0] = os.getcwd()
                runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            else:
                sys.argv = argv
                sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
                runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as e:
            code = _exit_code(e.code)
        except KeyboardInterrupt:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)  # as the interpreter does: die by SIGINT
            code = 130
        except BaseException:
            traceback.print_exc()
            code = 1
        threading._shutdown()  # type: ignore[attr-defined]  # as at interpreter exit: join non-daemon threads
        atexit._run_exitfuncs()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
    return code


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _configuration(control: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """Wait for the agent's ``ZygoteProcess.configure`` (exit at end of input: the agent
    ended or chose not to use the zygote)."""
    try:
        data, fds, _, _ = socket.recv_fds(control, 1 << 16, 2)
    except OSError:
        data, fds = b"", []
    if not data or not fds:
        os._exit(0)
    return json.loads(data), fds


def _serve_configured(control: socket.socket, startup_env: dict[str, str | None]) -> None:
    """Wait for the agent's configuration (the listening socket, the reaper's pipe), then serve."""
    config, fds = _configuration(control)
    listener = socket.socket(fileno=fds[0])
    reaper_fd = fds[1] if len(fds) > 1 else None
    zygote = Zygote(listener, config["socket"], config["map_dir"], reaper_fd, startup_env, control)
    try:
        zygote.serve()
    finally:
        zygote.remove_socket()


def forked(control: socket.socket, startup_env: dict[str, str | None], parent: int, mask: set[int]) -> None:
    """The zygote's life in a child the agent forked right after importing torch (so torch
    is not imported a second time: its pages are shared). Never returns.

    Args:
        control: the agent's socketpair (configuration in, refusals out).
        startup_env: the environment torch was imported under (before the agent changed it).
        parent: the agent's pid.
        mask: the signal mask to restore (the agent blocked its signals around the fork).
    """
    try:
        for sig in signal.valid_signals():  # the agent's handlers are not ours
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the agent
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        _pdeathsig(signal.SIGTERM)  # the agent died: kill every worker group (SIGTERM handler), then exit
        if os.getppid() != parent:  # it died before prctl
            os._exit(0)
        _own_group()
        null = os.open(os.devnull, os.O_RDONLY)  # the agent's stdin is not ours to hold
        os.dup2(null, 0)
        os.close(null)
        _import_torch()
        if accelerator_in_use():  # the agent had probed CUDA (--nproc-per-node gpu...): so would every worker
            _exec_fresh(control)
        _serve_configured(control, startup_env)
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        os._exit(1)


def _exec_fresh(control: socket.socket) -> None:
    """Become a fresh zygote interpreter (same pid, same control socket: the agent does not
    notice): a fork of an agent whose accelerator was initialised or probed is a "bad fork"
    in which no worker forked from here could use the accelerator. It imports torch itself."""
    os.set_inheritable(control.fileno(), True)
    argv = [sys.executable, "-m", "torchstep.agent.zygote", "--control", str(control.fileno())]
    os.execv(sys.executable, argv)


def startup_environment() -> dict[str, str | None]:
    """What a zygote compares each worker's environment with: this process's values of the
    variables only an interpreter's start or torch's load reads — take it before torch loads."""
    return {k: os.environ.get(k) for k in (*STARTUP_ENV, "OMP_NUM_THREADS")}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="torchstep.agent.zygote")
    ap.add_argument("--control", type=int, default=None, help="the agent's end of a socketpair (configure)")
    ap.add_argument("--socket", help="listen here (without --control)")
    ap.add_argument("--map-dir", help="worker pid -> wrapper pid files (without --control)")
    ap.add_argument("--ready", default=None, help="file written once the socket listens")
    ap.add_argument("--reaper-fd", type=int, default=None)
    ns = ap.parse_args(argv)
    _pdeathsig(signal.SIGTERM)  # the agent died: kill every worker group (SIGTERM handler), then exit
    _own_group()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the agent
    startup_env = startup_environment()
    if ns.control is not None:  # torch first: the agent is busy with its own imports meanwhile
        _import_torch()
        _serve_configured(socket.socket(fileno=ns.control), startup_env)
        return
    if not ns.socket or not ns.map_dir:
        ap.error("--control, or --socket and --map-dir, are required")
    zygote = Zygote(listen_at(ns.socket), ns.socket, ns.map_dir, ns.reaper_fd, startup_env)  # a request waits
    try:
        if ns.ready:
            with open(ns.ready, "w") as f:
                f.write(str(os.getpid()))
        _import_torch()
        zygote.serve()
    finally:
        zygote.remove_socket()


def _import_torch() -> None:
    """The point: every worker forked from here has these imported (none initialises an
    accelerator: ``forksafe.accelerator_in_use()`` stays "")."""
    import torch
    import torch.distributed
    import torch.distributed.elastic.multiprocessing.errors  # what @record needs

    del torch


if __name__ == "__main__":
    main()
