"""Checks for rendered Kubernetes objects, with no cluster:

- ``kubernetes-validate`` in strict mode (the official OpenAPI schemas; unknown fields are
  errors) for the oldest supported release and the newest one the package knows;
- the API server's semantic rules the schema cannot express (name syntax, Job
  podFailurePolicy / backoffLimitPerIndex / successPolicy rules, volume and port references),
  transcribed from kubernetes/pkg/apis/{core,batch}/validation;
- Kubernetes' ``$(VAR)`` expansion of command, args and env (third_party/forked/golang/expansion),
  to show what a container really receives.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils as kv_utils
import pytest
from jsonschema.validators import Draft202012Validator
from kubeexpand import expand
from packaging.version import Version
from referencing import Registry, Resource
from torchstep.kubernetes import MIN_KUBERNETES_VERSION
from torchx import specs

# the oldest release we render for and the newest schema the installed package has
VERSIONS = (MIN_KUBERNETES_VERSION, kubernetes_validate.utils.latest_version())

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_ENV = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_PORT_NAME = re.compile(r"^(?=.*[a-z])(?!.*--)[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?$")
_INDEXES = re.compile(r"^(\d+(-\d+)?)(,\d+(-\d+)?)*$")
_DOWNWARD = re.compile(r"^metadata\.(name|namespace|uid|labels\['[^']+'\]|annotations\['[^']+'\])$|^spec\.|^status\.")
_QUANTITY = re.compile(r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
_FACTORS = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def is_label(s: str, n: int = 63) -> bool:
    return len(s) <= n and bool(_LABEL.match(s))


def is_qualified(key: str) -> bool:
    prefix, sep, name = key.rpartition("/")
    ok_prefix = not sep or (len(prefix) <= 253 and bool(_SUBDOMAIN.match(prefix)))
    return ok_prefix and 0 < len(name) <= 63 and bool(_NAME_PART.match(name))


def quantity(q: Any) -> float:
    m = _QUANTITY.match(str(q))
    assert m, f"bad quantity {q!r}"
    return float(m.group(1)) * _FACTORS[m.group(3) or ""]


# -- strict schema validation ---------------------------------------------------------------
@functools.cache
def schema_validator(version: str, kind: str, api_version: str) -> Draft202012Validator:
    """The validator ``kubernetes_validate.validate(obj, version, strict=True)`` builds, built
    once per (version, kind): the package re-reads its 1.4 MB definitions on every call."""
    wanted = Version(kv_utils.major_minor(version))
    full = [v for v in kv_utils.all_versions() if Version(kv_utils.major_minor(v)) <= wanted][-1]
    folder = f"kubernetes-json-schema/v{full}-local-strict"
    api = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = kv_utils.schema_contents(f"{folder}/{kind.lower()}-{api}.json", version)
    defs = kv_utils.schema_contents(f"{folder}/_definitions.json", version)
    registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
    return Draft202012Validator(schema, registry=registry)


def schema_errors(obj: Mapping[str, Any], version: str) -> list[str]:
    v = schema_validator(version, obj["kind"], obj["apiVersion"])
    return [f"{e.message} at {list(e.absolute_path)}" for e in v.iter_errors(dict(obj))]


# -- Kubernetes $(VAR) expansion: tests/kubeexpand.py -------------------------------------
def unresolved_refs(text: str, env: Mapping[str, str]) -> list[str]:
    """``$(NAME)`` references Kubernetes would leave in place (undefined variables)."""
    refs, i = [], 0
    while i < len(text) - 1:
        if text[i] == "$" and text[i + 1] == "$":
            i += 2
        elif text[i] == "$" and text[i + 1] == "(" and ")" in text[i + 2 :]:
            end = text.index(")", i + 2)
            if text[i + 2 : end] not in env:
                refs.append(text[i + 2 : end])
            i = end + 1
        else:
            i += 1
    return refs


def container_view(container: Mapping[str, Any], *, replica_id: str, pod_annotations: Mapping[str, str] | None = None):
    """(argv, env) the container process receives, given the pod's replica index."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = expand(item["value"], env)
        elif "fieldRef" in item.get("valueFrom", {}):
            assert "job-completion-index" in item["valueFrom"]["fieldRef"]["fieldPath"]
            env[item["name"]] = replica_id
        else:
            env[item["name"]] = "<secret>"
    argv = [expand(a, env) for a in [*container.get("command", []), *container.get("args", [])]]
    return argv, env


