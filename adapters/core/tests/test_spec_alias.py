"""``torchstep.spec`` was split into ``torchstep.plan`` and ``torchstep.components``: the old
import paths still work for one release, give the same module objects, and warn."""

import subprocess
import sys


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-c", code],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_old_module_paths_are_the_new_modules_and_warn_once() -> None:
    out = _run(
        "import torchstep.spec.model as a, torchstep.plan.model as b\n"
        "from torchstep.spec.components import materialize\n"
        "from torchstep.spec.appjson import app_to_dict\n"
        "import torchstep.components.materialize as m, torchstep.components.appjson as j\n"
        "print(a is b, materialize is m.materialize, app_to_dict is j.app_to_dict)\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "True"]
    assert out.stderr.count("torchstep.spec was renamed") == 1


def test_the_new_paths_do_not_warn() -> None:
    out = _run("import torchstep.plan.planner, torchstep.components.materialize, torchstep.components.plan_cache")
    assert out.returncode == 0 and "DeprecationWarning" not in out.stderr, out.stderr


def test_the_torchx_schedulers_moved_to_core_submit_without_the_orchestrator_and_old_paths_warn() -> None:
    # `torchx run -s airflow|prefect` talks REST only: core registers them, no Airflow/Prefect import
    out = _run(
        "import sys\n"
        "from torchx.schedulers import get_scheduler_factories\n"
        "f = get_scheduler_factories()\n"
        "print(type(f['airflow']('t')).__module__, type(f['prefect']('t')).__module__)\n"
        "print(sorted(m for m in ('airflow', 'prefect', 'torchstep_airflow', 'torchstep_prefect') if m in sys.modules))\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["torchstep.schedulers.airflow torchstep.schedulers.prefect", "[]"]
    for old, new in (("torchstep_airflow.torchx_scheduler", "torchstep.schedulers.airflow"),
                     ("torchstep_prefect.torchx_scheduler", "torchstep.schedulers.prefect")):  # fmt: skip
        package = old.split(".")[0]
        if subprocess.run([sys.executable, "-c", f"import {package}"], capture_output=True).returncode:
            continue  # that adapter is not installed here (the core-only wheel test)
        out = _run(f"import {old} as a, {new} as b\nprint(a is b, a.create_scheduler is b.create_scheduler)")
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["True", "True"]
        assert f"{old} moved to {new} in 0.3" in out.stderr
