"""Compile time of a KFP pipeline of torchstep steps against the same pipeline hand-written.

For N steps (10, 50, 200), each a distinct AppDef (one container, 2 cpus, 4 GiB, 2
APPLICATION retries with a delay, an env var), build and compile the pipeline two ways:

- torchstep: ``component_from_app(app)`` per step, called in a ``@dsl.pipeline`` (the plan —
  resources, ``set_retry``, env, /dev/shm, pod name env, caching off — applied by the call);
- hand-written: a ``@dsl.container_component`` per step with the same image/command/args and
  the same ``set_*`` and kfp-kubernetes calls written out (what an author writes without us).

Timed: building the components, decorating the pipeline and ``Compiler().compile`` to a
file, in one process after a warm-up (imports excluded: both pay the same kfp import).
Medians of REPEATS runs, interleaved. Goal: ratio <= 1.1 at 50 and at 500 steps.
Prints the ratios and writes bench/results/kfp.md. Usage: ``python bench/kfp_compile.py``.
"""

# No `from __future__ import annotations`: KFP reads the functions' annotations as types.
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kfp import compiler, dsl, kubernetes
from torchstep_kfp import component_from_app
from torchx import specs

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench" / "scripts"))
from figures import curve, full, record  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "kfp.md"
REPEATS = int(os.environ.get("BENCH_REPEATS", "7" if full() else "3"))
SIZES = (10, 50, 200, 500)
GOAL = 1.1
IMAGE = "ghcr.io/acme/train:1"


def app(i: int) -> specs.AppDef:
    role = specs.Role(
        f"train{i}",
        image=IMAGE,
        entrypoint="python",
        args=["-m", "train", "--seed", str(i)],
        env={"LOG_LEVEL": "info"},
        resource=specs.Resource(cpu=2, gpu=0, memMB=4096),
        max_retries=2,
        retry_policy=specs.RetryPolicy.APPLICATION,
        metadata={"torchstep": {"retry_delay": 30}},
    )
    return specs.AppDef(f"train{i}", roles=[role])


def with_torchstep(n: int, out: str) -> None:
    ops = [component_from_app(app(i)) for i in range(n)]

    @dsl.pipeline(name="bench")
    def pipeline():
        for op in ops:
            op()

    compiler.Compiler().compile(pipeline, out)


def hand_written(n: int, out: str) -> None:
    def make(i: int) -> Any:
        def train():
            return dsl.ContainerSpec(image=IMAGE, command=["python", "-m", "train"], args=["--seed", str(i)])

        train.__name__ = f"train{i}"
        return dsl.container_component(train)

    ops = [make(i) for i in range(n)]

    @dsl.pipeline(name="bench")
    def pipeline():
        for i, op in enumerate(ops):
            task = op()
            task.set_cpu_request("2").set_cpu_limit("2").set_memory_request("4096Mi").set_memory_limit("4096Mi")
            task.set_retry(num_retries=2, backoff_duration="30s")
            task.set_env_variable("LOG_LEVEL", "info")
            task.set_display_name(f"train{i}").set_caching_options(False)
            kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory")
            kubernetes.use_field_path_as_env(task, env_name="POD_NAME", field_path="metadata.name")

    compiler.Compiler().compile(pipeline, out)


def timed(fn: Any, n: int, out: str) -> float:
    t0 = time.perf_counter()
    fn(n, out)
    return time.perf_counter() - t0


def main() -> int:
    rows = []
    samples: dict[int, tuple[list[float], list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "p.yaml")
        with_torchstep(5, out), hand_written(5, out)  # warm-up: imports and caches
        for n in SIZES:
            ours, theirs = [], []
            for _ in range(REPEATS):
                ours.append(timed(with_torchstep, n, out))
                theirs.append(timed(hand_written, n, out))
            samples[n] = (ours, theirs)
            a, b = statistics.median(ours), statistics.median(theirs)
            rows.append((n, a, b, a / b))
            print(f"{n:4d} steps: torchstep {a * 1000:8.1f} ms, hand-written {b * 1000:8.1f} ms, ratio {a / b:.2f}")
    ratio = {n: r for n, _, _, r in rows}
    for fig, n in (("6", 50), ("6b", 500)):
        record(
            fig,
            f"KFP compile of {n} steps vs hand-written container components",
            *samples[n],
            peer_name="hand-written KFP",
            goal=GOAL,
            command="python bench/kfp_compile.py",
        )
    curve(
        "kfp_compile",
        "KFP compile time by pipeline size",
        "steps",
        {"torchstep": [(n, a) for n, a, _, _ in rows], "hand-written": [(n, b) for n, _, b, _ in rows]},
    )
    verdict = "meet" if max(ratio[50], ratio[500]) <= GOAL else "miss"
    print(f"50 / 500 steps: ratio {ratio[50]:.2f} / {ratio[500]:.2f} ({verdict} the goal <= {GOAL})")
    lines = [
        "# KFP: pipeline compile time, torchstep vs hand-written",
        "",
        f"`python bench/kfp_compile.py` — medians of {REPEATS} interleaved runs in one process (after a warm-up);",
        f"Python {platform.python_version()}, kfp {__import__('kfp').__version__}, {os.cpu_count()} cpus.",
        "Each step a distinct AppDef; torchstep = `component_from_app` + call, hand-written =",
        "`@dsl.container_component` + the same `set_*` and kfp-kubernetes calls.",
        "",
        "| steps | torchstep (ms) | hand-written (ms) | ratio |",
        "|---|---|---|---|",
        *[f"| {n} | {a * 1000:.1f} | {b * 1000:.1f} | {r:.2f} |" for n, a, b, r in rows],
        "",
        f"Goal at 50 and 500 steps: ratio <= {GOAL} — {verdict}s ({ratio[50]:.2f} / {ratio[500]:.2f}).",
        "",
        "Where the time goes (cProfile of 50 steps, both sides): the hand-written column is mostly",
        "KFP's own `PipelineTask._ensure_container_spec_exists`, which calls `inspect.stack()`",
        "(source context of every frame of the caller's stack, `inspect.getmodule` scanning",
        "`sys.modules`) on each `set_cpu_*`, `set_memory_*` and `set_env_variable`. torchstep makes",
        "that check once per task and lets the same `set_*` calls skip it (`apply_plan`; the IR is",
        "byte for byte the one the plain calls give: tests/kfp/test_apply_plan.py). What is left",
        "of ours is `yaml.dump` of a larger spec (per step the AppDef as the `--spec` argument and",
        "the `result` output, which the step needs at run time); building the plan and the",
        "component is under 1 ms per step.",
        "",
    ]
    RESULTS.write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
