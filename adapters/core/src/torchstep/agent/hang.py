"""``--hang-timeout``, the step's progress, and NCCL's flight recorder: what the agent
watches of a running group besides exits.

* :class:`HangWatch`: the group made no progress for ``--hang-timeout`` s when no rank's
  log grew and no rank called ``torchstep.heartbeat()`` / ``torchstep.progress()`` (their
  files' times) — counted from the group's start; on several nodes, no rank of any node
  (their agents share a progress count in the rendezvous store);
* :class:`ProgressWatch`: the lowest rank's ``torchstep.progress()`` report, logged every
  :data:`PROGRESS_LOG_INTERVAL_S` (on the console and in ``agent.log``) and kept for the result;
* :func:`nccl_env`: the flight recorder's variables for a worker on a GPU machine.

Example::

    watch = HangWatch(300.0)
    watch.reset(["/logs/attempt_0/rank0.log", "/run/attempt_0/heartbeat.0"])
    watch.idle_s()          # seconds since anything moved; > 300: collect the stacks, fail the group
"""

from __future__ import annotations

import glob
import logging
import os
import re
import time
from typing import Any

from torchstep.result import progress_info, progress_line
from torchstep.untrusted import read_json_file

log = logging.getLogger("torchstep.agent")

#: How often the agent logs the step's progress (``progress 120/1000 (12%), ETA 3m20s``).
PROGRESS_LOG_INTERVAL_S = 30.0
#: How often the watches look at the files (they run on the agent's monitor tick).
POLL_S = 0.25
#: NCCL's flight recorder: entries per rank (torch's default is 0: off).
NCCL_TRACE_ENTRIES = "2000"
#: The dump files' name in the attempt's log directory (torch appends the rank).
NCCL_DUMP_PREFIX = "nccl_trace_rank_"


