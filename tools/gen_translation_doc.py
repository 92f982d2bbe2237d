"""Regenerate the example tables of docs/translation.md from ``torchstep.explain``.

Each example is an AppDef (a ``torchstep explain`` command line, or Python code that the
doc shows verbatim) explained on every target. Only the text between
``<!-- BEGIN GENERATED: name -->`` and ``<!-- END GENERATED: name -->`` is rewritten; the
prose around it is hand-written. tests/core/test_translation_doc.py fails when the
committed doc differs from what this prints.

Usage::

    python tools/gen_translation_doc.py            # rewrite docs/translation.md
    python tools/gen_translation_doc.py --check    # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "translation.md"
TARGETS = ("local", "kubernetes", "kfp")
WIDTH = 120


@dataclass(frozen=True)
class Example:
    """An AppDef given as ``torchstep explain`` arguments or as Python code defining ``app``."""

    name: str
    cli: tuple[str, ...] = ()
    code: str = ""

    def app(self) -> Any:
        import torchstep

        if self.cli:
            ref, _, args = self.cli[0], self.cli[1], list(self.cli[2:])
            return torchstep.materialize(ref, args)
        scope: dict[str, Any] = {}
        exec(compile(self.code, f"<example {self.name}>", "exec"), scope)  # the doc's own code
        return scope["app"]

    def command(self, target: str) -> str:
        if self.cli:
            return " ".join(["torchstep explain", self.cli[0], "--target", target, *self.cli[1:]])
        return f"print(torchstep.explain(app, target={target!r}))"


EVERYTHING = textwrap.dedent(
    """\
    from torchx.specs import AppDef, BindMount, DeviceMount, Resource, RetryPolicy, Role, VolumeMount

    trainer = Role(
        name="trainer",
        image="ghcr.io/acme/train:1",
        entrypoint="python",
        args=["-m", "train", "--data", "/data", "--run", "${app_id}"],
        env={"HF_HOME": "/data/hf"},
        num_replicas=4,
        min_replicas=2,
        max_retries=3,
        retry_policy=RetryPolicy.REPLICA,
        resource=Resource(
            cpu=8,
            gpu=2,
            memMB=32768,
            capabilities={"node.kubernetes.io/instance-type": "p4d.24xlarge"},
            devices={"vpc.amazonaws.com/efa": 1},
        ),
        port_map={"c10d": 29500, "tb": 6006},
        mounts=[
            BindMount("/mnt/datasets", "/data", read_only=True),
            VolumeMount("checkpoints", "/ckpt"),
            DeviceMount("/dev/infiniband", "/dev/infiniband"),
        ],
        metadata={
            "torchstep": {
                "nproc_per_node": 2,
                "timeout": 7200,
                "heartbeat_timeout": 300,
                "secret_env": {"HF_TOKEN": "hf-token/token"},
            },
            "kubernetes": {"tolerations": [{"key": "gpu", "operator": "Exists"}]},
            "mlflow": {"experiment": "llm"},
        },
    )
    app = AppDef("LLM_Pretrain", [trainer], metadata={"torchstep.timeout": "86400", "owner": "ml-platform"})
    """
)

EXAMPLES = (
    Example("ddp", cli=("dist.ddp", "--", "-j", "2x2", "--script", "train.py")),
    Example("everything", code=EVERYTHING),
)


def render(example: Example) -> str:
    """The generated block of one example: its tables on every target."""
    import torchstep

    app = example.app()
    parts = [f"```python\nimport torchstep\n{example.code}```\n"] if example.code else []
    for target in TARGETS:
        table = torchstep.explain(app, target, width=WIDTH).rstrip("\n")
        parts.append(f"#### `{target}`\n\n```text\n$ {example.command(target)}\n{table}\n```\n")
    return "\n".join(parts)


def regenerate(text: str) -> str:
    """``text`` (the doc) with every generated block replaced by its current rendering."""
    for example in EXAMPLES:
        begin, end = f"<!-- BEGIN GENERATED: {example.name} -->", f"<!-- END GENERATED: {example.name} -->"
        pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
        if not pattern.search(text):
            raise SystemExit(f"{DOC.name}: no block {begin!r} ... {end!r}")
        block = f"{begin}\n<!-- regenerate with: python tools/gen_translation_doc.py -->\n\n{render(example)}\n{end}"
        text = pattern.sub(lambda _m, b=block: b, text)  # type: ignore[misc]
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/translation.md is out of date")
    ns = p.parse_args(argv)
    current = DOC.read_text(encoding="utf-8")
    fresh = regenerate(current)
    if ns.check:
        if fresh != current:
            print(f"{DOC.relative_to(ROOT)} is out of date: run `python tools/gen_translation_doc.py`")
            return 1
        return 0
    if fresh != current:
        DOC.write_text(fresh, encoding="utf-8")
        print(f"rewrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
