"""The GPU check (run by bench/gpu.sh): torchstep-agent against torchrun on this machine's
GPU, the same torch, the same script (bench/scripts/gpu_train.py, DDP over NCCL).

What it checks, each a line of the JSON's ``checks``:
- the agent's workers are forked from the zygote (torch imported before the script ran,
  CUDA not initialised then) and each initialises CUDA itself and trains;
- the backend is NCCL and the rank's device is its GPU;
- each rank sees ``CUDA_VISIBLE_DEVICES``, ``LOCAL_RANK``, ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` as under torchrun;
- a rank SIGKILLed mid-step is restarted (``--max-restarts 1``) and trains, under both.
What it measures (runs alternated, medians): startup (launcher start to every rank's first
DDP step done) and recovery (the kill to the restarted rank's first step).

The dry mode (``--dry``: gloo on the CPU, no GPU asserts) runs the same code paths on any
machine; ``make test`` runs it (tests/torchmatrix/test_gpu_check.py).

Usage: python bench/gpu_bench.py [--dry] [--runs N] [--out DIR] [--write-docs]
Writes DIR/gpu.json and DIR/gpu.md (the section of docs/performance.md); with
``--write-docs`` also bench/results/gpu.json and the "On a GPU" section of
docs/performance.md. Exit 0 when every check passed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORKER = str(BENCH / "scripts" / "gpu_train.py")
LAUNCHERS = {"torchrun": ["-m", "torch.distributed.run"], "torchstep-agent": ["-m", "torchstep.agent"]}
RUN_TIMEOUT_S = 150
ENV_KEYS = ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")
FALLBACK = "worker zygote not used"


def clean_env(dry: bool) -> dict[str, str]:
    """This process's environment without anything that steers a launcher."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHSTEP_", "PET_", "TORCHELASTIC_"))}
    env["PYTHONUNBUFFERED"] = "1"
    if dry:
        env["TORCHSTEP_GPU_DRY"] = "1"
    return env


def launch(launcher: str, nproc: int, mode: str, work: Path, dry: bool) -> dict[str, Any]:
    """One run of ``launcher`` over the worker; what its ranks wrote, its exit and timings."""
    out = work / f"{launcher}-{mode}-{len(list(work.glob(f'{launcher}-{mode}-*')))}"
    out.mkdir(parents=True)
    flags = ["--standalone", "--nproc-per-node", str(nproc), "--max-restarts", "1" if mode == "crash" else "0"]
    if launcher == "torchstep-agent":
        flags += ["--log-dir", str(out / "logs"), "--result-file", str(out / "result.json")]
    argv = [sys.executable, *LAUNCHERS[launcher], *flags, WORKER, str(out), mode]
    t0 = time.time()
    with open(out / "stdout", "w") as so, open(out / "stderr", "w") as se:
        try:
            code: int | None = subprocess.run(
                argv, stdout=so, stderr=se, env=clean_env(dry), timeout=RUN_TIMEOUT_S
            ).returncode
        except subprocess.TimeoutExpired:
            code = None
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.attempt*.json"))]
    run: dict[str, Any] = {"launcher": launcher, "mode": mode, "exit": code, "ranks": ranks, "dir": str(out)}
    run["stderr_tail"] = (out / "stderr").read_text()[-2000:]
    run["fallback"] = FALLBACK in (out / "stderr").read_text()
    last = [r for r in ranks if r["attempt"] == (1 if mode == "crash" else 0)]
    if code == 0 and len(last) == nproc and all("first_step" in r for r in last):
        if mode == "train":
            run["seconds"] = max(r["first_step"] for r in last) - t0
        else:
            killed = [r["killed"] for r in ranks if r["attempt"] == 0 and "killed" in r]
            run["seconds"] = max(r["first_step"] for r in last) - min(killed) if killed else None
    if launcher == "torchstep-agent" and (out / "result.json").exists():
        result = json.loads((out / "result.json").read_text())
        run["result"] = {k: result.get(k) for k in ("state", "exit_code", "restarts")}
    return run


