"""``torchstep.materialize``: the four ways to name a component, arguments parsed exactly
as ``torchx run`` parses them, and every failure a SpecError (never SystemExit)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import torchstep
from torchx.specs import AppDef, Role
from torchx.specs.builders import materialize_appdef
from torchx.specs.finder import get_component

COMPONENT = '''
from typing import Dict, List, Optional

import torchx.specs as specs


def trainer(
    *script_args: str,
    lr: float = 0.1,
    epochs: int = 1,
    image: str = "ghcr.io/acme/train:1",
    tags: Optional[List[str]] = None,
    env: Optional[Dict[str, str]] = None,
    debug: bool = False,
    name: str = "train",
) -> specs.AppDef:
    """A trainer.

    Args:
        script_args: extra script arguments
        lr: learning rate
        epochs: epochs
        image: image
        tags: tags
        env: environment
        debug: debug
        name: app name
    """
    args = ["--lr", str(lr), "--epochs", str(epochs), "--debug", str(debug), *script_args]
    if tags:
        args += ["--tags", ":".join(tags)]
    return specs.AppDef(name, [specs.Role("trainer", image=image, entrypoint="python", args=args, env=env or {})])


def broken(n: int = 1) -> specs.AppDef:
    """Raises.

    Args:
        n: a number
    """
    raise ValueError("n must be even")


def not_an_app() -> str:
    """Returns a string."""
    return "nope"


def new_style(tags: list[str] | None = None) -> specs.AppDef:
    """TorchX 0.7 cannot read this annotation.

    Args:
        tags: tags
    """
    return specs.AppDef("x", [])
'''


@pytest.fixture
def comp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "comps.py").write_text(COMPONENT)
    pkg = tmp_path / "ts_test_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(COMPONENT)
    (pkg / "explodes.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "syntax.py").write_text("def f(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def args_of(app: AppDef) -> list[str]:
    return list(app.roles[0].args)


# ---- the four reference forms -----------------------------------------------------------------
def test_file_reference_relative_and_absolute(comp_dir: Path) -> None:
    rel = torchstep.materialize("comps.py:trainer", ["--lr", "0.5"])
    absolute = torchstep.materialize(f"{comp_dir}/comps.py:trainer", ["--lr", "0.5"])
    assert args_of(rel) == args_of(absolute) == ["--lr", "0.5", "--epochs", "1", "--debug", "False"]


def test_module_reference(comp_dir: Path) -> None:
    app = torchstep.materialize("ts_test_pkg.train:trainer", ["--epochs", "3", "--", "--seed", "7"])
    assert args_of(app) == ["--lr", "0.1", "--epochs", "3", "--debug", "False", "--seed", "7"]


def test_builtin_reference_parses_like_torchx_run() -> None:
    argv = ["-j", "2x2", "--script", "train.py", "--", "--lr", "0.1"]
    ours = torchstep.materialize("dist.ddp", argv)
    theirs = materialize_appdef(get_component("dist.ddp").fn, argv)
    assert ours == theirs
    assert ours.roles[0].num_replicas == 2 and ours.roles[0].args[1].endswith("train.py --lr 0.1")


def test_callable_with_kwargs_args_and_mapping(comp_dir: Path) -> None:
    from ts_test_pkg.train import trainer

    by_kwargs = torchstep.materialize(trainer, lr=0.25, tags=["a", "b"], debug=True)
    by_argv = torchstep.materialize(trainer, ["--lr", "0.25", "--tags", "a,b", "--debug", "True"])
    by_map = torchstep.materialize(trainer, {"lr": 0.25, "tags": ["a", "b"], "debug": True, "name": None})
    assert args_of(by_kwargs) == args_of(by_argv) == args_of(by_map)
    assert args_of(by_map)[-2:] == ["--tags", "a:b"]


def test_mapping_args_use_torchx_encodings(comp_dir: Path) -> None:
    app = torchstep.materialize(
        "comps.py:trainer", {"env": {"A": "1", "B": "2"}, "script_args": ["--weird", "-x"], "epochs": 2}
    )
    assert app.roles[0].env == {"A": "1", "B": "2"}
    assert args_of(app)[-2:] == ["--weird", "-x"]  # after "--": values, not flags
    ddp = torchstep.materialize("dist.ddp", {"j": "2x1", "script": "t.py", "mounts": ["type=bind", "src=/a", "dst=/b"]})
    assert ddp.roles[0].mounts[0].dst_path == "/b"


def test_appdef_passes_through() -> None:
    app = AppDef("a", [Role("r", image="i", entrypoint="e")])
    assert torchstep.materialize(app) is app


# ---- failures: always a SpecError that says what to do ------------------------------------------
def spec_error(component: Any, args: Any = None, **kwargs: Any) -> torchstep.SpecError:
    with pytest.raises(torchstep.SpecError) as err:
        torchstep.materialize(component, args, **kwargs)
    e = err.value
    assert isinstance(e, ValueError) and e.field.startswith("component") and e.fix
    return e


@pytest.mark.parametrize(
    ("argv", "detail"),
    [
        (["--script", "t.py", "--nope"], "unrecognized arguments: --nope"),
        (["--script", "t.py", "--max_retries", "many"], "invalid int value: 'many'"),
        (["-j", "2x2"], "exactly one of --script and -m"),  # the component's own check
        (["--help"], "--help is not a component argument"),
    ],
)
def test_bad_arguments_never_exit(argv: list[str], detail: str) -> None:
    e = spec_error("dist.ddp", argv)
    assert detail in str(e)


def test_missing_required_argument(comp_dir: Path) -> None:
    e = spec_error("utils.copy", ["--src", "/a"])
    assert "required: --dst" in str(e) and "torchx run utils.copy --help" in (e.fix or "")


def test_missing_file_and_bad_module(comp_dir: Path) -> None:
    assert "does not exist" in str(spec_error("nope/missing.py:fn"))
    assert "cannot import module" in str(spec_error("no_such_pkg.mod:fn"))
    assert "has no function 'nope'" in str(spec_error("ts_test_pkg.train:nope"))
    assert "RuntimeError: boom at import" in str(spec_error("ts_test_pkg.explodes:fn"))
    assert "syntax.py" in str(spec_error("syntax.py:f"))
    assert "torchx builtins" in (spec_error("dist.nope").fix or "")


def test_component_failures(comp_dir: Path) -> None:
    assert "ValueError: n must be even" in str(spec_error("comps.py:broken"))
    assert "ValueError: n must be even" in str(spec_error("comps.py:broken", n=2))
    assert "returns specs.AppDef" in (spec_error("comps.py:not_an_app").fix or "")
    assert "typing.Optional" in (spec_error("comps.py:new_style").fix or "")
    assert "not a torchx AppDef" in str(spec_error(lambda: "nope"))


def test_misuse(comp_dir: Path) -> None:
    app = AppDef("a", [Role("r", image="i", entrypoint="e")])
    assert "pass the component function" in (spec_error(app, ["--x"]).fix or "")
    assert "never one shell string" in (spec_error("comps.py:trainer", "--lr 0.1").fix or "")
    assert spec_error("comps.py:trainer", ["--lr", 0.1]).field == "component.args[1]"
    assert spec_error("comps.py:trainer", {"lr": 1, "nope": 2}).field == "component.nope"
    assert spec_error("comps.py:trainer", lr=1.0, nope=2).field == "component.nope"
    assert "either args or keyword arguments" in str(spec_error("comps.py:trainer", ["--lr", "1"], lr=1.0))
    assert "reference string" in str(spec_error(42))
    assert "reference string" in str(spec_error("  "))


def test_materialize_then_plan_round_trip(comp_dir: Path) -> None:
    source = textwrap.dedent(
        '''
        import torchx.specs as specs

        def app(msg: str = "hi") -> specs.AppDef:
            """Echo.

            Args:
                msg: message
            """
            return specs.AppDef("echo", [specs.Role("echo", image="alpine:3", entrypoint="echo", args=[msg])])
        '''
    )
    (comp_dir / "echo_comp.py").write_text(source)
    tricky = 'it\'s "quoted" $HOME ${app_id} {{ params.x }}\nline2'
    plan = torchstep.build_plan(torchstep.materialize("echo_comp.py:app", ["--msg", tricky]), "kubernetes")
    assert plan.roles[0].args == (tricky,)
