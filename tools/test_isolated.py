"""Install each adapter alone into its own fresh virtual environment with the newest
versions its dependency ranges allow, import it, and run its own unit tests there.

``core-nightly`` checks the core against torchx-nightly (a different distribution of the
same ``torchx`` package, so never in one venv with torchx): pinned to one daily build,
so a new nightly cannot turn CI red by itself; bump it on purpose.

This proves the plugins are independent: their orchestrators cannot all be at their
newest in one environment. Usage: ``python tools/test_isolated.py core airflow kfp prefect``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UV = Path(sys.executable).parent / "uv"
TOOLS = ["pytest", "pytest-timeout", "hypothesis"]
TORCHX_NIGHTLY = "torchx-nightly==2026.10.26"
# what to report of each environment
REPORT = {
    "core": ["torchx"],
    "core-nightly": ["torchx-nightly"],
    "airflow": ["apache-airflow", "apache-airflow-task-sdk"],
    "kfp": ["kfp"],
    "prefect": ["prefect"],
}


def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=False, text=True, capture_output=True, **kw)  # type: ignore[call-overload]


def check(adapter: str) -> bool:
    venv = ROOT / ".venv-isolated" / adapter
    shutil.rmtree(venv, ignore_errors=True)
    t0 = time.monotonic()
    out = run([str(UV), "venv", "-q", "--python", sys.executable, str(venv)])
    if out.returncode:
        print(out.stdout, out.stderr)
        return False
    py = str(venv / "bin" / "python")
    core = str(ROOT / "adapters" / "core")
    if adapter == "core-nightly":  # core's own dependency names torchx (the release)
        steps = [[TORCHX_NIGHTLY, "pyyaml", *TOOLS], ["--no-deps", "-e", core]]
    else:
        pkgs = ["-e", core] + ([] if adapter == "core" else ["-e", str(ROOT / "adapters" / adapter)])
        steps = [[*pkgs, *TOOLS]]
    for args in steps:
        out = run([str(UV), "pip", "install", "-q", "--python", py, "--resolution", "highest", *args])
        if out.returncode:
            print(f"[{adapter}] install failed:\n{out.stdout}{out.stderr}")
            return False
    module = f"torchstep_{adapter}" if adapter in ("airflow", "kfp", "prefect") else "torchstep"
    probe = (
        "import sys, importlib; importlib.import_module(sys.argv[1]); "
        "assert 'torch' not in sys.modules, 'importing pulled in torch'"
    )
    out = run([py, "-c", probe, module])
    if out.returncode:
        print(f"[{adapter}] import failed:\n{out.stdout}{out.stderr}")
        return False
    versions = run([str(UV), "pip", "list", "--python", py, "--format", "freeze"]).stdout.splitlines()
    shown = [v for v in versions if v.split("==")[0].lower() in REPORT[adapter]]
    tests = (
        ROOT / "adapters" / "core" / "tests" / "test_torchx_versions.py"
        if adapter == "core-nightly"
        else ROOT / "adapters" / adapter / "tests"
    )
    out = run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)], cwd=ROOT)
    ok = out.returncode == 0
    tail = "\n".join(out.stdout.strip().splitlines()[-3:])
    print(f"[{adapter}] {', '.join(shown)} — {'ok' if ok else 'FAILED'} in {time.monotonic() - t0:.0f} s\n{tail}")
    if not ok:
        print(out.stdout[-6000:], out.stderr[-3000:])
    return ok


def main() -> int:
    adapters = sys.argv[1:] or list(REPORT)
    failed = [a for a in adapters if not check(a)]
    if failed:
        print(f"isolated install check failed for: {', '.join(failed)}")
        return 1
    print(f"isolated install check: {len(adapters)} adapters ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
