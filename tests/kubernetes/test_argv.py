"""What a container process really receives (after Kubernetes' ``$(VAR)`` expansion) is the
role's argv and env bound exactly as TorchX binds macros — byte for byte, for every replica."""

from __future__ import annotations

import hypothesis.strategies as st
import torchstep
from hypothesis import HealthCheck, given, settings
from torchstep.kubernetes import render_plan
from torchstep.plan.agent_command import macro_values
from torchx import specs

FRAGMENTS = [
    "${app_id}",
    "${replica_id}",
    "$replica_id",
    "${rank0_env}",
    "$${app_id}",
    "$$",
    "$",
    "$(HOME)",
    "$(TORCHSTEP_REPLICA_ID)",
    "$(TORCHSTEP_APP_ID)",
    "${img_root}",
    "(",
    ")",
    "'",
    '"',
    "\\",
    " ",
    "\n",
]
TEXT = st.lists(st.sampled_from(FRAGMENTS) | st.text("ab$(){}_ ", max_size=4), max_size=8).map("".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arg=TEXT, value=TEXT, replicas=st.sampled_from([1, 3]))
def test_container_receives_torchx_binding(role, view, arg, value, replicas):
    r = role(args=["-c", arg, arg], env={"X": value, "Y": "${replica_id}"}, num_replicas=replicas)
    rendered = render_plan(torchstep.build_plan(specs.AppDef("a", [r]), "kubernetes"), run_id="r")
    rr = rendered.roles[0]
    container = (rr.workload["spec"]["template"]["spec"] if rr.kind == "Job" else rr.workload["spec"])["containers"][0]
    for replica in range(replicas):
        argv, env = view(container, replica_id=str(replica))
        want_argv, want_env = rr.role.bind(macro_values(rendered.app_id, replica))
        assert argv[-len(want_argv) :] == want_argv
        assert argv[argv.index("--no-python") + 1 :] == want_argv
        assert (env["X"], env["Y"]) == (want_env["X"], want_env["Y"])
        assert env["TORCHSTEP_REPLICA_ID"] == str(replica)


def test_ddp_bash_script_reaches_bash_unchanged(view):
    app = torchstep.materialize("dist.ddp", ["-j", "2x1", "--script", "train.py", "--", "--tag", "$USER-${app_id}"])
    rendered = render_plan(torchstep.build_plan(app, "kubernetes"), run_id="r")
    rr = rendered.roles[0]
    argv, env = view(rr.workload["spec"]["template"]["spec"]["containers"][0], replica_id="1")
    assert argv[:5] == ["python", "-m", "torchstep.launch", "bash", "-c"]
    assert argv[5] == rr.role.bind(macro_values(rendered.app_id, 1))[0][2]
    assert "--rdzv_endpoint ${TORCHX_RANK0_HOST:=localhost}:29500" in argv[5]
    assert env["TORCHX_RANK0_HOST"] == rr.rank0_host


def test_names_are_stable_per_run_id(role):
    plan = torchstep.build_plan(specs.AppDef("a", [role(num_replicas=2)]), "kubernetes")
    assert render_plan(plan, run_id="x").objects == render_plan(plan, run_id="x").objects
    names = {render_plan(plan, run_id=rid).app_id for rid in ("x", "y", None, None)}
    assert len(names) == 4
