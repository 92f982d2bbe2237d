"""The Prefect adapter installs alone (with the newest Prefect its range allows) and
imports without pulling in torch, Airflow or KFP."""

import subprocess
import sys


def test_import_is_light_and_prefect_is_installed():
    code = (
        "import sys, importlib.metadata as md, torchstep_prefect;"
        "bad = sorted(m for m in ('torch', 'airflow', 'kfp') if m in sys.modules);"
        "print(','.join(bad) or 'clean', md.version('prefect'))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert out[0] == "clean", f"importing torchstep_prefect pulled in: {out[0]}"
    assert int(out[1].split(".")[0]) == 3, f"torchstep-prefect targets Prefect 3, found {out[1]}"


def test_core_plans_for_the_local_target():
    import torchstep

    plan = torchstep.build_plan(torchstep.materialize("utils.sh", ["echo", "a b"]), target="local")
    assert plan.roles[0].argv == ["sh", "-c", "echo 'a b'"]  # torchx quotes each word
