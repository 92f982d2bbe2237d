"""``make demo``: the project's main job on torchstep's embedded default.

Builds the TorchX AppDef of ``components/train.py:trainer`` (2 nodes x 2 processes of a
small DDP regression on CPU/gloo), runs it with ``torchstep.run_local`` — one
``torchstep-agent`` per node, a rendezvous hosted by the launcher — and prints what
happened: roles, ranks, state, outputs and where the logs are.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torchstep

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    app = torchstep.materialize(
        f"{ROOT / 'components' / 'train.py'}:trainer",
        {"replicas": 2, "nproc_per_node": 2, "steps": 40, "image": str(ROOT)},
    )
    role = app.roles[0]
    print(f"demo: {app.name!r}, role {role.name!r}: {role.num_replicas} nodes x 2 processes, CPU/gloo")
    print(f"demo: command per process: {' '.join([role.entrypoint, *role.args])}\n")

    events: list[str] = []
    t0 = time.time()
    result = torchstep.run_local(
        app,
        cfg={"tee": False},  # the ranks' output stays in their log files (paths below)
        on_status=lambda ev: events.append(f"{time.time() - t0:5.1f}s {ev.describe()}"),
    )

    print("\ndemo: replica state changes (on_status):")
    print("\n".join(f"  {e}" for e in events))
    print(f"\ndemo: {result.app_id} {result.state} in {result.duration_s:.1f} s, exit code {result.exit_code}")
    for rep in result.replicas:
        print(f"  {rep.role}/{rep.replica_id}: {rep.state}, restarts {rep.restarts}, logs {rep.log_dir}")
        for rank in rep.ranks:
            print(f"    rank {rank.rank} (local {rank.local_rank}): {rank.state}, log {rank.log_file}")
    if result.root_cause is not None:
        rc = result.root_cause
        print(f"  root cause: {rc.role} rank {rc.rank}: {rc.message}")
    print(f"  outputs of rank 0: {result.outputs}")
    status = result.app_status()
    print(f"  TorchX AppStatus: {status.state.name}, roles {[r.role for r in status.roles]}")
    print(f"  result JSON: {result.log_dir}/result.json")
    return 0 if result.succeeded else 1


if __name__ == "__main__":
    sys.exit(main())
