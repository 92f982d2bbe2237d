"""The documentation site builds strictly (no broken link, anchor or cross-reference; every
page of docs/ in the navigation) and its API reference shows every public name: each name
in the ``__all__`` of ``torchstep``, ``torchstep.kubernetes``, ``torchstep.steps``,
``torchstep.policy`` and the three adapters has its own entry, with its signature. ``make docs`` builds the same site."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).parent / "mkdocs"
# module -> its page of the API reference (docs/reference/<page>.md)
REFERENCE = {
    "torchstep": "torchstep",
    "torchstep.kubernetes": "kubernetes",
    "torchstep.steps": "steps",
    "torchstep.policy": "policy",
    "torchstep_airflow": "airflow",
    "torchstep_kfp": "kfp",
    "torchstep_prefect": "prefect",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-6000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("module", REFERENCE)
def test_api_reference_shows_every_public_name_with_its_signature(site: Path, module: str) -> None:
    html = (site / "reference" / REFERENCE[module] / "index.html").read_text()
    ids = set(re.findall(r'id="([^"]+)"', html))
    mod = importlib.import_module(module)
    submodules = {n for n in mod.__all__ if type(getattr(mod, n)).__name__ == "module"}
    missing = [
        n
        for n in mod.__all__
        if n not in submodules
        and f"{module}.{n}" not in ids
        and f"{module}.{n}.{n}" not in ids  # a function named like its module (kubernetes.render)
    ]
    assert missing == [], f"docs/reference/{REFERENCE[module]}.md does not show {missing}"
    assert not submodules - set(REFERENCE.values()) - {s.split(".")[-1] for s in REFERENCE}
    assert html.count('class="doc-signature') >= 1


@pytest.mark.slow
def test_docstrings_render_as_markdown_not_rst(site: Path) -> None:
    """Sphinx roles and ``Example::`` blocks are rewritten (tools/docs_rst.py), not shown raw."""
    for page in REFERENCE.values():
        text = re.sub(r"<[^>]+>", "", (site / "reference" / page / "index.html").read_text())
        raw = re.findall(r":(?:func|class|meth|mod|attr|exc):`[^`]*`|\w+::\s*$", text, re.M)
        assert raw == [], f"reference/{page}: {raw[:5]}"


@pytest.mark.slow
def test_every_page_and_the_changelog_are_on_the_site(site: Path) -> None:
    for page in sorted((ROOT / "docs").glob("*.md")):
        built = site / ("index.html" if page.stem == "index" else f"{page.stem}/index.html")
        assert built.is_file(), f"docs/{page.name} is not on the site"
    changelog = (site / "changelog" / "index.html").read_text()
    assert "Keep a Changelog" in changelog and "Unreleased" in changelog
