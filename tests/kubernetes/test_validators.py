"""The checks the other tests rely on do reject what Kubernetes rejects, and the cached
schema validator agrees with ``kubernetes_validate.validate`` itself."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
import torchstep
from torchstep.kubernetes import render
from torchx import specs

from .conftest import VERSIONS, check_object, schema_errors


@pytest.fixture(scope="module")
def objs(role):
    app = specs.AppDef("a", [role(num_replicas=2, max_retries=1, retry_policy=specs.RetryPolicy.REPLICA)])
    return {o["kind"]: o for o in render(app)}


def mutate(obj, path, value):
    obj = copy.deepcopy(obj)
    *parents, last = path
    target = obj
    for key in parents:
        target = target[key]
    target[last] = value
    return obj


TEMPLATE = ["spec", "template", "spec"]
CONTAINER = [*TEMPLATE, "containers", 0]
RULES = ["spec", "podFailurePolicy", "rules"]


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("Job", ["spec", "bogusField"], 1),  # strict schema: unknown field
        ("Job", [*CONTAINER, "imagePullPolicy"], ["Always"]),  # schema: wrong type
        ("Job", [*TEMPLATE, "restartPolicy"], "OnFailure"),  # podFailurePolicy needs Never
        ("Job", [*RULES, 0, "onExitCodes", "values"], [0, 82]),  # In with 0
        ("Job", [*RULES, 2, "onExitCodes", "values"], [143, 83]),  # unordered
        ("Job", [*RULES, 0, "onExitCodes", "containerName"], "nope"),  # unknown container
        ("Job", ["spec", "podReplacementPolicy"], "TerminatingOrFailed"),
        ("Job", ["metadata", "name"], "x" * 62),  # pod hostname <name>-1 too long
        ("Job", [*CONTAINER, "env", 1, "value"], "$(NOT_DEFINED)"),  # stray reference
        ("Job", [*CONTAINER, "volumeMounts", 0, "name"], "missing"),
        ("Job", [*CONTAINER, "resources"], {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}),
        ("Job", ["metadata", "labels", "team"], "a b"),
        ("Service", ["metadata", "name"], "1abc"),  # Service names start with a letter
        ("Service", ["spec", "ports", 0, "name"], "Not_Valid"),
    ],
)
def test_checks_reject_invalid_objects(objs, kind, path, value):
    with pytest.raises(AssertionError):
        check_object(mutate(objs[kind], path, value))


def test_cached_schema_validator_agrees_with_kubernetes_validate(objs):
    bad = mutate(objs["Job"], [*CONTAINER, "unknownField"], True)
    for version in VERSIONS:
        for obj in objs.values():
            assert schema_errors(obj, version) == []
            kubernetes_validate.validate(obj, version, strict=True)
        assert schema_errors(bad, version)
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, version, strict=True)


def test_minimum_version_is_supported_by_the_validator():
    assert torchstep.kubernetes.MIN_KUBERNETES_VERSION in {
        v.rsplit(".", 1)[0] for v in kubernetes_validate.utils.all_versions()
    }
