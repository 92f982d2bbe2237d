"""Run the example pipeline on this machine with kfp.local (from the repository root)::

    python dags/kfp/run_local.py [--base-lr 0.05] [--steps 30]

``kfp.local.init`` comes first: a torchstep component called after it builds the
lightweight form the SubprocessRunner accepts (it refuses container components).
"""

import argparse
import os
import sys
import tempfile
import warnings

from kfp import local


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-lr", type=float, default=0.05)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--pipeline-root", default=None, help="where kfp.local keeps outputs (default: a new temp dir)")
    a = p.parse_args()
    root = a.pipeline_root or tempfile.mkdtemp(prefix="kfp-local-")
    # prepare and evaluate name the example's image (it has kfp, torchstep and the code);
    # the SubprocessRunner runs them in this Python, which has the same, and would warn once
    # per task that the image is not a Python image. torchstep's own steps do not warn.
    warnings.filterwarnings("ignore", "You may be attemping to run a task that uses custom or non-Python base image")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from train_pipeline import train_pipeline  # after local.init (see the module docstring)

    run = train_pipeline(base_lr=a.base_lr, steps=a.steps, model_dir=os.path.join(root, "model"))
    print(f"pipeline output: {run.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
