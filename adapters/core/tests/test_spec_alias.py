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
