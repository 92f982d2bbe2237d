"""The worker zygote (``torchstep-agent --zygote``): one process per agent that imports
torch once and forks every Python worker from there, so a worker (re)start costs a fork
instead of a new interpreter plus ``import torch`` (most of a restart's time).

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
  ``torchstep.expires()`` timer (which reports the worker's own pid) to its rank.

Single-threaded on purpose (a selector loop): forking from a process with other Python
threads could copy a held lock into the child. torch is imported before the first fork
and no accelerator is initialised here (CUDA cannot be used across fork).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import runpy
import selectors
import signal
import socket
import struct
import sys
import threading
import traceback
from typing import Any

#: Signals a worker gets back with their default action (the zygote changes them).
_RESET = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_MAX_MESSAGE = 4 << 20
#: Read only when an interpreter starts or torch loads: a worker whose environment differs
#: from the zygote's in one of them would not behave as a fresh one, so it is exec'd instead.
_STARTUP_ENV = (
    *("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONPLATLIBDIR"),
    *("PYTHONHASHSEED", "PYTHONMALLOC", "PYTHONDEVMODE", "PYTHONUTF8", "PYTHONOPTIMIZE", "PYTHONWARNINGS"),
    *("PYTHONDONTWRITEBYTECODE", "PYTHONFAULTHANDLER", "PYTHONTRACEMALLOC", "PYTHONINTMAXSTRDIGITS", "PYTHONVERBOSE"),
    *("LD_PRELOAD", "LD_LIBRARY_PATH", "MKL_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY"),
)
_PR_SET_PDEATHSIG = 1


def _pdeathsig(sig: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except Exception:  # not Linux: the agent's reaper still kills the groups
        pass


class Zygote:
    """The fork server (see the module docstring)."""

    def __init__(self, path: str, map_dir: str, reaper_fd: int | None, startup_env: dict[str, str | None]) -> None:
        self.map_dir = map_dir
        self.reaper_fd = reaper_fd
        self.startup_env = startup_env  # the environment torch was imported under
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path)
        os.chmod(path, 0o600)
        self.listener.listen(64)
        self.children: dict[int, socket.socket | None] = {}  # worker pid -> its wrapper's connection
        self.conns: dict[socket.socket, int | None] = {}  # wrapper connection -> worker pid
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the loop through the wakeup fd
        signal.signal(signal.SIGTERM, self._terminate)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the agent
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")

    def serve(self) -> None:
        while True:
            for key, _ in self.sel.select():
                if key.data == "accept":
                    conn, _ = self.listener.accept()
                    self.conns[conn] = None
                    self.sel.register(conn, selectors.EVENT_READ, "conn")
                elif key.data == "wake":
                    with contextlib.suppress(BlockingIOError, InterruptedError):
                        os.read(self.wake_r, 4096)
                    self._reap()
                else:
                    self._on_conn(key.fileobj)  # type: ignore[arg-type]

    def _on_conn(self, conn: socket.socket) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(conn, _MAX_MESSAGE, 3)
        except OSError:
            data, fds = b"", []
        pid = self.conns.get(conn)
        if not data:  # the wrapper is gone (killed): its worker goes too
            self._drop(conn)
            if pid is not None and pid in self.children:
                self.children[pid] = None
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            return
        if pid is not None or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            return
        request = json.loads(data)
        refusal = self._refusal(request["env"])
        if refusal:  # the wrapper execs the worker instead (and says why in the worker's log)
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(OSError):
                conn.send(f"refused {refusal}".encode())
            self._drop(conn)
            return
        wrapper = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the forked worker (tested end to end)
            self._become_worker(request, fds, conn)
        for fd in fds:
            os.close(fd)
        self.children[child] = conn
        self.conns[conn] = child
        self._note(f"g {child}")
        with contextlib.suppress(OSError):
            with open(os.path.join(self.map_dir, str(child)), "w") as f:
                f.write(str(wrapper))
        try:
            conn.send(f"pid {child}".encode())
        except OSError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child, signal.SIGKILL)

    def _refusal(self, env: dict[str, str]) -> str:
        """Why a worker with ``env`` cannot be forked from here ("" if it can)."""
        if threading.active_count() != 1:  # a thread could hold a lock the child then inherits
            return "the zygote runs a Python thread"
        for key in _STARTUP_ENV:
            if env.get(key) != self.startup_env[key]:
                return f"{key} differs from the agent's"
        omp = env.get("OMP_NUM_THREADS")
        if omp != self.startup_env["OMP_NUM_THREADS"] and not (omp and omp.isdigit() and int(omp) > 0):
            return "OMP_NUM_THREADS differs from the agent's"  # a number is applied in the child
        return ""

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
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

    def _terminate(self, signum: int, frame: Any) -> None:
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        os._exit(0)

    # -- in the forked child --------------------------------------------------------------------
    def _become_worker(self, request: dict[str, Any], fds: list[int], conn: socket.socket) -> None:
        code = 1
        try:
            os.setsid()
            _pdeathsig(signal.SIGKILL)  # the zygote (our parent) gone: so are we
            signal.set_wakeup_fd(-1)
            for sig in _RESET:
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            for fd in {*fds, self.wake_r, self.listener.fileno(), conn.fileno(), *(c.fileno() for c in self.conns)}:
                if fd > 2:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            if self.reaper_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self.reaper_fd)
            os.environ.clear()
            os.environ.update(request["env"])
            os.chdir(request["cwd"])
            omp = os.environ.get("OMP_NUM_THREADS")
            if omp != self.startup_env["OMP_NUM_THREADS"] and omp and int(omp) > 0:
                # OpenMP read the zygote's value when torch loaded: apply the worker's
                sys.modules["torch"].set_num_threads(int(omp))
            _unbuffered_stdio()
            code = _run(request)
        except BaseException:  # our own setup failed: say so in the worker's log
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)


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


# -- the agent's side ---------------------------------------------------------------------------------
#: Where the exec wrapper finds the zygote (set in the agent's environment, so every worker's).
SOCKET_ENV = "TORCHSTEP_ZYGOTE_SOCKET"
#: Where the agent finds the wrapper of a zygote-forked worker pid (for its timers).
MAP_DIR_ENV = "TORCHSTEP_ZYGOTE_MAP_DIR"


class ZygoteProcess:
    """The agent's handle on its zygote: :meth:`stop` kills it and every worker it forked.

    :meth:`prestart` starts it at the agent's very start, so its ``import torch`` runs
    alongside the agent's own (on 2 cores, both take the time of one); :meth:`configure`
    then tells it where to listen, once the agent has its run directory and reaper.
    """

    def __init__(self, proc: Any, control: socket.socket) -> None:
        self.proc = proc
        self.control = control

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
        """Have the zygote listen in the private ``run_dir`` and report the groups it forks
        to ``reaper_fd``; point the wrappers at it (through the environment)."""
        if self.proc.poll() is not None:
            raise OSError(f"the worker zygote exited ({self.proc.returncode})")
        map_dir = os.path.join(run_dir, "zygote")
        os.mkdir(map_dir, 0o700)
        path = os.path.join(map_dir, "socket")
        config = json.dumps({"socket": path, "map_dir": map_dir}).encode()
        socket.send_fds(self.control, [config], [] if reaper_fd is None else [reaper_fd])
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

    def stop(self) -> None:
        """Kill the zygote (its SIGTERM handler SIGKILLs every group it forked) and wait."""
        os.environ.pop(SOCKET_ENV, None)
        self.control.close()  # an unconfigured zygote exits on its own at this end of input
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(10)
        except Exception:
            self.proc.kill()
            self.proc.wait()


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


def _configuration(control: int) -> tuple[dict[str, str], int | None]:
    """Wait for the agent's :meth:`ZygoteProcess.configure` (exit at end of input: the
    agent ended or chose not to use the zygote)."""
    sock = socket.socket(fileno=control)
    try:
        data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 1)
    except OSError:
        data, fds = b"", []
    if not data:
        os._exit(0)
    return json.loads(data), (fds[0] if fds else None)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="torchstep.agent.zygote")
    ap.add_argument("--control", type=int, default=None, help="the agent's end of a socketpair (configure)")
    ap.add_argument("--socket", help="listen here (without --control)")
    ap.add_argument("--map-dir", help="worker pid -> wrapper pid files (without --control)")
    ap.add_argument("--ready", default=None, help="file written once the socket listens")
    ap.add_argument("--reaper-fd", type=int, default=None)
    ns = ap.parse_args(argv)
    _pdeathsig(signal.SIGTERM)  # the agent died: kill every worker group (SIGTERM handler), then exit
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the agent
    startup_env = {k: os.environ.get(k) for k in (*_STARTUP_ENV, "OMP_NUM_THREADS")}
    if ns.control is not None:  # torch first: the agent is busy with its own imports meanwhile
        _import_torch()
        config, ns.reaper_fd = _configuration(ns.control)
        ns.socket, ns.map_dir = config["socket"], config["map_dir"]
    if not ns.socket or not ns.map_dir:
        ap.error("--control, or --socket and --map-dir, are required")
    zygote = Zygote(ns.socket, ns.map_dir, ns.reaper_fd, startup_env)  # listening: a request waits
    if ns.ready:
        with open(ns.ready, "w") as f:
            f.write(str(os.getpid()))
    _import_torch()
    zygote.serve()


def _import_torch() -> None:
    """The point: every worker forked from here has these imported."""
    import torch
    import torch.distributed
    import torch.distributed.elastic.multiprocessing.errors  # what @record needs

    del torch


if __name__ == "__main__":
    main()
