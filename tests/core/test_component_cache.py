"""Resolving a component once per process (torchstep.components.cache): the same
AppDefs and the same errors as TorchX's ``get_component``, without its entry point scans,
and never a stale or shared result."""

from __future__ import annotations

import os
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import importlib_metadata
import pytest
import torchstep
from torchstep.components import cache as component_cache
from torchstep.components.builders import materialize
from torchstep.components.plan_cache import materialize_and_plan
from torchx.specs import finder

COMPONENTS = '''
from typing import Optional

import torchx.specs as specs

with open(COUNTER, "a") as _f:  # one mark per execution of this file
    _f.write("x")


def first(msg: str = "hi", lr: float = 0.1, tag: Optional[str] = None) -> specs.AppDef:
    """First.

    Args:
        msg: message
        lr: learning rate
        tag: a tag
    """
    return specs.AppDef("VERSION", [specs.Role("first", image="img", entrypoint="echo", args=[msg, str(lr)])])


def second(n: int = 1) -> specs.AppDef:
    """Second.

    Args:
        n: a number
    """
    return specs.AppDef("second", [specs.Role("second", image="img", entrypoint="echo", args=[str(n)])])


def unannotated(n=1) -> specs.AppDef:
    """No annotation.

    Args:
        n: a number
    """
    return specs.AppDef("x", [])
'''


def _write(path: Path, counter: Path, version: str) -> None:
    path.write_text(COMPONENTS.replace("COUNTER", repr(str(counter))).replace("VERSION", version))


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    component_cache.clear()
    yield
    component_cache.clear()


