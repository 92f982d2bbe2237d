"""Reading a role's own torchrun from its command line (never rewriting it)."""

from __future__ import annotations

import pytest
from torchstep.plan.cmdline import TorchrunCall, detect_torchrun, parse_torchrun
from torchstep.plan.cmdline import detect_torchrun as public_detect_torchrun


@pytest.mark.parametrize(
    ("entrypoint", "args", "call"),
    [
        ("torchrun", ["--nnodes", "2", "--nproc-per-node=4", "t.py"], TorchrunCall("2", "4", None)),
        ("/usr/bin/torchrun", ["--standalone", "--nproc_per_node", "8", "t.py"], TorchrunCall(None, "8", None)),
        ("python3", ["-m", "torch.distributed.run", "--max_restarts", "3", "t.py"], TorchrunCall(None, None, "3")),
        ("bash", ["-c", "torchrun --nnodes 1:4 --max-restarts=2 t.py"], TorchrunCall("1:4", None, "2")),
        ("bash", ["-lc", "cd /w && FOO=1 exec torchrun --nnodes 2 t.py"], TorchrunCall("2", None, None)),
        ("sh", ["-c", "set -e; torchrun --nproc_per_node gpu -m pkg.train"], TorchrunCall(None, "gpu", None)),
        # the script's own flags are not torchrun's
        ("torchrun", ["--nnodes", "2", "t.py", "--nnodes", "9"], TorchrunCall("2", None, None)),
        ("torchrun", ["-m", "pkg", "--nproc-per-node", "9"], TorchrunCall(None, None, None)),
        # TorchX's dist.ddp command, macros and all
        (
            "bash",
            [
                "-c",
                "torchrun --rdzv_backend c10d --rdzv_endpoint $${${rank0_env}:=localhost}:29500 "
                "--rdzv_id '${app_id}' --nnodes 2 --nproc_per_node 2 --tee 3 --role '' train.py",
            ],
            TorchrunCall("2", "2", None),
        ),
    ],
)
def test_torchrun_is_found(entrypoint: str, args: list[str], call: TorchrunCall) -> None:
    assert parse_torchrun(entrypoint, args) == call


@pytest.mark.parametrize(
    ("entrypoint", "args"),
    [
        ("python", ["train.py", "--torchrun"]),
        ("bash", ["-c", "echo torchrun is great"]),  # not in command position
        ("bash", ["-c", "echo 'unbalanced"]),
        ("bash", ["script.sh", "torchrun"]),  # no -c
        ("python", ["-m", "torch.distributed.launch", "t.py"]),
        ("/bin/echo", []),
    ],
)
def test_no_torchrun(entrypoint: str, args: list[str]) -> None:
    assert parse_torchrun(entrypoint, args) is None
    assert detect_torchrun(entrypoint, args) == (False, None)


def test_detect_torchrun_is_public_on_plan() -> None:
    assert public_detect_torchrun is detect_torchrun
    assert detect_torchrun("bash", ["-c", "torchrun --nproc-per-node=auto t.py"]) == (True, None)
    assert detect_torchrun("torchrun", ["--nproc_per_node", "99999", "t.py"]) == (True, None)