# -- the API server's semantic rules (subset) ------------------------------------------------
def check_metadata(meta: Mapping[str, Any], kind: str, where: str) -> None:
    name = meta["name"]
    if kind == "Service":
        assert len(name) <= 63 and _DNS1035.match(name), f"{where}: Service name {name!r}"
    else:
        assert len(name) <= 253 and _SUBDOMAIN.match(name), f"{where}: name {name!r}"
    assert is_label(meta["namespace"]), where
    check_labels(meta, where)


def check_labels(meta: Mapping[str, Any], where: str) -> None:
    for k, v in meta.get("labels", {}).items():
        assert is_qualified(k) and isinstance(v, str) and (v == "" or (len(v) <= 63 and _NAME_PART.match(v))), (
            f"{where}: label {k}={v!r}"
        )
    for k, v in meta.get("annotations", {}).items():
        assert is_qualified(k) and isinstance(v, str), f"{where}: annotation {k}"


def check_pod_spec(spec: Mapping[str, Any], where: str) -> None:
    containers = [*spec.get("initContainers", []), *spec["containers"]]
    cnames = [c["name"] for c in containers]
    assert len(cnames) == len(set(cnames)) and all(is_label(n) for n in cnames), f"{where}: container names"
    vnames = [v["name"] for v in spec.get("volumes", [])]
    assert len(vnames) == len(set(vnames)) and all(is_label(n) for n in vnames), f"{where}: volume names"
    for key, value in spec.get("nodeSelector", {}).items():
        assert is_qualified(key) and _NAME_PART.match(value) and len(value) <= 63, f"{where}: nodeSelector {key}"
    if "subdomain" in spec:
        assert is_label(spec["subdomain"]), where
    for c in containers:
        cw = f"{where}.containers[{c['name']}]"
        paths = [m["mountPath"] for m in c.get("volumeMounts", [])]
        assert len(paths) == len(set(paths)), f"{cw}: duplicate mountPath"
        for m in c.get("volumeMounts", []):
            assert m["name"] in vnames, f"{cw}: volumeMount {m['name']} has no volume"
        env_names: list[str] = []
        for item in c.get("env", []):
            assert _ENV.match(item["name"]), f"{cw}: env name {item['name']!r}"
            assert item["name"] not in env_names, f"{cw}: duplicate env {item['name']}"
            if "value" in item:
                assert not unresolved_refs(item["value"], dict.fromkeys(env_names)), f"{cw}: env {item['name']}"
            else:
                ref = item["valueFrom"].get("fieldRef")
                assert ref is None or _DOWNWARD.match(ref["fieldPath"]), f"{cw}: fieldRef {ref}"
            env_names.append(item["name"])
        for text in [*c.get("command", []), *c.get("args", [])]:
            assert not unresolved_refs(text, dict.fromkeys(env_names)), f"{cw}: stray $(...) in {text!r}"
        ports = c.get("ports", [])
        pnames = [p["name"] for p in ports if "name" in p]
        assert len(pnames) == len(set(pnames)) and all(_PORT_NAME.match(n) for n in pnames), f"{cw}: port names"
        nums = [(p["containerPort"], p.get("protocol", "TCP")) for p in ports]
        assert len(nums) == len(set(nums)) and all(1 <= n <= 65535 for n, _ in nums), f"{cw}: ports"
        req, lim = c.get("resources", {}).get("requests", {}), c.get("resources", {}).get("limits", {})
        for k, v in req.items():
            if k in lim:
                assert quantity(v) <= quantity(lim[k]), f"{cw}: request {k} above limit"
            if "/" in k and not k.startswith("kubernetes.io/"):  # extended resources: requests == limits
                assert k in lim and quantity(v) == quantity(lim[k]), f"{cw}: extended resource {k}"
        if c.get("securityContext", {}).get("privileged"):
            assert any("hostPath" in v for v in spec["volumes"]), f"{cw}: privileged without a device"


