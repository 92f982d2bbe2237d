"""TorchX components of the adapter tests (KFP, Prefect). Loaded by TorchX (real annotations: no
``from __future__ import annotations``); the scripts run under the test interpreter."""

import os
import sys
from typing import Dict, List, Optional  # noqa: UP035 - TorchX's file_linter reads typing annotations

from torchx import specs

# TorchX execs a component file without __file__: the scripts are found from the repository root.
HERE = os.path.abspath(os.path.join("tests", "apps"))


def echo(
    lr: float = 0.1,
    epochs: int = 2,
    name: str = "run",
    tags: Optional[List[str]] = None,  # noqa: UP006, UP045
    extra: Optional[Dict[str, str]] = None,  # noqa: UP006, UP045
    debug: bool = False,
    image: str = "python:3.11",
) -> specs.AppDef:
    """Publish the values it was called with as rank-0 outputs.

    Args:
        lr: learning rate
        epochs: number of epochs
        name: a free-text name
        tags: a list of tags
        extra: extra key/values
        debug: a flag
        image: the container image
    """
    args = [
        os.path.join(HERE, "echo.py"),
        "--lr",
        str(lr),
        "--epochs",
        str(epochs),
        "--name",
        name,
        "--tags",
        ",".join(tags or []),
        "--extra",
        ",".join(f"{k}={v}" for k, v in (extra or {}).items()),
        "--debug",
        str(debug),
        "--app-id",
        specs.macros.app_id,
    ]
    role = specs.Role(
        "echo", image=image, entrypoint=sys.executable, args=args, resource=specs.Resource(cpu=1, gpu=0, memMB=256)
    )
    return specs.AppDef("echo", roles=[role])


def flaky(marker: str, fail_times: int = 1, max_retries: int = 1, non_retryable: bool = False) -> specs.AppDef:
    """Fail the first fail_times attempts (counted in the file marker), then succeed.

    Args:
        marker: the file that counts the attempts
        fail_times: attempts that fail before one succeeds
        max_retries: the AppDef's APPLICATION retry budget
        non_retryable: fail with torchstep.NonRetryableError instead
    """
    args = [os.path.join(HERE, "flaky.py"), marker, str(fail_times), str(non_retryable)]
    role = specs.Role(
        "flaky",
        image="python:3.11",
        entrypoint=sys.executable,
        args=args,
        max_retries=max_retries,
        retry_policy=specs.RetryPolicy.APPLICATION,
        metadata={"torchstep": {"retry_delay": 0.2}},
    )
    return specs.AppDef("flaky", roles=[role])


def missing_script(path: str) -> specs.AppDef:
    """Run a script that does not exist: python says so on stderr and exits 2 (no traceback).

    Args:
        path: the script that is not there
    """
    role = specs.Role("trainer", image="python:3.11", entrypoint=sys.executable, args=[path])
    return specs.AppDef("missing", roles=[role])


def nodes(replicas: int = 2, nproc_per_node: int = 1, image: str = "ghcr.io/acme/train:1") -> specs.AppDef:
    """A multi-node job (a KFP launcher step).

    Args:
        replicas: nodes
        nproc_per_node: processes per node
        image: the container image
    """
    role = specs.Role(
        "trainer",
        image=image,
        entrypoint="python",
        args=["-m", "train"],
        num_replicas=replicas,
        resource=specs.Resource(cpu=2, gpu=0, memMB=2048),
        max_retries=2,
        retry_policy=specs.RetryPolicy.APPLICATION,
        metadata={"torchstep": {"nproc_per_node": nproc_per_node}},
    )
    return specs.AppDef("nodes", roles=[role])


def sleeper(mark: str, seconds: float = 600.0, replicas: int = 1) -> specs.AppDef:
    """Run for a long time with a child and a double-forked grandchild (for timeout and
    cancellation tests); every process carries TORCHSTEP_TEST_MARK=mark in its environment.

    Args:
        mark: the marker value the tests look for in /proc
        seconds: how long to sleep
        replicas: agents (nodes)
    """
    role = specs.Role(
        "sleeper",
        image="python:3.11",
        entrypoint=sys.executable,
        args=[os.path.join(HERE, "sleeper.py"), str(seconds)],
        num_replicas=replicas,
        env={"TORCHSTEP_TEST_MARK": mark},
    )
    return specs.AppDef("sleeper", roles=[role])


def ckpt(marker: str = "", lr: float = 0.1, tag: str = "nopvc") -> specs.AppDef:
    """A step whose checkpoint volume depends on an input (a field KFP fixes at compile time).

    Args:
        marker: a file the step appends a line to when it runs ("" writes nothing)
        lr: learning rate (decides nothing KFP fixes)
        tag: "withpvc" mounts the claim ckpt at /ckpt
    """
    code = "import sys; sys.argv[1] and open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')"
    mounts = [specs.VolumeMount("ckpt", "/ckpt")] if tag == "withpvc" else []
    role = specs.Role(
        "trainer", image="python:3.11", entrypoint=sys.executable, args=["-c", code, marker, str(lr)], mounts=mounts
    )
    return specs.AppDef("ckpt", roles=[role])
