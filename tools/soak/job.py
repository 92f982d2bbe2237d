"""The soak job: every rank prints numbered lines ``soak rank=R attempt=A pid=P line=N`` in lockstep
(one ``all_reduce`` per line), rank 0 checkpoints the last line every rank has printed, and a
restarted or retried worker resumes after the checkpoint — so a lost or duplicated line is a
bug, not a re-run. Run under ``torchstep-agent`` (2 replicas x 2 processes in the campaign).

In-worker faults, driven by the environment (each fires once per run: an ``O_EXCL`` marker in
the checkpoint dir), on rank ``SOAK_FAULT_RANK`` just before it prints line ``SOAK_FAULT_LINE``:

- ``exit``: exit 3 (retryable);
- ``nonretryable``: raise ``torchstep.NonRetryableError`` (exit 82, never retried);
- ``stop``: SIGSTOP itself (nothing ends it but the run's timeout);
- ``stop_timer``: SIGSTOP itself inside ``torchstep.expires(after=2)`` (the agent's timer kills it);
- ``flood``: write 20 MiB to stdout, then exit 3;
- ``daemon``: leave a double-forked daemon (``setsid``) sleeping 600 s, and carry on.

``SOAK_TAIL_S`` keeps every rank alive that long after its last line (a cancel through a
CLI takes seconds to land). Every rank also writes ``SOAK_PROGRESS/rank<R>`` (``<pid> <line>``) so the harness can
inject external faults (SIGKILL a rank or its agent, fill the log disk) at a line number; rank
``SOAK_HOLD_RANK`` waits after line ``SOAK_HOLD_LINE`` (once) until the harness writes
``SOAK_PROGRESS/go``, so the run cannot end before the fault strikes.

``pid=P`` names the worker process. In a pod's own PID namespace (the kubernetes surface sets
``SOAK_WORKER_ID=random``) pids repeat from pod to pod and across a pod's replacement, so a
worker prints a random 9-digit number there instead, drawn once per process.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time

import torch
import torch.distributed as dist
import torchstep


def once(ckpt: str, name: str) -> bool:
    """True the first time ``name`` is asked for in ``ckpt`` (an O_EXCL marker file)."""
    try:
        os.close(os.open(os.path.join(ckpt, f".fault-{name}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except FileExistsError:
        return False


def hold(progress: str) -> None:
    """Wait (``SOAK_HOLD_MAX_S`` at most) for the harness's ``go``: it injects the external fault meanwhile."""
    deadline = time.monotonic() + float(os.environ.get("SOAK_HOLD_MAX_S", "30"))
    while not os.path.exists(os.path.join(progress, "go")) and time.monotonic() < deadline:
        time.sleep(0.02)


def write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def daemon() -> None:
    """Double fork + setsid: a process that left the worker's group and session."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            time.sleep(600)
        os._exit(0)
    os.wait()


def fault(kind: str) -> None:
    if kind == "exit":
        print("soak-fault: exit 3", flush=True)
        sys.exit(3)
    if kind == "nonretryable":
        raise torchstep.NonRetryableError("soak-fault: non-retryable")
    if kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif kind == "stop_timer":
        with torchstep.expires(after=2, scope="soak"):
            os.kill(os.getpid(), signal.SIGSTOP)
    elif kind == "flood":
        block = ("x" * 1023 + "\n") * 1024  # 1 MiB of non-numbered lines
        for _ in range(20):
            sys.stdout.write(block)
        sys.stdout.flush()
        sys.exit(3)
    elif kind == "daemon":
        daemon()


@torchstep.record
def main() -> None:
    lines = int(os.environ.get("SOAK_LINES", "12"))
    interval = float(os.environ.get("SOAK_INTERVAL", "0.2"))
    ckpt, progress = os.environ["SOAK_CKPT"], os.environ["SOAK_PROGRESS"]
    kind = os.environ.get("SOAK_FAULT", "")
    fault_rank = int(os.environ.get("SOAK_FAULT_RANK", "-1"))
    fault_line = int(os.environ.get("SOAK_FAULT_LINE", "-1"))
    hold_rank = int(os.environ.get("SOAK_HOLD_RANK", "-1"))
    hold_line = int(os.environ.get("SOAK_HOLD_LINE", "-1"))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ident = os.getpid()
    if os.environ.get("SOAK_WORKER_ID") == "random":  # pids repeat across PID namespaces
        ident = random.SystemRandom().randrange(10**8, 10**9)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    done_file = os.path.join(ckpt, "done")
    try:
        with open(done_file) as f:
            start = int(f.read()) + 1
    except FileNotFoundError:
        start = 0
    for n in range(start, lines):
        t = torch.ones(1)
        dist.all_reduce(t)  # every rank printed line n-1: it is done
        if rank == 0 and n > start:
            write_atomic(done_file, str(n - 1))
        if kind and rank == fault_rank and n == fault_line and once(ckpt, kind):
            fault(kind)
        print(f"soak rank={rank} attempt={attempt} pid={ident} line={n}", flush=True)
        write_atomic(os.path.join(progress, f"rank{rank}"), f"{ident} {n}")
        if rank == hold_rank and n == hold_line and once(ckpt, "hold"):
            hold(progress)
        time.sleep(interval)
    time.sleep(float(os.environ.get("SOAK_TAIL_S", "0")))  # still running when a slow cancel lands
    dist.barrier()
    if rank == 0:
        write_atomic(done_file, str(lines - 1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
