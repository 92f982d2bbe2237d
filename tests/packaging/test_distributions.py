"""The four distributions as PyPI shows them and as pip installs them: one version each,
written once; adapters that require the same release of torchstep; classifiers that exist;
a README that reads well on PyPI; a license; and the extras the docs tell users to install.
(`make dist` builds them and runs twine and check-wheel-contents; tools/test_wheels.py
installs the wheels.)"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DISTS = {"core": "torchstep", "airflow": "torchstep-airflow", "kfp": "torchstep-kfp", "prefect": "torchstep-prefect"}
PYPROJECT = {d: tomllib.loads((ROOT / "adapters" / d / "pyproject.toml").read_text())["project"] for d in DISTS}
CORE_VERSION = PYPROJECT["core"]["version"]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("adapters/*/README.md"))]


@pytest.mark.parametrize("d", DISTS)
def test_name_version_and_python(d: str) -> None:
    project = PYPROJECT[d]
    assert project["name"] == DISTS[d]
    assert re.fullmatch(r"\d+\.\d+\.\d+", project["version"]), project["version"]
    assert project["version"] == CORE_VERSION, "the four distributions are released together, with one version"
    assert project["requires-python"] == ">=3.10"  # step images of 2024 (NGC PyTorch 24.xx) carry 3.10
    assert version(DISTS[d]) == project["version"], "the installed metadata is stale: run `make env`"


@pytest.mark.parametrize("d", ["airflow", "kfp", "prefect"])
def test_adapters_require_the_same_release_of_torchstep(d: str) -> None:
    major, minor, _ = (int(x) for x in CORE_VERSION.split("."))
    wanted = f"torchstep>={major}.{minor},<{major}.{minor + 1}"
    assert [r for r in PYPROJECT[d]["dependencies"] if r.startswith("torchstep")] == [wanted]


@pytest.mark.parametrize("d", DISTS)
def test_classifiers_exist_on_pypi_and_say_what_it_is(d: str) -> None:
    from trove_classifiers import classifiers, deprecated_classifiers

    found = PYPROJECT[d]["classifiers"]
    assert [c for c in found if c not in classifiers or c in deprecated_classifiers] == []
    assert not [c for c in found if c.startswith("License ::")], "PEP 639: the license expression says it"
    assert "Typing :: Typed" in found
    # the Pythons tested (tools/torch_matrix.py runs the core on each), from requires-python's floor on
    minors = [c.rsplit(" ", 1)[1] for c in found if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert minors == ["3.10", "3.11", "3.12", "3.13"]
    assert PYPROJECT[d]["requires-python"] == f">={minors[0]}"
    if d == "airflow":
        assert "Framework :: Apache Airflow :: Provider" in found


@pytest.mark.parametrize("d", DISTS)
def test_license_readme_and_urls(d: str) -> None:
    project, folder = PYPROJECT[d], ROOT / "adapters" / d
    assert project["license"] == "BSD-3-Clause" and project["license-files"] == ["LICENSE"]
    assert (folder / "LICENSE").read_text().startswith("BSD 3-Clause License\n")
    assert project["readme"] == "README.md"
    assert {"Homepage", "Documentation", "Source", "Changelog", "Issues"} <= set(project["urls"])
    assert all(u.startswith("https://") for u in project["urls"].values())


@pytest.mark.parametrize("d", DISTS)
def test_readme_links_work_on_pypi(d: str) -> None:
    """PyPI renders the README away from the repository: a relative link would be broken."""
    text = (ROOT / "adapters" / d / "README.md").read_text()
    assert text.startswith(f"# {DISTS[d]}\n")
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert links and [u for u in links if not u.startswith("https://")] == []


def test_every_pip_install_in_the_docs_names_a_real_distribution_and_extra() -> None:
    extras = {DISTS[d]: set(PYPROJECT[d].get("optional-dependencies", {})) for d in DISTS}
    found = []
    for path in DOCS:
        for m in re.finditer(r"pip install\s+\"?(torchstep[\w-]*)(?:\[([\w,-]+)\])?", path.read_text()):
            dist, wanted = m.group(1), m.group(2)
            found.append(m.group(0))
            assert dist in extras, f"{path.name}: {m.group(0)!r} names no distribution of this repository"
            for extra in (wanted or "").split(",") if wanted else []:
                assert extra in extras[dist], f"{path.name}: {m.group(0)!r}: {dist} has no extra {extra!r}"
    assert len(found) >= 10, found


def test_no_version_string_is_written_twice() -> None:
    """The version lives in pyproject.toml; code reads it from the installed metadata."""
    pattern = re.compile(rf"['\"]{re.escape(CORE_VERSION)}['\"]|__version__\s*=")
    hits = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in ROOT.glob("adapters/*/src/**/*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


def test_airflow_provider_info_leaves_the_version_to_the_metadata() -> None:
    from torchstep_airflow.get_provider_info import get_provider_info

    assert "versions" not in get_provider_info()


@pytest.mark.parametrize("script", ["torchstep", "torchstep-agent"])
def test_version_flag_prints_the_installed_version_without_torch(script: str) -> None:
    exe = Path(sys.executable).parent / script
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (0, f"{script} {CORE_VERSION}\n"), out.stderr
    import torchstep
    import torchstep_airflow
    import torchstep_kfp
    import torchstep_prefect

    for module in (torchstep, torchstep_airflow, torchstep_kfp, torchstep_prefect):
        assert module.__version__ == CORE_VERSION


def test_the_agent_answers_version_before_it_imports_torch() -> None:
    code = (
        "import sys\nfrom torchstep.agent.cli import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit as e:\n    print(e.code, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.splitlines()[-1] == "0 False", out.stdout + out.stderr


def test_changelog_keeps_a_changelog_and_names_this_release() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n") and "## [Unreleased]" in text
    assert re.search(rf"^## \[{re.escape(CORE_VERSION)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", text, re.M)
    assert f"[{CORE_VERSION}]: https://" in text
