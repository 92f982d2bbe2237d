"""The KFP adapter installs alone (with the newest kfp its range allows) and imports
without pulling in torch, Airflow or Prefect."""

import subprocess
import sys


def test_import_is_light_and_kfp_is_installed():
    code = (
        "import sys, importlib.metadata as md, torchstep_kfp;"
        "bad = sorted(m for m in ('torch', 'airflow', 'prefect') if m in sys.modules);"
        "print(','.join(bad) or 'clean', md.version('kfp'))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert out[0] == "clean", f"importing torchstep_kfp pulled in: {out[0]}"
    major = int(out[1].split(".")[0])
    assert major == 2, f"torchstep-kfp targets KFP v2, found kfp {out[1]}"


def test_core_plans_for_the_kfp_target():
    import torchstep

    plan = torchstep.build_plan(torchstep.materialize("utils.echo", ["--msg", "hi"]), target="kfp")
    assert plan.target == "kfp"
    assert plan.roles[0].argv == ["echo", "hi"]
