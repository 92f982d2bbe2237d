"""Planning cost as an AppDef grows (issue 33, item 4): ``build_plan`` of N roles, and what a
network request of N roles costs the worker that receives it (``app_received``: size, policy,
then plan) under ``DEFAULT`` (refused by its caps before planning) and under a policy without
size caps (planned). Process CPU time of one call each, on this machine.

Usage: ``python bench/plan_scaling.py [--sizes 1000,2000,4000,10000]``. Before the fix,
planning re-scanned every decision so far: 1,000 roles took ~12 s here, 10,000 minutes.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any


def cpu(fn: Callable[[], Any]) -> float:
    t0 = time.process_time()
    try:
        fn()
    except Exception as e:  # a refusal is the outcome being timed
        if type(e).__name__ != "PolicyError":
            raise
    return time.process_time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="1000,2000,4000,10000", help="role counts, comma-separated")
    sizes = [int(n) for n in ap.parse_args().sizes.split(",")]

    from torchstep.components.appjson import app_to_dict
    from torchstep.plan.planner import build_plan
    from torchstep.policy import DEFAULT, Policy
    from torchstep.schedulers.base import app_received
    from torchx import specs

    uncapped = Policy(roles=None, replicas=None, nproc=None, processes=None, conf_bytes=None)
    print(f"{'roles':>7} {'conf KB':>8} {'build_plan s':>13} {'received, DEFAULT s':>20} {'received, no caps s':>20}")
    for n in sizes:
        roles = [
            specs.Role(
                f"r{i}",
                image="ghcr.io/acme/t:1",
                entrypoint="python",
                args=["-m", "train", f"--shard={i}"],
                env={"SHARD": str(i)},
                resource=specs.Resource(cpu=1, gpu=0, memMB=256),
            )
            for i in range(n)
        ]
        app = specs.AppDef("wide", roles=roles)
        data = app_to_dict(app)
        kb = len(str(data)) / 1024
        plan_s = cpu(lambda: build_plan(app, "kubernetes"))
        refused_s = cpu(lambda: app_received(data, "kubernetes", {}, DEFAULT))
        planned_s = cpu(lambda: app_received(data, "kubernetes", {}, uncapped))
        print(f"{n:>7} {kb:>8.0f} {plan_s:>13.2f} {refused_s:>20.3f} {planned_s:>20.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
