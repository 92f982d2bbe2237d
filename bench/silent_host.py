"""Silent host: two "hosts" (network namespaces on a bridge), ``--nnodes 1:2`` or ``2``, one
gloo worker each in an all-reduce loop, c10d rendezvous on host 0 (where the store lives);
then the link of one host is set down while its processes live (no reset is sent, as with a
power loss or a switch port going down). Measured, for torchrun and torchstep-agent:

* elastic (``1:2``): time from the cut until the other host trains again (an all-reduce at
  world size 1), and until the cut host's worker is gone;
* fixed (``2``): time from the cut until the other host's agent exits (and, for
  torchstep-agent, its result's state and root cause).

Each probe ends after ``--window`` seconds (a hang then reads ``> window``). Needs root
(``ip netns``). Usage: ``python bench/silent_host.py [--runs N] [--window S] [--json]``.
The bed (:class:`Bed`) is also what ``tests/agent/test_silent_host.py`` runs on.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
TRAIN = str(BENCH / "scripts" / "silent_train.py")
#: ``BENCH_TORCH_ROW=<row>``: a row of the torch matrix (its virtualenv of PyPI's CUDA build,
#: torchstep from this checkout; bench/scripts/agent_bench.py), figures ``12a@<row>``...
ROW = os.environ.get("BENCH_TORCH_ROW", "").strip()
if ROW:
    sys.path.insert(0, str(BENCH / "scripts"))
    import agent_bench

    BIN = agent_bench.BIN
else:
    BIN = Path(sys.executable).parent
TOOLS = {"torchrun": str(BIN / "torchrun"), "torchstep-agent": str(BIN / "torchstep-agent")}


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


class Bed:
    """``count`` hosts (two by default) on a bridge: network namespaces ``<tag>h0``,
    ``<tag>h1``... with ``eth0`` (``10.X.Y.1``, ``.2``...), whose other veth ends hang on a
    bridge in ``<tag>br``;
    :meth:`cut` sets a host's bridge-side veth down (its processes live on, nothing is
    sent). Every process it starts runs in a host's namespace and is killed by
    :meth:`close` (by the namespace's pids)."""

    def __init__(self, tag: str | None = None, count: int = 2) -> None:
        self.tag = tag or f"sg{os.getpid() % 10000}{random.randint(0, 99)}"
        net = random.randint(0, 250)
        self.ips = [f"10.213.{net}.{i + 1}" for i in range(count)]
        self.br = f"{self.tag}br"
        self.hosts = [f"{self.tag}h{i}" for i in range(count)]
        self.procs: list[subprocess.Popen[bytes]] = []

    def up(self) -> Bed:
        _ip("netns", "add", self.br)
        _ip("-n", self.br, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.br, "link", "set", "br0", "up")
        for i, ns in enumerate(self.hosts):
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", self.br, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", self.br, "link", "set", f"v{i}", "master", "br0")
            _ip("-n", self.br, "link", "set", f"v{i}", "up")
            _ip("-n", ns, "addr", "add", f"{self.ips[i]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
        return self

    def cut(self, host: int, down: bool = True) -> None:
        """Set host ``host``'s link down (``down=False``: up again)."""
        _ip("-n", self.br, "link", "set", f"v{host}", "down" if down else "up")

    def spawn(self, host: int, argv: list[str], *, env: dict[str, str], out: Path) -> subprocess.Popen[bytes]:
        """Start ``argv`` in host ``host``'s namespace, its output into ``out``."""
        with open(out, "ab") as f:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.hosts[host], *argv],
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def pids(self, host: int) -> list[int]:
        """Every process in host ``host``'s namespace."""
        out = _ip("netns", "pids", self.hosts[host], check=False).stdout
        return [int(p) for p in out.split()]

    def workers(self, host: int) -> list[int]:
        """The training workers (``silent_train.py``) in host ``host``'s namespace."""
        found = []
        for pid in self.pids(host):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"silent_train.py" in cmd and b"torchrun" not in cmd and b"torchstep-agent" not in cmd:
                found.append(pid)
        return found

    def kill_all(self) -> None:
        for _ in range(3):
            pids = [p for h in range(len(self.hosts)) for p in self.pids(h)]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        self.kill_all()
        for ns in [*self.hosts, self.br]:
            _ip("netns", "del", ns, check=False)


def base_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCHSTEP_", "PET_", "TORCHELASTIC_")) and k != "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
    }
    # gloo's address: eth0's, not the address of the host name every namespace shares
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="eth0")
    if ROW:  # the row's virtualenv holds torch and torchx; torchstep is this checkout
        env["PYTHONPATH"] = str(agent_bench.CORE_SRC)
    return env