def checks(runs: list[dict[str, Any]], nproc: int, dry: bool) -> dict[str, str]:
    """Each check's verdict: ``"pass"`` or what went wrong."""
    found: dict[str, str] = {}

    def verdict(name: str, problems: list[str]) -> None:
        found[name] = "pass" if not problems else "; ".join(problems[:3])

    # torchrun's own failures are counted in the section, not held against the agent
    bad = [
        f"{r['mode']}: exit {r['exit']}: {r['stderr_tail'][-300:]!r}"
        for r in runs
        if r["launcher"] == "torchstep-agent" and r["exit"] != 0
    ]
    verdict("every run of the agent succeeded", bad)
    agent_ranks = [k for r in runs if r["launcher"] == "torchstep-agent" for k in r["ranks"]]
    verdict(
        "the agent's workers are forked from the zygote (torch preloaded, CUDA not initialised)",
        [
            f"rank {k['rank']} attempt {k['attempt']}: preloaded={k['preloaded']} cuda={k['cuda_initialized_at_start']}"
            for k in agent_ranks
            if not k["preloaded"] or k["cuda_initialized_at_start"]
        ]
        + [f"{r['mode']}: {FALLBACK}" for r in runs if r["fallback"]]
        + ([] if agent_ranks else ["no agent rank"]),
    )
    backend, device = ("gloo", "cpu") if dry else ("nccl", "cuda:")
    every = [k for r in runs for k in r["ranks"] if "backend" in k]
    verdict(
        f"each rank trains on {'the CPU over gloo (dry)' if dry else 'its GPU over NCCL'}",
        [
            f"{k['rank']}: {k['backend']} {k['device']}"
            for k in every
            if k["backend"] != backend or not k["device"].startswith(device)
        ]
        + ([] if every else ["no rank trained"]),
    )

    def envs(launcher: str) -> dict[int, dict[str, str | None]]:
        return {
            k["rank"]: k["env"] for r in runs if r["launcher"] == launcher and r["mode"] == "train" for k in r["ranks"]
        }

    theirs, ours = envs("torchrun"), envs("torchstep-agent")
    verdict(
        "CUDA_VISIBLE_DEVICES, LOCAL_RANK and the rest as torchrun sets them",
        [
            f"rank {k}: torchrun {theirs.get(k)} agent {ours.get(k)}"
            for k in sorted({*theirs, *ours})
            if theirs.get(k) != ours.get(k)
        ]
        + ([] if len(ours) == nproc else [f"{len(ours)} of {nproc} ranks"]),
    )
    crash = [r for r in runs if r["mode"] == "crash"]
    verdict(
        "a rank SIGKILLed mid-step is restarted and trains",
        [
            f"{r['launcher']}: no recovery time"
            for r in crash
            if r.get("seconds") is None and r["launcher"] == "torchstep-agent"
        ]
        + [
            f"agent result {r.get('result')}"
            for r in crash
            if r["launcher"] == "torchstep-agent"
            and r.get("result") != {"state": "SUCCEEDED", "exit_code": 0, "restarts": 1}
        ]
        + ([] if crash else ["no run"]),
    )
    return found


def machine(dry: bool) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cpus": os.cpu_count(),
        "dry": dry,
    }
    if not dry:
        info["gpus"] = torch.cuda.device_count()
        info["device"] = torch.cuda.get_device_name(0)
    else:
        info["device"] = f"CPU only (dry mode), {platform.machine()}"
    return info


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def section(report: dict[str, Any]) -> str:
    """The "On a GPU" section of docs/performance.md."""
    m = report["machine"]
    where = m["device"] if m["dry"] else f"{m['device']} ({m['gpus']} GPU)"
    lines = [
        "## On a GPU",
        "",
        f"Measured by `bench/gpu.sh` on **{where}**, torch {m['torch']} (CUDA {m['torch_cuda']}), "
        f"Python {m['python']}, {m['cpus']} CPUs, {report['measured']}; {report['nproc']} rank(s), "
        f"{report['runs']} run(s) of each, torchrun and torchstep-agent alternated, medians "
        f"(`bench/results/gpu.json` has every run).",
        "",
        "| | torchrun | torchstep-agent | ratio |",
        "|---|---|---|---|",
    ]
    for key, what in (
        ("startup", "startup: launcher start → every rank's first DDP step done"),
        ("recovery", "recovery: a rank SIGKILLed mid-step → its restarted first step"),
    ):
        t, a = report[key]["torchrun"], report[key]["torchstep-agent"]
        if t and a:
            lines.append(f"| {what} | {t:.2f} s | {a:.2f} s | {a / t:.2f}x |")
        else:
            lines.append(f"| {what} | n/a | n/a | n/a |")
    failed = [f"{r['launcher']} {r['mode']} (exit {r['exit']})" for r in report["runs_detail"] if r["exit"] != 0]
    if failed:
        lines += ["", f"Runs that failed (not timed): {', '.join(failed)}."]
    lines += ["", "Checks:", ""]
    lines += [f"- {name}: {verdict}" for name, verdict in report["checks"].items()]
    return "\n".join(lines) + "\n"


