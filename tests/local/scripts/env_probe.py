"""Worker of the inherit_env tests: what does this process (and every process of its run)
hold in its environment?

env_probe.py SHA256   prints the names of its environment variables, its own values of
                      the allowlisted ones, publishes the names as the rank-0 output "env",
                      and reports every process of its run (the supervisor's token) whose
                      environment holds a value with this SHA-256 — never the value itself.
"""

import hashlib
import os
import sys

PRELOADED = "torch" in sys.modules  # forked from the agent's zygote, which imported torch

import torchstep  # noqa: E402

ALLOWED = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER", "STEP_OWN")


def run_processes() -> list[int]:
    """Live processes started by the same launcher run as this one (its launch token)."""
    token = os.environ.get("TORCHSTEP_LAUNCH_TOKEN", "")
    run = token.split("/", 1)[0].encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                entries = f.read().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(b"TORCHSTEP_LAUNCH_TOKEN=" + run + b"/") for e in entries):
            found.append(int(name))
    return found


def main() -> None:
    digest = sys.argv[1]
    print(f"preloaded={PRELOADED}", flush=True)
    print("names:", " ".join(sorted(os.environ)), flush=True)
    for key in ALLOWED:
        print(f"{key}={os.environ.get(key)}", flush=True)
    leaks = []
    procs = run_processes()
    for pid in procs:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                entries = f.read().split(b"\0")
        except OSError:
            continue
        for e in entries:
            value = e.partition(b"=")[2]
            if value and hashlib.sha256(value).hexdigest() == digest:
                leaks.append(f"{pid}:{e.partition(b'=')[0].decode()}")
    print(f"run processes: {len(procs)}; leaks: {leaks}", flush=True)
    torchstep.output("env", sorted(os.environ))
    torchstep.output("run_processes", len(procs))
    torchstep.output("leaks", leaks)


if __name__ == "__main__":
    main()