def check_job(job: Mapping[str, Any], where: str) -> None:
    spec = job["spec"]
    assert "selector" not in spec and "manualSelector" not in spec, f"{where}: selector is generated"
    indexed = spec.get("completionMode") == "Indexed"
    completions = spec.get("completions")
    if indexed:
        assert completions is not None and spec.get("parallelism", 1) <= 100_000, where
        assert is_label(f"{job['metadata']['name']}-{completions - 1}"), f"{where}: pod hostname too long"
    else:
        assert "backoffLimitPerIndex" not in spec and "maxFailedIndexes" not in spec, where
    if "maxFailedIndexes" in spec:
        assert "backoffLimitPerIndex" in spec and 0 <= spec["maxFailedIndexes"] <= completions, where
    for key in ("backoffLimit", "backoffLimitPerIndex", "activeDeadlineSeconds", "ttlSecondsAfterFinished"):
        assert spec.get(key, 0) >= 0, f"{where}: {key}"
    tspec = spec["template"]["spec"]
    assert tspec["restartPolicy"] in ("Never", "OnFailure"), where
    pfp = spec.get("podFailurePolicy")
    if pfp is not None:
        assert tspec["restartPolicy"] == "Never", f"{where}: podFailurePolicy needs restartPolicy Never"
        assert spec.get("podReplacementPolicy", "Failed") == "Failed", where
        names = {c["name"] for c in [*tspec["containers"], *tspec.get("initContainers", [])]}
        assert 0 < len(pfp["rules"]) <= 20, where
        for i, rule in enumerate(pfp["rules"]):
            rw = f"{where}.podFailurePolicy.rules[{i}]"
            assert rule["action"] in ("Count", "FailIndex", "FailJob", "Ignore"), rw
            if rule["action"] == "FailIndex":
                assert "backoffLimitPerIndex" in spec, rw
            assert ("onExitCodes" in rule) != bool(rule.get("onPodConditions")), rw
            if "onExitCodes" in rule:
                ec = rule["onExitCodes"]
                assert ec["operator"] in ("In", "NotIn") and ec.get("containerName", next(iter(names))) in names, rw
                vals = ec["values"]
                assert 0 < len(vals) <= 255 and vals == sorted(set(vals)), rw
                assert ec["operator"] == "NotIn" or 0 not in vals, rw
            for cond in rule.get("onPodConditions", []):
                assert is_qualified(cond["type"]) and cond["status"] in ("True", "False", "Unknown"), rw
    if "podReplacementPolicy" in spec:
        assert spec["podReplacementPolicy"] in ("Failed", "TerminatingOrFailed"), where
    sp = spec.get("successPolicy")
    if sp is not None:
        assert indexed and 0 < len(sp["rules"]) <= 20, where
        for rule in sp["rules"]:
            idx = rule.get("succeededIndexes")
            assert idx is not None or "succeededCount" in rule, where
            if idx is not None:
                assert _INDEXES.match(idx) and all(int(n) < completions for n in re.findall(r"\d+", idx)), where


def check_service(svc: Mapping[str, Any], where: str) -> None:
    spec = svc["spec"]
    ports = spec["ports"]
    assert ports or spec.get("clusterIP") == "None", where
    names = [p.get("name") for p in ports]
    assert len(ports) <= 1 or all(names), f"{where}: ports need names"
    assert all(n is None or is_label(n) for n in names), f"{where}: port names are DNS labels"
    assert len(set(names)) == len(names) and len({p["port"] for p in ports}) == len(ports), where
    for key, value in spec.get("selector", {}).items():
        assert is_qualified(key) and _NAME_PART.match(value), where


def check_network_policy(policy: Mapping[str, Any], where: str) -> None:
    """Ingress only (egress untouched), its pods are the object's own, and the rule without a
    port list admits only pods of the same run: nothing else reaches the stores."""
    from torchstep.kubernetes import LABEL_APP_ID

    spec = policy["spec"]
    labels = policy["metadata"]["labels"]
    assert spec["policyTypes"] == ["Ingress"], where
    selected = spec["podSelector"]["matchLabels"]
    assert selected and all(labels.get(k) == v for k, v in selected.items()), where
    for rule in spec["ingress"]:
        if "from" in rule:
            assert rule["from"] == [{"podSelector": {"matchLabels": {LABEL_APP_ID: labels[LABEL_APP_ID]}}}], where
        else:
            assert rule["ports"], f"{where}: a rule without peers nor ports admits everyone"


