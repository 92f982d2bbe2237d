"""Core seams the KFP and Prefect adapters share: a component's typed parameters
(``parameters_of``) and an AppDef as JSON data and back (``torchstep.components.appjson``)."""

import inspect
from typing import Dict, List, Optional, Union  # noqa: UP035 - the annotations components use

import pytest
import torchstep
from torchstep.components.appjson import app_from_dict, app_to_dict
from torchstep.components.builders import parameters_of
from torchx import specs


def typed(
    lr: float,
    name: str = "run",
    tags: Optional[List[str]] = None,  # noqa: UP006, UP045
    env: Dict[str, str] = {},  # noqa: B006, UP006
    debug: bool = False,
    *script_args: str,
) -> specs.AppDef:
    """A component.

    Args:
        lr: learning rate
        name: the name
        tags: tags
        env: env vars
        debug: debug mode
        script_args: the script's arguments
    """
    return specs.AppDef("a", roles=[])


def test_parameters_are_typed_with_defaults_and_descriptions() -> None:
    params = {p.name: p for p in parameters_of(typed)}
    assert [(p.name, p.type, p.optional, p.variadic) for p in params.values()] == [
        ("lr", float, False, False),
        ("name", str, False, False),
        ("tags", list, True, False),
        ("env", dict, False, False),
        ("debug", bool, False, False),
        ("script_args", list, False, True),
    ]
    assert params["lr"].required and params["lr"].default is inspect.Parameter.empty
    assert not params["script_args"].required and not params["tags"].required
    assert params["name"].default == "run" and params["tags"].description == "tags"


def test_a_parameter_type_no_orchestrator_can_carry_is_named() -> None:
    def bad(x: Union[int, str] = 1) -> specs.AppDef:  # noqa: UP007
        """Bad.

        Args:
            x: a union
        """
        return specs.AppDef("a", roles=[])

    with pytest.raises(torchstep.SpecError) as e:
        parameters_of(bad)
    assert e.value.field == "component.x"


@pytest.mark.parametrize(
    "app",
    [
        torchstep.materialize("dist.ddp", ["-j", "2x2", "--script", "t.py", "--mounts", "type=volume,src=d,dst=/d"]),
        specs.AppDef(
            "all",
            roles=[
                specs.Role(
                    "r",
                    image="img",
                    entrypoint="python",
                    args=["{{$.inputs.parameters['x']}}", "$(id)"],
                    env={"A": "1"},
                    num_replicas=3,
                    min_replicas=2,
                    max_retries=2,
                    retry_policy=specs.RetryPolicy.REPLICA,
                    port_map={"tb": 6006},
                    resource=specs.Resource(cpu=2, gpu=1, memMB=100, capabilities={"k": "v"}, devices={"d": 1}),
                    mounts=[
                        specs.BindMount("/a", "/b", read_only=True),
                        specs.VolumeMount("pvc", "/c"),
                        specs.DeviceMount("/dev/fuse", "/dev/fuse"),
                    ],
                    metadata={"torchstep": {"nproc_per_node": 2}, "kubernetes": {"nodeSelector": {"a": "b"}}},
                )
            ],
            metadata={"torchstep.timeout": "60"},
        ),
    ],
)
def test_an_appdef_survives_json_exactly(app: specs.AppDef) -> None:
    import json

    assert app_from_dict(json.loads(json.dumps(app_to_dict(app)))) == app


def test_data_that_is_not_json_is_named_not_dropped() -> None:
    app = specs.AppDef("a", roles=[specs.Role("r", image="i", entrypoint="e", metadata={"x": object()})])
    with pytest.raises(torchstep.SpecError) as e:
        app_to_dict(app)
    assert e.value.field == "roles[0].metadata"
    with pytest.raises(torchstep.SpecError, match="layout"):
        app_from_dict({"version": 99, "roles": []})


_ROLE = {"name": "w", "image": "", "entrypoint": "echo"}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"version": 1, "name": "a", "roles": []}, "app.roles"),
        ({"version": 1, "roles": [_ROLE]}, "app.name"),
        ({"version": 1, "name": "a", "roles": ["x"]}, "app.roles[0]"),
        (
            {"version": 1, "name": "a", "roles": [{**_ROLE, "entrypoint": ["sh", "-c", "id"]}]},
            "app.roles[0].entrypoint",
        ),
        ({"version": 1, "name": "a", "roles": [{**_ROLE, "args": ["ok", 3]}]}, "app.roles[0].args"),
        ({"version": 1, "name": "a", "roles": [{**_ROLE, "env": {"A": 1}}]}, "app.roles[0].env"),
        ({"version": 1, "name": "a", "roles": [{**_ROLE, "num_replicas": "2"}]}, "app.roles[0].num_replicas"),
        ({"version": 1, "name": "a", "roles": [{**_ROLE, "num_replicas": True}]}, "app.roles[0].num_replicas"),
        ({"version": 1, "name": "a", "roles": [{**_ROLE, "retry_policy": "ALWAYS"}]}, "app.roles[0].retry_policy"),
        ({"version": 1, "name": "a", "roles": [{**_ROLE, "resource": {"gpu": "all"}}]}, "app.roles[0].resource.gpu"),
        ({"version": 1, "name": "a", "roles": [{**_ROLE, "mounts": [{"kind": "HostPath"}]}]}, "app.roles[0].mounts[0]"),
        ({"version": 1, "name": "a", "roles": [{**_ROLE, "argz": []}]}, "app.roles[0].argz"),
        ({"version": 2, "name": "a", "roles": [_ROLE]}, "app"),
    ],
)
def test_appdef_json_from_the_network_is_refused_naming_the_field(data: dict, field: str) -> None:
    """A DAG run conf or flow parameter is untrusted: never a TypeError, never a silent drop."""
    from torchstep.components.appjson import app_from_dict
    from torchstep.errors import SpecError

    with pytest.raises(SpecError) as err:
        app_from_dict(data)
    assert err.value.field == field and err.value.fix


def test_scheduler_records_refuse_path_tricks_and_symlinks(tmp_path) -> None:
    import os

    from torchstep.files import UnsafePathError
    from torchstep.schedulers import records

    for bad in ("../x", "a/b", "", ".hidden", "a..b"):
        with pytest.raises(ValueError, match="not one this scheduler hands out"):
            records.save("airflow", bad, {}, root=tmp_path)
    records.save("airflow", "ok-1", {"endpoint": "http://h"}, root=tmp_path)
    path = tmp_path / "torchx" / "airflow" / "ok-1.json"
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(path.parent.stat().st_mode & 0o777) == "0o700"
    os.unlink(path)
    os.symlink("/etc/passwd", path)
    with pytest.raises(OSError):  # never read through a planted symlink
        records.load("airflow", "ok-1", root=tmp_path)
    with pytest.raises(UnsafePathError):
        records.save("airflow", "ok-1", {}, root=tmp_path)