@pytest.fixture
def comp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.chdir(tmp_path)
    path, counter = tmp_path / "comps.py", tmp_path / "executions.txt"
    _write(path, counter, "v1")
    return path, counter


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts entry point scans (both importlib.metadata flavours) and TorchX finder listings."""
    import importlib.metadata

    calls = {"entry_points": 0, "finder": 0}

    def counting(module: Any, name: str, kind: str) -> None:
        original = getattr(module, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[kind] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counting(importlib_metadata, "entry_points", "entry_points")
    counting(importlib.metadata, "entry_points", "entry_points")
    counting(finder, "_load_components", "finder")
    return calls


def _spec_error(component: Any, args: Any = None) -> torchstep.SpecError:
    with pytest.raises(torchstep.SpecError) as info:
        materialize(component, args)
    return info.value


def test_an_edited_component_file_is_read_again(comp: tuple[Path, Path]) -> None:
    path, counter = comp
    assert materialize("comps.py:first").name == "v1"
    assert materialize("comps.py:first").name == "v1"
    assert counter.read_text() == "x"  # executed once for both calls
    st = path.stat()
    _write(path, counter, "v2")  # same size: only the times tell the versions apart
    assert path.stat().st_size == st.st_size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert materialize("comps.py:first").name == "v2"
    assert counter.read_text() == "xx"


def test_every_call_returns_a_fresh_appdef_and_plan(comp: tuple[Path, Path]) -> None:
    first = materialize("comps.py:first", {"msg": "a"})
    first.roles[0].args.append("--mutated")
    first.name = "changed"
    again = materialize("comps.py:first", {"msg": "a"})
    assert again is not first and again.name == "v1" and again.roles[0].args == ["a", "0.1"]

    app1, plan1 = materialize_and_plan("comps.py:first", {"msg": "a"}, "local")
    app1.roles[0].args.append("--mutated")
    app1.roles[0].env["X"] = "1"
    app2, plan2 = materialize_and_plan("comps.py:first", {"msg": "a"}, "local")
    assert app2 is not app1 and plan2 is not plan1
    assert app2.roles[0].args == ["a", "0.1"] and app2.roles[0].env == {}
    assert plan2 == plan1 and plan2.roles[0] is not plan1.roles[0]
    assert plan2.roles[0].env is not plan1.roles[0].env
    # different arguments or target: a different plan, never a cached one
    assert materialize_and_plan("comps.py:first", {"msg": "b"}, "local")[0].roles[0].args == ["b", "0.1"]
    assert materialize_and_plan("comps.py:first", {"lr": 1}, "local")[0].roles[0].args == ["hi", "1.0"]
    assert materialize_and_plan("comps.py:first", {"lr": 1.0}, "local")[0].roles[0].args == ["hi", "1.0"]
    assert materialize_and_plan("comps.py:first", {"msg": "a"}, "kubernetes")[1].target == "kubernetes"


def test_the_plan_cache_follows_a_changed_file(comp: tuple[Path, Path]) -> None:
    path, counter = comp
    assert materialize_and_plan("comps.py:first", ["--msg", "a"], "local")[0].name == "v1"
    st = path.stat()
    _write(path, counter, "v3")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert materialize_and_plan("comps.py:first", ["--msg", "a"], "local")[0].name == "v3"


def test_two_functions_of_one_file_share_one_execution(comp: tuple[Path, Path]) -> None:
    _, counter = comp
    assert materialize("comps.py:first").roles[0].name == "first"
    assert materialize("comps.py:second", ["--n", "3"]).roles[0].args == ["3"]
    assert materialize("comps.py:first", {"msg": "x"}).roles[0].args == ["x", "0.1"]
    assert counter.read_text() == "x"
    absolute = materialize(f"{comp[0]}:second")  # the same file named by its absolute path
    assert absolute.roles[0].args == ["1"] and counter.read_text() == "x"


def test_the_file_runs_as_torchx_runs_it(comp: tuple[Path, Path]) -> None:
    from torchstep.components.builders import component_of

    fn, label = component_of("comps.py:first")
    assert label == "comps.py:first"
    assert fn.__annotations__["msg"] is str  # evaluated: no __future__ flag leaks in from torchstep
    assert fn.__globals__["__file__"] == str(comp[0])  # as TorchX (nightly) sets it
    theirs = finder.get_component("comps.py:first").fn  # TorchX's own loading, for comparison
    assert theirs.__annotations__ == fn.__annotations__
    assert materialize("comps.py:first", {"lr": 2}) == materialize(theirs, {"lr": 2})


def test_bad_arguments_raise_the_same_spec_error_every_time(comp: tuple[Path, Path]) -> None:
    for _ in range(2):
        e = _spec_error("comps.py:first", {"nope": 1})
        assert e.field == "component.nope" and "has no parameter 'nope'" in str(e)
        e = _spec_error("comps.py:first", ["--lr", "fast"])
        assert e.field == "component" and "argument --lr: invalid float value: 'fast'" in str(e)
        with pytest.raises(torchstep.SpecError) as info:
            materialize_and_plan("comps.py:first", {"nope": 1}, "local")
        assert info.value.field == "component.nope"
        e = _spec_error("comps.py:unannotated")
        assert "has validation errors" in str(e) and "returns specs.AppDef" in (e.fix or "")
        e = _spec_error("comps.py:missing")
        assert "comps.py has no function 'missing'" in str(e)  # said before the file is executed


def test_a_broken_file_fails_each_time_and_works_once_fixed(comp: tuple[Path, Path]) -> None:
    path, counter = comp
    path.write_text("def f(:\n")
    for _ in range(2):
        assert "SyntaxError" in str(_spec_error("comps.py:f"))
    _write(path, counter, "fixed")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000_000))
    assert materialize("comps.py:first").name == "fixed"


def test_builtins_by_name_are_torchx_own_functions() -> None:
    from torchx.components.dist import ddp
    from torchx.components.utils import echo

    argv = ["-j", "2x2", "--script", "train.py", "--", "--seed", "1"]
    assert component_cache.resolve_builtin("dist.ddp") is ddp
    assert component_cache.resolve_builtin("utils.echo") is echo
    assert materialize("dist.ddp", argv) == materialize(ddp, argv)
    assert materialize("utils.echo", {"msg": "hi"}).roles[0].args == ["hi"]
    assert "torchstep builtins" in (_spec_error("dist.nope").fix or "")
    assert "torchstep builtins" in (_spec_error("nosuchmodule.fn").fix or "")
    # a helper of a builtin module that fails TorchX's linter is no builtin, as in TorchX
    assert "dist.get_role_name" not in finder.get_components()
    e = _spec_error("dist.get_role_name")
    assert "has validation errors" in str(e)
    assert str(e) == str(_spec_error("dist.get_role_name"))


def test_no_entry_point_is_scanned_for_a_file_reference_or_a_function(
    comp: tuple[Path, Path], scans: dict[str, int]
) -> None:
    from torchx.components.dist import ddp

    for _ in range(3):
        materialize("comps.py:first", {"msg": "a"})
        materialize(f"{comp[0]}:second")
        materialize(ddp, ["-j", "1x2", "--script", "t.py"])
        materialize_and_plan(ddp, {"j": "1x2", "script": "t.py"}, "local")
        materialize_and_plan("comps.py:first", ["--msg", "b"], "kubernetes")
    assert scans == {"entry_points": 0, "finder": 0}
    finder.get_component("comps.py:first")  # what materialize called before: the counter sees it
    assert scans["entry_points"] >= 2


def test_a_builtin_by_name_lints_one_function_not_every_builtin(scans: dict[str, int]) -> None:
    for _ in range(3):
        materialize("dist.ddp", ["-j", "1x2", "--script", "t.py"])
    assert scans == {"entry_points": 0, "finder": 0}


def test_torchx_component_plugins_keep_torchx_finder_in_charge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert component_cache.custom_components_registered() is False
    # the plain scan agrees with importlib.metadata (and covers the finder TorchX's backport adds)
    assert component_cache._scan_directories(tuple(sys.path)) is False
    assert component_cache._scan_distributions() is False
    site = tmp_path / "site"
    info = site / "acme_components-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-components\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torchx.components]\nacme = acme_components\n")
    monkeypatch.syspath_prepend(str(site))
    assert component_cache.custom_components_registered() is True
    assert component_cache._scan_directories(tuple(sys.path)) is True
    assert component_cache._scan_distributions() is True
    asked: list[str] = []

    def get_component(name: str) -> Any:
        asked.append(name)
        return finder._Component(name, "", "ddp", lambda: None, [])  # type: ignore[arg-type]

    monkeypatch.setattr(finder, "get_component", get_component)
    assert component_cache.resolve_builtin("acme.train") is not None and asked == ["acme.train"]
    monkeypatch.undo()
    assert str(site) not in sys.path and component_cache.custom_components_registered() is False


def test_concurrent_resolution_executes_the_file_once(comp: tuple[Path, Path]) -> None:
    _, counter = comp
    results: list[Any] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for i in range(20):
                results.append(materialize_and_plan("comps.py:first", {"msg": str(i % 3)}, "local")[0])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 80
    assert len({id(a) for a in results}) == 80  # each call its own AppDef
    assert counter.read_text() == "x"


def test_the_caches_are_bounded() -> None:
    lru: component_cache.LRU[int, str] = component_cache.LRU(2)
    lru.put(1, "a")
    lru.put(2, "b")
    assert lru.get(1) == "a"  # 1 is now the most recent
    lru.put(3, "c")
    assert (lru.get(1), lru.get(2), lru.get(3), len(lru)) == ("a", None, "c", 2)


def test_string_annotations_keep_one_wrapper_per_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "late.py").write_text(
        textwrap.dedent(
            '''
            from __future__ import annotations
            import torchx.specs as specs

            def app(n: int = 1) -> specs.AppDef:
                """App.

                Args:
                    n: a number
                """
                return specs.AppDef("late", [specs.Role("r", image="i", entrypoint="e", args=[str(n + 1)])])
            '''
        )
    )
    from torchstep.components.builders import _with_evaluated_annotations, component_of

    fn, _ = component_of("late.py:app")
    assert _with_evaluated_annotations(fn) is _with_evaluated_annotations(fn) is not fn
    assert materialize("late.py:app", ["--n", "2"]).roles[0].args == ["3"]
