"""Shared helpers of the agent benchmarks (bench/agent_*.py)."""

from __future__ import annotations

import os
import platform
import re
import statistics
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
SCRIPTS = BENCH / "scripts"
RESULTS = BENCH / "results" / "agent.md"
BIN = Path(sys.executable).parent
TORCHRUN = str(BIN / "torchrun")
AGENT = str(BIN / "torchstep-agent")

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
    env.update(extra)
    return env


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def machine() -> str:
    import torch

    return (
        f"Machine: {os.cpu_count()} CPU(s), {platform.machine()}, Python {platform.python_version()}, "
        f"torch {torch.__version__}; other work may have shared the machine."
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