def launch(
    bed: Bed, tool: str, nnodes: str, work: Path, *, run_id: str, conf: str = "", max_restarts: int = 0
) -> list[subprocess.Popen[bytes]]:
    """Start one agent (torchrun or torchstep-agent) per host of ``bed``, c10d on host 0
    (``conf``: more ``--rdzv-conf``)."""
    procs = []
    for i in range(len(bed.hosts)):
        env = base_env()
        env["SILENT_LOG"] = str(work / f"steps.{i}")
        argv = [TOOLS[tool], "--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
        argv += ["--rdzv-endpoint", f"{bed.ips[0]}:29400", "--rdzv-id", run_id, "--local-addr", bed.ips[i]]
        # the namespaces share the machine's host name, so torch cannot tell that the endpoint
        # is host 0's: say which agent hosts the store (a pod's hostname would match)
        rdzv_conf = f"is_host={1 if i == 0 else 0}" + (f",{conf}" if conf else "")
        argv += ["--rdzv-conf", rdzv_conf, "--max-restarts", str(max_restarts), "--monitor-interval", "0.1"]
        if tool == "torchstep-agent":
            argv += ["--result-file", str(work / f"result.{i}.json"), "--log-dir", str(work / f"logs.{i}")]
        procs.append(bed.spawn(i, [*argv, TRAIN], env=env, out=work / f"agent.{i}.log"))
    return procs


def steps(work: Path, host: int) -> list[tuple[float, int]]:
    """``(time, world size)`` of every all-reduce host ``host`` finished."""
    try:
        lines = (work / f"steps.{host}").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 3:
            out.append((float(parts[0]), int(parts[1])))
    return out


def wait_for(cond: Any, timeout: float, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(interval)
    return None


def scenario(tool: str, *, cut: int, elastic: bool, window: float, work: Path) -> dict[str, Any]:
    """One run: both hosts train at world 2, host ``cut`` goes silent; what the other does.

    Returns:
        ``again_s`` (elastic: the other host's first all-reduce at world 1 after the cut),
        ``cut_stopped_s`` (elastic: the cut host's worker gone), ``fail_s`` (fixed: the other
        host's agent exited), ``result`` (torchstep-agent, fixed: the other host's result), each
        ``None`` when it did not happen within ``window``.
    """
    work.mkdir(parents=True, exist_ok=True)
    bed = Bed().up()
    other = 1 - cut
    out: dict[str, Any] = {"tool": tool, "cut": cut, "elastic": elastic}
    try:
        procs = launch(bed, tool, "1:2" if elastic else "2", work, run_id=f"sg{random.randint(0, 1 << 30)}")
        formed = wait_for(lambda: all(sum(1 for _, w in steps(work, h) if w == 2) >= 5 for h in (0, 1)), 120)
        if not formed:
            raise RuntimeError(f"{tool}: the two hosts did not train together within 120 s (see {work})")
        t_cut = time.time()
        bed.cut(cut)
        if elastic:

            def again_on() -> tuple[int, float] | None:
                for host in (other, cut):  # the store host trains on when it is the one cut
                    t = next((t for t, w in steps(work, host) if t > t_cut and w == 1), None)
                    if t is not None:
                        return host, t
                return None

            again = wait_for(again_on, window)
            out["again_s"] = None if again is None else round(again[1] - t_cut, 2)
            out["again_host"] = None if again is None else again[0]
            stopped = cut if again is None or again[0] == other else other
            gone = wait_for(lambda: not bed.workers(stopped), max(0.5, window - (time.time() - t_cut)), interval=0.2)
            out["stopped_host"] = stopped
            out["stopped_s"] = None if not gone else round(time.time() - t_cut, 2)
        else:
            ended = wait_for(lambda: procs[other].poll() is not None, window)
            out["fail_s"] = None if not ended else round(time.time() - t_cut, 2)
            result = work / f"result.{other}.json"
            if ended and result.exists():
                data = json.loads(result.read_text())
                root = data.get("root_cause") or {}
                out["result"] = {
                    "state": data.get("state"),
                    "retryable": data.get("retryable"),
                    "root_cause": root.get("message"),
                }
    finally:
        bed.close()
    return out


def fmt_seconds(values: list[float | None], window: float) -> str:
    got = [v for v in values if v is not None]
    if len(got) < len(values):
        return f"> {window:g} s ({len(values) - len(got)}/{len(values)} runs)"
    return f"{statistics.median(got):.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--tools", default="torchrun,torchstep-agent")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--work", default="/tmp/silent_host_bench")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/silent_host.py needs root (ip netns)")
    rows: list[dict[str, Any]] = []
    for tool in args.tools.split(","):
        for elastic in (True, False):
            for cut in (1, 0):
                for run in range(args.runs):
                    work = Path(args.work) / f"{tool}-{'elastic' if elastic else 'fixed'}-cut{cut}-{run}"
                    row = scenario(tool, cut=cut, elastic=elastic, window=args.window, work=work)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    if args.json:
        return
    _record(rows, args)
    print("\n| scenario | torchrun | torchstep-agent | ratio |\n|---|---|---|---|")
    for elastic in (True, False):
        for cut in (1, 0):
            key = "again_s" if elastic else "fail_s"
            what = ("elastic 1:2, train again" if elastic else "fixed 2, fail") + (
                ", store host cut" if cut == 0 else ", other host cut"
            )
            cells = []
            meds = []
            for tool in ("torchrun", "torchstep-agent"):
                vals = [r.get(key) for r in rows if r["tool"] == tool and r["elastic"] == elastic and r["cut"] == cut]
                cells.append(fmt_seconds(vals, args.window) if vals else "-")
                got = [v for v in vals if v is not None]
                meds.append(statistics.median(got) if got and len(got) == len(vals) else args.window)
            ratio = f"{meds[0] / meds[1]:.0f}x+" if meds[1] else "-"
            print(f"| {what} | {cells[0]} | {cells[1]} | {ratio} |")


