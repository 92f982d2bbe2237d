"""``torchstep.materialize``: the four ways to name a component, arguments parsed exactly
as ``torchx run`` parses them, and every failure a SpecError (never SystemExit)."""

from __future__ import annotations

import re
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
        (["--script", "t.py", "--nope"], "has no parameter 'nope'; fix: use one of: script_args, script, m,"),
        (["--script", "t.py", "--max_retries", "many"], "invalid int value: 'many'"),
        (["-j", "2x2"], "exactly one of --script and -m"),  # the component's own check
        (["--help"], "--help is not a component argument"),
    ],
)
def test_bad_arguments_never_exit(argv: list[str], detail: str) -> None:
    e = spec_error("dist.ddp", argv)
    assert detail in str(e)


# ---- typos in argument names: never abbreviated, always the list of parameters --------------------
def _from_module(comp_dir: Path) -> Any:
    from ts_test_pkg.train import trainer

    return trainer


@pytest.mark.parametrize("ref", ["comps.py:trainer", "ts_test_pkg.train:trainer", "callable"])
@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["--epoch", "3"], "epoch"),  # a prefix of --epochs: TorchX's argparse took it as --epochs
        (["--e", "3"], "e"),
        (["--epochs=2", "--l=0.5"], "l"),
        (["--epcohs", "5"], "epcohs"),
        (["--lr", "-0.5", "--debgu", "True"], "debgu"),
    ],
)
def test_a_misspelt_or_shortened_name_is_an_error_that_lists_the_parameters(
    comp_dir: Path, ref: str, argv: list[str], name: str
) -> None:
    component = _from_module(comp_dir) if ref == "callable" else ref
    e = spec_error(component, argv)
    assert isinstance(e, torchstep.components.builders.UnknownParameterError)
    assert e.field == f"component.{name}"
    assert f"has no parameter '{name}'; fix: use one of: script_args, lr, epochs, image, tags, env, debug, name" in str(
        e
    )


def test_a_builtin_takes_whole_names_only() -> None:
    # TorchX's own parser reads --nam as --name: here a name is given whole or not at all
    e = spec_error("dist.ddp", ["--script", "t.py", "--nam", "x"])
    assert e.field == "component.nam" and "(did you mean 'name'?)" in str(e)
    e = spec_error("utils.echo", ["--num_replica", "2"])
    assert "has no parameter 'num_replica'; fix: use one of: msg, image, num_replicas" in str(e)
    assert "did you mean 'num_replicas'?" in str(e)
    # whole names, "=" and short options still parse as torchx run parses them
    app = torchstep.materialize("dist.ddp", ["-j2x1", "--script=t.py", "--name", "x"])
    assert app.roles[0].num_replicas == 2 and app.name == "x"


def test_the_same_words_on_every_path(comp_dir: Path) -> None:
    words = "has no parameter 'stpes'; fix: use one of: script_args, lr, epochs"
    assert words in str(spec_error("comps.py:trainer", ["--stpes", "5"]))
    assert words in str(spec_error("comps.py:trainer", {"stpes": 5}))
    assert words in str(spec_error("comps.py:trainer", stpes=5))
    with pytest.raises(torchstep.SpecError, match=re.escape(words)):
        torchstep.components.builders.static_values(
            "comps.py:trainer", {"stpes": 5}, target="kfp", builder="component_from_fn"
        )


def test_torchx_own_parser_is_left_as_it_is(comp_dir: Path) -> None:
    """``torchx run`` in a process that also uses torchstep keeps TorchX's behaviour."""
    torchstep.materialize("comps.py:trainer", ["--epochs", "2"])  # installs torchstep's parser cache
    from torchx.specs.builders import parse_args

    assert parse_args(_from_module(comp_dir), ["--epoch", "3"]).epochs == 3


def test_missing_required_argument(comp_dir: Path) -> None:
    e = spec_error("utils.copy", ["--src", "/a"])
    assert "required: --dst" in str(e) and "torchstep run utils.copy -- --help" in (e.fix or "")


def test_missing_file_and_bad_module(comp_dir: Path) -> None:
    assert "does not exist" in str(spec_error("nope/missing.py:fn"))
    assert "cannot import module" in str(spec_error("no_such_pkg.mod:fn"))
    assert "has no function 'nope'" in str(spec_error("ts_test_pkg.train:nope"))
    assert "RuntimeError: boom at import" in str(spec_error("ts_test_pkg.explodes:fn"))
    assert "syntax.py" in str(spec_error("syntax.py:f"))
    assert "torchstep builtins" in (spec_error("dist.nope").fix or "")


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
