"""One path for each module, no aliases (nothing was released, so nothing is deprecated):
``torchstep.spec``, ``JobSet`` and the adapters' moved modules are gone; the packages export
their public names; the TorchX schedulers live in core without the orchestrators."""

import subprocess
import sys


def _run(code: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-W", "always::DeprecationWarning", "-c", code]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_the_packages_export_their_public_names_without_torch_or_a_warning() -> None:
    out = _run(
        "import sys\n"
        "import torchstep.components.builders, torchstep.plan.explain\n"  # a submodule first: no name clash
        "from torchstep.plan import build_plan, StepPlan\n"
        "from torchstep.components import materialize, app_to_dict\n"
        "plan = build_plan(materialize('utils.echo', ['--msg', 'hi']), 'local')\n"
        "print(isinstance(plan, StepPlan), plan.roles[0].args, 'torch' in sys.modules)\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "('hi',)", "False"]
    assert "DeprecationWarning" not in out.stderr, out.stderr


def test_the_removed_aliases_are_gone_and_nothing_sits_on_the_import_path() -> None:
    out = _run(
        "import sys, torchstep, torchstep.kubernetes, torchstep.lazy\n"
        "finders = [type(f).__module__ for f in sys.meta_path]\n"
        "print(any(m.startswith('torchstep') for m in finders))\n"
        "try:\n    import torchstep.spec\nexcept ModuleNotFoundError:\n    print('no spec')\n"
        "print(hasattr(torchstep.kubernetes, 'JobSet'), hasattr(torchstep.lazy, 'moved_module'))\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "no", "spec", "False", "False"]


def test_the_torchx_schedulers_live_in_core_and_submit_without_the_orchestrator() -> None:
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


def test_one_lazy_helper_serves_torchstep_its_packages_and_the_adapters() -> None:
    out = _run(
        "import sys, torchstep, torchstep.agent, torchstep.plan, torchstep.components\n"
        "print('torchstep.plan.planner' in sys.modules, 'torchx' in sys.modules)\n"
        "print(torchstep.agent.main.__module__, torchstep.steps.__name__, torchstep.__version__ != '')\n"
        "print('torchstep.plan.planner' in sys.modules)\n"
        "for mod in (torchstep, torchstep.plan):\n"
        "    try:\n        mod.no_such_name\n    except AttributeError as e:\n        print(type(e).__name__)\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [
        "False",
        "False",
        "torchstep.agent.cli",
        "torchstep.steps",
        "True",
        "False",
        "AttributeError",
        "AttributeError",
    ]