#: Figures in bench/results.json (docs/performance.md via bench/report.py).
FIGURES = {
    (True, 1): (
        "12a",
        "silent host (link down, processes alive), --nnodes 1:2: cut -> the other host's next all-reduce",
    ),
    (True, 0): ("12b", "silent store host, --nnodes 1:2: cut -> first all-reduce at the new size on either host"),
    (False, 1): ("12c", "silent host, --nnodes 2: cut -> the other host's agent exits (FAILED, retryable)"),
    (False, 0): ("12d", "silent store host, --nnodes 2: cut -> the other host's agent exits (FAILED, retryable)"),
}


def _record(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """One figure per scenario; a run that did not recover (or fail) within the window counts
    as the window, a lower bound, and the note says so."""
    sys.path.insert(0, str(BENCH / "scripts"))
    from figures import record

    command = f"python bench/silent_host.py --runs {args.runs} --window {args.window:g}"
    for (elastic, cut), (fig, what) in FIGURES.items():
        key = "again_s" if elastic else "fail_s"
        vals = {
            tool: [r.get(key) for r in rows if r["tool"] == tool and r["elastic"] == elastic and r["cut"] == cut]
            for tool in ("torchstep-agent", "torchrun")
        }
        if not vals["torchstep-agent"] or not vals["torchrun"]:
            continue
        notes = []
        for tool, got in vals.items():
            missing = sum(1 for v in got if v is None)
            if missing:
                notes.append(
                    f"{tool}: {missing} of {len(got)} runs had not {'recovered' if elastic else 'ended'} after {args.window:g} s (counted as {args.window:g} s, a lower bound)"
                )
        if elastic:
            stopped = [
                r.get("stopped_s") for r in rows if r["tool"] == "torchstep-agent" and r["elastic"] and r["cut"] == cut
            ]
            notes.append(
                "torchstep-agent: the host that cannot reach the store stopped its worker after "
                + ", ".join("never" if v is None else f"{v:.1f} s" for v in stopped)
            )
            if cut == 0:
                notes.append("the store host trains on alone: the other host cannot reach the store")
        else:
            causes = {
                (r.get("result") or {}).get("root_cause")
                for r in rows
                if r["tool"] == "torchstep-agent" and not r["elastic"] and r["cut"] == cut
            }
            notes.append("root cause: " + "; ".join(sorted(str(c)[:120] for c in causes)))
        record(
            agent_bench.figure_id(fig) if ROW else fig,
            what,
            [args.window if v is None else v for v in vals["torchstep-agent"]],
            [args.window if v is None else v for v in vals["torchrun"]],
            peer_name="torchrun",
            goal=10.0 if elastic else 30.0,
            goal_on="ours",
            command=(agent_bench.row_command(command) if ROW else command),
            note="; ".join(notes),
        )


if __name__ == "__main__":
    main()
