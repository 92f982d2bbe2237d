"""The stacks and NCCL flight recorder check (run by bench/gpu.sh after gpu_bench.py): one
rank does a few all_reduces over NCCL, then is stuck in ``stuck()``; the agent is cancelled
(SIGTERM, as an orchestrator's timeout does). Checked, each a line of ``checks``:

- the agent set the flight recorder's variables for the worker (dry: set none, no GPU);
- the result names where the rank was (``stack`` ends in ``stuck``) and the stacks file;
- the rank's NCCL watchdog wrote its flight recorder dump when the agent asked (the dump
  pipe), and the result names it in ``replicas[0].nccl_dumps`` (dry: no dump expected).

Usage: python bench/gpu_flight.py [--dry] [--out DIR] — writes DIR/gpu_flight.json; exit 0
when every check passed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchstep.agent.hang import NCCL_FR_NAMES

BENCH = Path(__file__).resolve().parent
WORKER = str(BENCH / "scripts" / "gpu_stuck.py")
RUN_TIMEOUT_S = 120


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry", action="store_true", help="gloo on the CPU, no NCCL expected")
    ap.add_argument("--out", type=Path, default=None, help="where gpu_flight.json goes (default: a temp dir)")
    a, _ = ap.parse_known_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="torchstep-gpu-flight-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="flight-", dir=out))
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCHSTEP_", "PET_", "TORCHELASTIC_", "TORCH_NCCL_", "TORCH_FR_"))
    }
    env["PYTHONUNBUFFERED"] = "1"
    if a.dry:
        env["TORCHSTEP_GPU_DRY"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU: the agent sets no NCCL variable
    argv = [
        sys.executable,
        "-m",
        "torchstep.agent",
        "--standalone",
        "--nproc-per-node",
        "1",
        "--grace-period",
        "15",
        "--log-dir",
        str(work / "logs"),
        "--result-file",
        str(work / "result.json"),
        WORKER,
        str(work),
    ]
    t0 = time.monotonic()
    with open(work / "stdout", "w") as so, open(work / "stderr", "w") as se:
        proc = subprocess.Popen(argv, stdout=so, stderr=se, env=env)
        while not (work / "ready.0").exists() and proc.poll() is None and time.monotonic() - t0 < RUN_TIMEOUT_S:
            time.sleep(0.1)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    result = json.loads((work / "result.json").read_text()) if (work / "result.json").exists() else {}
    seen = json.loads((work / "rank0.json").read_text())["env"] if (work / "rank0.json").exists() else {}
    replica = (result.get("replicas") or [{}])[0]
    rank = (replica.get("ranks") or [{}])[0]
    found: dict[str, str] = {}

    def verdict(name: str, problems: list[str]) -> None:
        found[name] = "pass" if not problems else "; ".join(problems[:3])

    # each setting under the name this torch reads (torchstep.agent.hang.NCCL_FR_NAMES), so no
    # rank warns that one is deprecated (2.11: "Environment variable TORCH_NCCL_TRACE_BUFFER_SIZE
    # is deprecated; use TORCH_FR_BUFFER_SIZE instead")
    stderr = (work / "stderr").read_text(errors="replace")
    names = {old: {old, new} for _, old, new, _ in NCCL_FR_NAMES}
    warned = set(re.findall(r"Environment variable (TORCH_\w+) is deprecated", stderr))
    deprecated = sorted(warned & set(names))
    present = {k for k, both in names.items() if both & set(seen)}
    verdict(
        "the agent turns NCCL's flight recorder on (only where there is a GPU)",
        ([f"set: {sorted(present)}"] if present else [])
        if a.dry
        else [f"missing {k}" for k in sorted(set(names) - present)]
        + [f"torch warns: {x} is deprecated" for x in deprecated],
    )
    stack = rank.get("stack") or []
    verdict(
        "a cancelled step's result says where the rank was and names the stacks file",
        ([] if result.get("state") == "CANCELLED" else [f"state {result.get('state')}"])
        + ([] if stack and stack[0].endswith("in stuck") else [f"stack {stack[:2]}"])
        + ([] if replica.get("stacks_file") and Path(replica["stacks_file"]).is_file() else ["no stacks file"]),
    )
    dumps = replica.get("nccl_dumps") or []
    verdict(
        "the rank's NCCL flight recorder dump is collected and named in the result",
        ([f"dumps {dumps}"] if dumps else [])
        if a.dry
        else ([] if dumps and all(Path(p).stat().st_size > 0 for p in dumps) else [f"no dump: {dumps}"]),
    )
    report = {
        "dry": a.dry,
        "checks": found,
        "result": {k: result.get(k) for k in ("state", "exit_code", "message")},
        "stack": stack,
        "nccl_dumps": dumps,
        "nccl_env": seen,
        "seconds": round(time.monotonic() - t0, 1),
        "stderr_tail": (work / "stderr").read_text()[-2000:],
    }
    (out / "gpu_flight.json").write_text(json.dumps(report, indent=1) + "\n")
    failed = [f"{k}: {v}" for k, v in found.items() if v != "pass"]
    if failed:
        print(f"gpu flight recorder check FAILED: {'; '.join(failed)} ({out / 'gpu_flight.json'})", file=sys.stderr)
        return 1
    print(f"gpu flight recorder check passed in {report['seconds']} s ({out / 'gpu_flight.json'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
