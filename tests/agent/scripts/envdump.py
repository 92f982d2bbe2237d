"""Writes this worker's launcher-set environment to OUTDIR/rank<RANK>.json, then exits
with CODE for the ranks listed in FAIL_RANKS (a comma list, may be empty).

envdump.py OUTDIR [FAIL_RANKS [CODE [--sleep]]]   (also runnable as ``-m envdump``); --sleep:
then sleep until killed
"""

import json
import os
import sys

KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "OMP_NUM_THREADS",
    "TORCHELASTIC_ERROR_FILE",
)


def _round_written(outdir: str, env: dict) -> bool:
    """Whether every rank's file holds this restart round's values."""
    for rank in range(int(env["WORLD_SIZE"] or 1)):
        try:
            with open(os.path.join(outdir, f"rank{rank}.json")) as f:
                if json.load(f).get("TORCHELASTIC_RESTART_COUNT") != env["TORCHELASTIC_RESTART_COUNT"]:
                    return False
        except (OSError, ValueError):  # not yet written, or being written
            return False
    return True


def main(argv: list) -> None:
    outdir = argv[0]
    fail = {r for r in (argv[1] if len(argv) > 1 else "").split(",") if r}
    code = int(argv[2]) if len(argv) > 2 else 3
    env = {k: os.environ.get(k) for k in KEYS}
    with open(os.path.join(outdir, f"rank{env['RANK']}.json"), "w") as f:
        json.dump(env, f)
    print(f"out rank {env['RANK']}", flush=True)
    print(f"err rank {env['RANK']}", file=sys.stderr, flush=True)
    if env["RANK"] in fail:
        # fail only once every rank has written this round's file: a peer the launcher kills
        # before it wrote would keep an earlier round's values (a race, not a difference)
        import time

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _round_written(outdir, env):
            time.sleep(0.05)
        raise SystemExit(code)
    if "--sleep" in argv:
        import time

        time.sleep(600)


if __name__ == "__main__":
    main(sys.argv[1:])