def write_docs(text: str) -> None:
    """Replace the "On a GPU" section of docs/performance.md (up to the next ``## ``)."""
    doc = ROOT / "docs" / "performance.md"
    old = doc.read_text()
    new, n = re.subn(r"^## On a GPU\n.*?(?=^## )", lambda _: text + "\n", old, count=1, flags=re.S | re.M)
    if not n:
        raise SystemExit("docs/performance.md has no '## On a GPU' section followed by another '## ' section")
    doc.write_text(new)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry", action="store_true", help="gloo on the CPU, no GPU asserts (what make test runs)")
    ap.add_argument("--runs", type=int, default=None, help="runs of each launcher and mode (default 3; dry 1)")
    ap.add_argument("--out", type=Path, default=None, help="where gpu.json and gpu.md go (default: a temp dir)")
    ap.add_argument("--write-docs", action="store_true", help="also bench/results/gpu.json and docs/performance.md")
    ap.add_argument("--budget", type=float, default=420, help="seconds: no new run starts after this")
    a = ap.parse_args()
    runs_each = a.runs or (1 if a.dry else 3)
    out = a.out or Path(tempfile.mkdtemp(prefix="torchstep-gpu-"))
    out.mkdir(parents=True, exist_ok=True)
    info = machine(a.dry)
    if not a.dry:
        import torch

        if not torch.cuda.is_available():
            print("gpu.sh: no GPU visible to torch; fix: run on a machine with one, or use --dry", file=sys.stderr)
            return 2
    nproc = 1  # one GPU; the dry mode runs the same
    print(f"gpu check: {info}", flush=True)
    t_start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="runs-", dir=out))
    runs: list[dict[str, Any]] = []
    for mode in ("train", "crash"):
        for i in range(runs_each):
            if i and time.monotonic() - t_start > a.budget:
                break
            order = list(LAUNCHERS) if i % 2 == 0 else list(reversed(LAUNCHERS))
            for launcher in order:
                run = launch(launcher, nproc, mode, work, a.dry)
                runs.append(run)
                print(f"  {launcher} {mode}: exit {run['exit']}, {run.get('seconds')} s", flush=True)
    report: dict[str, Any] = {
        "schema": 1,
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": info,
        "nproc": nproc,
        "runs": runs_each,
    }
    for key, mode in (("startup", "train"), ("recovery", "crash")):
        timed = [r for r in runs if r["mode"] == mode and r.get("seconds") is not None]
        report[key] = {x: median([r["seconds"] for r in timed if r["launcher"] == x]) for x in LAUNCHERS}
    report["checks"] = checks(runs, nproc, a.dry)
    report["runs_detail"] = [{k: v for k, v in r.items() if k != "dir"} for r in runs]
    text = section(report)
    (out / "gpu.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "gpu.md").write_text(text)
    if a.write_docs and not a.dry:
        (BENCH / "results" / "gpu.json").write_text(json.dumps(report, indent=1) + "\n")
        write_docs(text)
    print(text, flush=True)
    failed = [name for name, verdict in report["checks"].items() if verdict != "pass"]
    if failed:
        print(f"gpu check FAILED: {'; '.join(failed)} ({out / 'gpu.json'})", file=sys.stderr)
        return 1
    print(f"gpu check passed in {time.monotonic() - t_start:.0f} s ({out / 'gpu.json'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
