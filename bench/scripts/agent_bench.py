"""Shared helpers of the agent benchmarks (bench/agent_*.py)."""

from __future__ import annotations

import os
import platform
import re
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
SCRIPTS = BENCH / "scripts"
RESULTS = BENCH / "results" / "agent.md"
CORE_SRC = BENCH.parent / "adapters" / "core" / "src"


def _torch_row() -> tuple[str, str]:
    """The torch the agent benchmarks measure: the dev .venv's (a CPU build) by default;
    ``BENCH_TORCH_ROW=py3.13-torch2.15.0`` picks a row of the torch matrix instead (its
    virtualenv of PyPI's own wheels, the CUDA build users' images carry, built if missing by
    tools/torch_matrix.py). Returns the row id ("" for the default) and its interpreter."""
    row = os.environ.get("BENCH_TORCH_ROW", "").strip()
    if not row:
        return "", sys.executable
    sys.path.insert(0, str(BENCH.parent / "tools"))
    import torch_matrix

    try:
        (chosen,) = torch_matrix.select(row)
    except ValueError as e:
        raise SystemExit(f"BENCH_TORCH_ROW: {e}") from None
    return chosen.id, torch_matrix.ensure(chosen, log=lambda line: print(line, file=sys.stderr))


def _launchers(python: str) -> Path:
    """``torchrun`` and ``torchstep-agent`` for ``python`` as pip writes console scripts
    (torchstep from this source tree: PYTHONPATH in :func:`clean_env`)."""
    import atexit
    import shutil
    import tempfile

    bin_dir = Path(tempfile.mkdtemp(prefix="bench-launchers-"))
    atexit.register(shutil.rmtree, bin_dir, True)
    for name, module in (("torchrun", "torch.distributed.run"), ("torchstep-agent", "torchstep.agent.cli")):
        script = bin_dir / name
        script.write_text(f"#!{python}\nimport sys\nfrom {module} import main\nsys.exit(main())\n")
        script.chmod(0o755)
    return bin_dir


TORCH_ROW, TORCH_PYTHON = _torch_row()
BIN = _launchers(TORCH_PYTHON) if TORCH_ROW else Path(sys.executable).parent
TORCHRUN = str(BIN / "torchrun")
AGENT = str(BIN / "torchstep-agent")
#: what every figure of this run measured, e.g. "torch 2.15.0+cu132, Python 3.13.0"
TORCH_BUILD = subprocess.run(
    [
        TORCH_PYTHON,
        "-c",
        "import platform, torch; print(f'torch {torch.__version__}, Python {platform.python_version()}')",
    ],
    capture_output=True,
    text=True,
    check=True,
).stdout.strip()
os.environ["BENCH_TORCH"] = TORCH_BUILD  # figures.machine() records it with each figure


def figure_id(fig: str) -> str:
    """``fig`` for the default torch; ``fig@<row>`` for a torch-matrix row."""
    return f"{fig}@{TORCH_ROW}" if TORCH_ROW else fig


def row_command(command: str) -> str:
    """``command`` as it reruns this figure: with ``BENCH_TORCH_ROW=<row>`` first for a row."""
    return f"BENCH_TORCH_ROW={TORCH_ROW} {command}" if TORCH_ROW else command


HEADER = """# Embedded agent benchmarks

Written by `bench/agent_startup.py`, `bench/agent_recovery.py` and
`bench/agent_node_loss.py` (each replaces its own section). Ratios are
torchstep-agent / torchrun on the same script, runs alternated; goal <= 1.0.
"""


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCHSTEP_", "PET_", "TORCHELASTIC_")) and k != "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
    }
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    if TORCH_ROW:  # the row's virtualenv holds torch and torchx; torchstep is this checkout
        env["PYTHONPATH"] = str(CORE_SRC)
    env.update(extra)
    return env


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def machine() -> str:
    return (
        f"Machine: {os.cpu_count()} CPU(s), {platform.machine()}; measured: {TORCH_BUILD}"
        f"{f' (torch-matrix row {TORCH_ROW})' if TORCH_ROW else ''}; other work may have shared the machine."
    )


def update_section(name: str, body: str) -> None:
    """Replace (or add) the section of benchmark ``name`` in bench/results/agent.md."""
    text = RESULTS.read_text() if RESULTS.exists() else HEADER
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    block = f"{start}\n{body.strip()}\n{end}"
    if start in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
