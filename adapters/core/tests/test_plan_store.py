"""The plan store (torchstep.components.plan_store): what is kept across processes, what
makes an entry stale, and that nothing on disk is trusted that torchstep did not write."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from torchstep.components import plan_store
from torchstep.components.builders import UnknownParameterError
from torchstep.errors import SpecError

COMPONENT = '''
import torchx.specs as specs


def hello(steps: int = 10) -> specs.AppDef:
    """Say hello.

    Args:
        steps: steps
    """
    return specs.AppDef("hello", [specs.Role("worker", image=".", entrypoint="echo", args=[str(steps)])])
'''


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "store"
    monkeypatch.setenv(plan_store.ENV, str(root))
    plan_store.clear_memory()
    yield root
    plan_store.clear_memory()


@pytest.fixture
def component(tmp_path: Path) -> Path:
    path = tmp_path / "hello.py"
    path.write_text(COMPONENT)
    return path


class Counter:
    """A compute function that counts its calls (a miss) and returns ``outcome``."""

    def __init__(self, outcome: dict[str, Any] | None = None, error: Exception | None = None) -> None:
        self.calls = 0
        self.outcome = outcome if outcome is not None else {"retries": 2, "delay": timedelta(seconds=5)}
        self.error = error

    def __call__(self) -> tuple[dict[str, Any], list[str]]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.outcome, []


def fresh(ref: Any, key: dict[str, Any], compute: Counter) -> dict[str, Any]:
    """``remember`` as a new process would call it (nothing remembered in memory)."""
    plan_store.clear_memory()
    return plan_store.remember("test", ref, key, compute)


def entries(root: Path) -> list[Path]:
    return sorted(root.glob("*.json"))


def test_a_file_reference_is_computed_once_and_its_outcome_read_back(store: Path, component: Path) -> None:
    compute = Counter()
    ref = f"{component}:hello"
    first = fresh(ref, {"args": ["--steps", "3"], "target": "local"}, compute)
    again = fresh(ref, {"args": ["--steps", "3"], "target": "local"}, compute)
    assert first == again == {"retries": 2, "delay": timedelta(seconds=5)}
    assert compute.calls == 1
    assert len(entries(store)) == 1


@pytest.mark.parametrize(
    "change",
    [
        {"args": ["--steps", "4"]},
        {"args": ["--steps", 3]},  # a number is not its string
        {"target": "kubernetes"},
        {"cfg": {"log_dir": "/data"}},
        {"user": [1, None]},
    ],
)
def test_any_other_key_is_another_entry(store: Path, component: Path, change: dict[str, Any]) -> None:
    compute = Counter()
    ref = f"{component}:hello"
    base: dict[str, Any] = {"args": ["--steps", "3"], "target": "local"}
    fresh(ref, base, compute)
    fresh(ref, {**base, **change}, compute)
    assert compute.calls == 2
    fresh(ref, {**base, **change}, compute)
    assert compute.calls == 2


def _edit(path: Path, text: str) -> None:
    before = path.stat()
    path.write_text(text)
    if path.stat().st_mtime_ns == before.st_mtime_ns:  # a coarse clock: make the edit visible
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))


@pytest.mark.parametrize("how", ["content", "mtime", "inode"])
def test_an_edited_component_file_is_computed_again(store: Path, component: Path, how: str) -> None:
    compute = Counter()
    ref = f"{component}:hello"
    key = {"args": ["--steps", "3"], "target": "local"}
    _label, (version,) = plan_store.component_key(ref)  # type: ignore[misc]
    fresh(ref, key, compute)
    if how == "content":  # size changes
        _edit(component, COMPONENT + "\n# edited\n")
    elif how == "mtime":  # same size, same inode
        st = component.stat()
        os.utime(component, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    else:  # replaced by a copy with the same content and times (editors that save by rename)
        st = component.stat()
        copy = component.with_suffix(".new")
        copy.write_text(COMPONENT)
        os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.replace(copy, component)
    assert plan_store.component_key(ref)[1][0] != version  # type: ignore[index]
    fresh(ref, key, compute)
    assert compute.calls == 2


def test_a_builtin_is_keyed_by_its_module_file_in_torchx(store: Path) -> None:
    label, versions = plan_store.component_key("dist.ddp")  # type: ignore[misc]
    assert label == "builtin:dist.ddp"
    assert versions[0][0].endswith(os.path.join("torchx", "components", "dist.py"))
    assert plan_store.component_key("no_such_module.fn") is None


def test_the_code_versions_are_part_of_the_key(store: Path, component: Path, monkeypatch) -> None:
    compute = Counter()
    ref = f"{component}:hello"
    fresh(ref, {"args": []}, compute)
    real = plan_store._code_versions

    def upgraded(*files: Any) -> list[str]:
        return [*real(*files), "torchx 99"]

    monkeypatch.setattr(plan_store, "_code_versions", upgraded)
    fresh(ref, {"args": []}, compute)
    assert compute.calls == 2


def test_what_is_not_kept(store: Path, component: Path) -> None:
    compute = Counter()
    plan_store.remember("test", "package.module:fn", {"args": []}, compute)  # finding it would import it
    plan_store.remember("test", lambda: None, {"args": []}, compute)
    plan_store.remember("test", f"{component}:hello", {"args": [object()]}, compute)  # not a key (an XComArg)
    plan_store.remember("test", f"{component.parent / 'missing.py'}:hello", {"args": []}, compute)
    assert compute.calls == 4
    assert entries(store) == []


def test_errors_are_kept_and_raised_again_until_the_file_changes(store: Path, component: Path) -> None:
    ref = f"{component}:hello"
    key = {"args": ["--stpes", "3"]}
    compute = Counter(error=UnknownParameterError("component.stpes", "local", "no parameter 'stpes'", fix="steps"))
    for _ in range(2):
        with pytest.raises(UnknownParameterError) as e:
            fresh(ref, key, compute)
        assert e.value.field == "component.stpes" and "fix: steps" in str(e.value)
    assert compute.calls == 1
    plain = Counter(error=SpecError("retries", "local", "bad", fix="drop it"))
    with pytest.raises(SpecError):
        fresh(ref, {"args": []}, plain)
    with pytest.raises(SpecError, match=r"retries .*bad; fix: drop it"):
        fresh(ref, {"args": []}, plain)
    assert plain.calls == 1
    _edit(component, COMPONENT + "\n# fixed\n")
    fresh(ref, key, Counter())


def test_entries_are_private(store: Path, component: Path) -> None:
    fresh(f"{component}:hello", {"args": []}, Counter())
    assert stat.S_IMODE(store.stat().st_mode) == 0o700
    (entry,) = entries(store)
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600


def _tamper(entry: Path) -> None:
    data = json.loads(entry.read_text())
    data["outcome"] = {"d": [["retries", 99]]}
    entry.write_text(json.dumps(data))


def test_a_symlinked_entry_is_ignored_and_replaced(store: Path, component: Path, tmp_path: Path) -> None:
    compute = Counter()
    ref, key = f"{component}:hello", {"args": []}
    fresh(ref, key, compute)
    (entry,) = entries(store)
    planted = tmp_path / "planted.json"
    planted.write_text(entry.read_text())
    _tamper(planted)
    planted.chmod(0o600)
    entry.unlink()
    entry.symlink_to(planted)
    assert fresh(ref, key, compute)["retries"] == 2
    assert compute.calls == 2
    assert not entry.is_symlink() and "99" in planted.read_text()  # the link replaced, its target untouched


def test_the_store_is_pruned_on_a_processs_first_write_then_every_prune_every_th(
    store: Path, component: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plan_store, "MAX_ENTRIES", 4)
    monkeypatch.setattr(plan_store, "_writes", 0)  # a new process
    compute = Counter()
    ref = f"{component}:hello"
    fresh(ref, {"args": ["0"]}, compute)  # creates the store; this first write pruned nothing yet
    for i in range(9):  # older entries, as other processes left them
        old = store / f"old{i}.json"
        old.write_text("{}")
        old.chmod(0o600)
        os.utime(old, ns=(i, i))
    monkeypatch.setattr(plan_store, "_writes", 0)  # another new process: its first write prunes
    fresh(ref, {"args": ["1"]}, compute)
    left = entries(store)
    assert len(left) == 6 and not any(p.name in {f"old{i}.json" for i in range(5)} for p in left)  # oldest half
    for i in range(2, 5):  # the next writes of that process leave the store alone
        fresh(ref, {"args": [str(i)]}, compute)
    assert len(entries(store)) == 9


def test_an_entry_with_other_modes_or_owner_is_not_trusted(store: Path, component: Path, monkeypatch) -> None:
    compute = Counter()
    ref, key = f"{component}:hello", {"args": []}
    fresh(ref, key, compute)
    (entry,) = entries(store)
    _tamper(entry)
    entry.chmod(0o644)  # written by someone else's umask, or readable by others
    assert fresh(ref, key, compute)["retries"] == 2
    assert compute.calls == 2
    _tamper(entry)
    entry.chmod(0o600)
    uid = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: uid + 1)  # as if another user owned it (the store was checked)
    assert plan_store.remember("test", ref, key, compute)["retries"] == 2
    assert compute.calls == 3


def test_a_corrupt_entry_is_a_miss(store: Path, component: Path) -> None:
    compute = Counter()
    ref, key = f"{component}:hello", {"args": []}
    fresh(ref, key, compute)
    (entry,) = entries(store)
    for text in ("{not json", "", "[]", '{"material": 1}'):
        entry.write_text(text)
        assert fresh(ref, key, compute)["retries"] == 2
    assert compute.calls == 5
    assert fresh(ref, key, compute)["retries"] == 2
    assert compute.calls == 5  # rewritten whole


def test_an_unsafe_store_directory_is_not_used(tmp_path: Path, component: Path, monkeypatch) -> None:
    root = tmp_path / "shared"
    root.mkdir(mode=0o777)
    root.chmod(0o777)
    monkeypatch.setenv(plan_store.ENV, str(root))
    compute = Counter()
    fresh(f"{component}:hello", {"args": []}, compute)
    fresh(f"{component}:hello", {"args": []}, compute)
    assert compute.calls == 2 and entries(root) == []
    monkeypatch.setenv(plan_store.ENV, "0")
    fresh(f"{component}:hello", {"args": []}, compute)
    assert compute.calls == 3


def test_a_module_the_component_file_imports_is_part_of_the_entry(store: Path, tmp_path: Path, monkeypatch) -> None:
    lib = tmp_path / "hello_lib_store_test.py"
    lib.write_text("STEPS = 3\n")
    comp = tmp_path / "uses_lib.py"
    comp.write_text("import hello_lib_store_test\n" + COMPONENT)
    monkeypatch.syspath_prepend(str(tmp_path))
    ref = f"{comp}:hello"

    def compute() -> tuple[dict[str, Any], list[str]]:
        calls.append(1)
        import importlib

        importlib.import_module("hello_lib_store_test")
        return {"ok": True}, []

    calls: list[int] = []
    fresh(ref, {"args": []}, compute)  # type: ignore[arg-type]
    sys.modules.pop("hello_lib_store_test", None)
    fresh(ref, {"args": []}, compute)  # type: ignore[arg-type]
    assert len(calls) == 1
    time.sleep(0.01)
    _edit(lib, "STEPS = 4  # edited\n")
    sys.modules.pop("hello_lib_store_test", None)
    fresh(ref, {"args": []}, compute)  # type: ignore[arg-type]
    assert len(calls) == 2


def test_an_image_that_becomes_a_directory_is_computed_again(store: Path, component: Path, tmp_path: Path) -> None:
    image = tmp_path / "image"
    calls: list[int] = []

    def compute() -> tuple[dict[str, Any], list[str]]:
        calls.append(1)
        return {"ok": True}, [str(image)]

    fresh(f"{component}:hello", {"args": []}, compute)  # type: ignore[arg-type]
    fresh(f"{component}:hello", {"args": []}, compute)  # type: ignore[arg-type]
    image.mkdir()
    fresh(f"{component}:hello", {"args": []}, compute)  # type: ignore[arg-type]
    assert len(calls) == 2


def test_a_hit_imports_neither_torchx_nor_the_planner(store: Path, component: Path) -> None:
    code = textwrap.dedent("""
        import sys
        from torchstep.components.plan_store import remember
        def compute():
            from torchstep.components.builders import materialize
            materialize("dist.ddp", ["--script", "t.py"])
            return {"ok": 1}, []
        print(remember("t", "dist.ddp", {"args": ["--script", "t.py"]}, compute),
              "torchx" in sys.modules, "torchstep.plan.planner" in sys.modules)
    """)
    env = {**os.environ, plan_store.ENV: str(store)}
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    again = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert first.stdout.split()[-2] == "True"
    assert again.stdout.split() == ["{'ok':", "1}", "False", "False"], again.stdout + again.stderr