class HangWatch:
    """Whether the group stopped making progress (see the module docstring)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._files: list[str] = []
        self._seen: dict[str, tuple[int, int]] = {}
        self._moved = time.monotonic()
        self._polled = 0.0
        #: The other nodes' progress (:class:`torchstep.agent.liveness.LivenessMonitor`, where
        #: there is one): a node's ranks that wait in a collective for a peer node whose ranks
        #: still print or progress are not hung (seen in the soak: a replica flooding its log).
        self.peers: Any = None
        self._peers_seen = -1

    def reset(self, files: list[str]) -> None:
        """A new group started: watch ``files`` (logs, heartbeat and progress files) from now."""
        self._files = list(files)
        self._seen = {f: _stamp(f) for f in self._files}
        self._moved = time.monotonic()
        self._polled = 0.0

    def idle_s(self) -> float:
        """Seconds since any watched file last changed (looked at every :data:`POLL_S`)."""
        now = time.monotonic()
        if now - self._polled >= POLL_S:
            self._polled = now
            for f in self._files:
                stamp = _stamp(f)
                if stamp != self._seen.get(f):
                    self._seen[f] = stamp
                    self._moved = now
            if self.peers is not None:
                if self._moved == now:
                    self.peers.note_progress()
                shared = self.peers.group_progress
                if shared != self._peers_seen:  # some node's ranks moved (this one's too: no harm)
                    self._peers_seen = shared
                    self._moved = now
        return now - self._moved

    def expired(self) -> float | None:
        """The idle seconds when they exceed the timeout, else ``None``."""
        idle = self.idle_s()
        return idle if idle > self.timeout_s else None


def _stamp(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (-1, -1)
    return (st.st_size, st.st_mtime_ns)


class ProgressWatch:
    """The lowest reporting rank's last ``torchstep.progress()``, logged periodically."""

    def __init__(self, interval_s: float = PROGRESS_LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.files: dict[int, str] = {}  # global rank -> progress file
        self.last: dict[str, Any] | None = None
        self._logged_at: float | None = None
        self._polled = 0.0

    def reset(self, files: dict[int, str]) -> None:
        """A new group started: its ranks' progress files (the last report is kept until a new one)."""
        self.files = dict(files)

    def read(self) -> dict[str, Any] | None:
        """The lowest rank's report now (see :func:`torchstep.result.progress_info`)."""
        for rank in sorted(self.files):
            data, _ = read_json_file(self.files[rank], 4096, what="progress file")
            info = progress_info(data, rank=rank)
            if info is not None:
                self.last = info
                return info
        return self.last

    def tick(self) -> None:
        """Log the progress line at the first report, then every ``interval_s``."""
        now = time.monotonic()
        if now - self._polled < POLL_S:
            return
        self._polled = now
        if self._logged_at is not None and now - self._logged_at < self.interval_s:
            return
        info = self.read()
        line = progress_line(info)
        if line is not None:
            self._logged_at = now
            _say(f"{line} (rank {info['rank'] if info else '?'})")


def _say(text: str) -> None:
    """An INFO line on the console too, whatever ``LOGLEVEL``: a step that reports progress
    shows it where its orchestrator shows the agent's output (a task log)."""
    record = log.makeRecord(log.name, logging.INFO, __file__, 0, "%s", (text,), None)
    if not log.handlers:
        log.handle(record)
    for handler in log.handlers:
        handler.handle(record)


def gpu_present(environ: dict[str, str] | os._Environ[str]) -> bool:
    """Whether workers here may use CUDA (so NCCL): an NVIDIA device node, or a
    ``CUDA_VISIBLE_DEVICES`` that names devices. Never initialises CUDA (the zygote forks
    workers from the agent: a CUDA context here would spoil every one)."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return bool(visible) or os.path.exists("/dev/nvidiactl")


#: The flight recorder's settings: (what, torch's old name, its new name, the first torch that
#: reads the new one). torch 2.11 renamed two (``TORCH_FR_*``) and warns on every rank at the old
#: name; 2.15 a third; 2.4-2.10 read only the old names (each checked in the torch-matrix venvs'
#: libraries). A name a torch does not read turns the recorder off: new names only where known.
NCCL_FR_NAMES: tuple[tuple[str, str, str, tuple[int, int]], ...] = (
    ("buffer", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE", (2, 11)),
    ("dump_on_timeout", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_ON_TIMEOUT", (2, 15)),
    ("dump_file", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE", (2, 11)),
    ("pipe", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE", (0, 0)),
)


def nccl_env(worker_env: dict[str, str], dump_dir: str, torch_version: str = "") -> dict[str, str]:
    """NCCL flight recorder variables for one worker (only those it does not set itself, by
    either name): a trace buffer, a dump when a collective times out, the dump files in
    ``dump_dir`` (``nccl_trace_rank_<rank>``), and a pipe the agent writes to for a dump when
    it stops the group (:func:`request_nccl_dumps`). Each under the name ``torch_version``
    reads without a deprecation warning (:data:`NCCL_FR_NAMES`).

    Args:
        worker_env: the worker's environment as torch built it.
        dump_dir: where the dumps go (the attempt's log directory).
        torch_version: the workers' ``torch.__version__`` ("" : the old names, which every
            supported torch reads).

    Returns:
        The variables to add.

    >>> sorted(nccl_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, "/logs/attempt_0", "2.4.1+cu121"))
    ['TORCH_NCCL_DEBUG_INFO_PIPE_FILE', 'TORCH_NCCL_DEBUG_INFO_TEMP_FILE', 'TORCH_NCCL_DUMP_ON_TIMEOUT']
    >>> sorted(nccl_env({}, "/logs/attempt_0", "2.11.0+cu130"))[:2]
    ['TORCH_FR_BUFFER_SIZE', 'TORCH_FR_DUMP_TEMP_FILE']
    """
    release = tuple(int(n) for n in re.findall(r"\d+", torch_version.split("+")[0])[:2])
    values = {
        "buffer": NCCL_TRACE_ENTRIES,
        "dump_on_timeout": "1",
        "dump_file": os.path.join(dump_dir, NCCL_DUMP_PREFIX),
        "pipe": os.path.join(dump_dir, "nccl_pipe_rank_"),
    }
    out = {}
    for what, old, new, since in NCCL_FR_NAMES:
        if old in worker_env or new in worker_env:
            continue
        out[new if release and release >= since else old] = values[what]
    return out


def request_nccl_dumps(dump_dir: str) -> int:
    """Ask every rank's NCCL watchdog for a flight recorder dump now (torch creates the FIFO
    ``nccl_pipe_rank_<rank>.pipe`` and dumps when something is written to it). Never blocks.

    Returns:
        How many ranks were asked.
    """
    asked = 0
    for pipe in glob.glob(os.path.join(glob.escape(dump_dir), "nccl_pipe_rank_*.pipe")):
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:  # nobody reads it (the rank ended) or not a FIFO
            continue
        try:
            os.write(fd, b"1")
            asked += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return asked


def nccl_dumps(dump_dir: str) -> list[str]:
    """The flight recorder dumps in ``dump_dir`` (one per rank that wrote one), sorted."""
    found = glob.glob(os.path.join(glob.escape(dump_dir), NCCL_DUMP_PREFIX + "*"))
    return sorted(p for p in found if os.path.isfile(p) and not p.endswith(".pipe"))