def check_object(obj: Mapping[str, Any]) -> None:
    """Strict schema validation for every version, then the semantic rules."""
    kind = obj["kind"]
    where = f"{kind}/{obj['metadata']['name']}"
    for version in VERSIONS:
        errors = schema_errors(obj, version)
        assert not errors, f"{where} (Kubernetes {version}): {errors}"
    check_metadata(obj["metadata"], kind, where)
    if kind == "Pod":
        check_pod_spec(obj["spec"], where)
    elif kind == "Job":
        check_labels(obj["spec"]["template"]["metadata"], where)
        check_pod_spec(obj["spec"]["template"]["spec"], where)
        check_job(obj, where)
    elif kind == "Service":
        check_service(obj, where)
    elif kind == "NetworkPolicy":
        check_network_policy(obj, where)
    else:
        raise AssertionError(f"unexpected kind {kind}")


def check_run(rendered: Any) -> list[dict[str, Any]]:
    """Every object valid, plus the invariants that tie a run's objects together."""
    from torchstep.kubernetes import LABEL_APP_ID

    objs = rendered.objects
    keys = [(o["kind"], o["metadata"]["name"]) for o in objs]
    assert len(keys) == len(set(keys)), keys
    for o in objs:
        check_object(o)
        assert o["metadata"]["namespace"] == rendered.namespace
        assert o["metadata"]["labels"][LABEL_APP_ID] == rendered.app_id
    for r in rendered.roles:
        pod_labels = r.template["metadata"]["labels"]
        assert all(pod_labels.get(k) == v for k, v in r.selector.items())
        if r.service is not None:
            assert r.service["spec"]["selector"] == dict(r.selector)
        if r.role.num_replicas > 1:
            assert r.template["spec"]["subdomain"] == r.service["metadata"]["name"] == r.name
            assert r.rank0_host.startswith(f"{r.name}-0.{r.name}.{rendered.namespace}.svc.")
        if r.kind == "Pod":
            assert r.workload == r.pod
        if r.role.num_replicas > 1:  # its stores answer only the run's pods; declared ports stay open
            policy = r.network_policy["spec"]
            assert policy["podSelector"]["matchLabels"] == dict(r.selector)
            opened = {p["port"] for rule in policy["ingress"] for p in rule.get("ports", [])}
            declared = {p["containerPort"] for p in r.template["spec"]["containers"][0].get("ports", [])}
            rdzv = int(r.rdzv_endpoint.rpartition(":")[2])
            assert opened == declared - {rdzv}, (opened, declared, rdzv)
        else:
            assert r.network_policy is None
    return objs


@pytest.fixture(scope="session")
def check() -> Callable[[Any], list[dict[str, Any]]]:
    return check_run


# -- AppDef builders -------------------------------------------------------------------------
IMAGE = "ghcr.io/acme/train:1.0"


def make_role(**kw: Any) -> specs.Role:
    kw.setdefault("name", "trainer")
    kw.setdefault("image", IMAGE)
    kw.setdefault("entrypoint", "python")
    kw.setdefault("args", ["-m", "acme.train", "--epochs", "3"])
    kw.setdefault("resource", specs.Resource(cpu=4, gpu=0, memMB=8192))
    return specs.Role(**kw)


@pytest.fixture(scope="session")
def role() -> Callable[..., specs.Role]:
    return make_role


@pytest.fixture
def app() -> Callable[..., specs.AppDef]:
    def build(*roles: specs.Role, name: str = "train", metadata: dict[str, str] | None = None) -> specs.AppDef:
        return specs.AppDef(name=name, roles=list(roles) or [make_role()], metadata=metadata or {})

    return build


@pytest.fixture
def view() -> Callable[..., Any]:
    return container_view
