"""Write a deterministic synthetic classification dataset (seeded): ``train.pt`` and
``test.pt`` in the output directory, each ``{"x": float tensor [N, dim], "y": long [N]}``.

Classes are Gaussian clusters around seeded centres: a small MLP separates them well above
chance (1 / classes). Plain single-process Python (no torch.distributed).

Example::

    python components/apps/data.py --out /tmp/data --samples 4000
"""

import argparse
import json
import os

import torch
import torchstep


@torchstep.record
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument("--samples", type=int, default=4000, help="examples in total (80%% train, 20%% test)")
    p.add_argument("--dim", type=int, default=8, help="input features")
    p.add_argument("--classes", type=int, default=4, help="classes")
    p.add_argument("--seed", type=int, default=0, help="seed: the same seed writes the same data")
    p.add_argument("--fail-once", action="store_true", help="fault injection: the first try exits 1 (retryable)")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.fail_once:
        try:  # an O_EXCL marker: only the first try fails
            os.close(os.open(os.path.join(a.out, ".fault-fail-once"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            print("fail-once: the first try of prepare fails (a retryable error)", flush=True)
            raise SystemExit(1)
        except FileExistsError:
            pass
    gen = torch.Generator().manual_seed(a.seed)
    centres = torch.randn(a.classes, a.dim, generator=gen) * 2.0
    y = torch.randint(0, a.classes, (a.samples,), generator=gen)
    x = centres[y] + torch.randn(a.samples, a.dim, generator=gen)
    cut = int(a.samples * 0.8)
    for name, sl in (("train", slice(0, cut)), ("test", slice(cut, None))):
        tmp = os.path.join(a.out, f".{name}.pt.tmp")
        torch.save({"x": x[sl].clone(), "y": y[sl].clone(), "classes": a.classes}, tmp)
        os.replace(tmp, os.path.join(a.out, f"{name}.pt"))
    info = {"train": cut, "test": a.samples - cut, "dim": a.dim, "classes": a.classes, "seed": a.seed}
    print(f"dataset in {a.out}: {json.dumps(info)}", flush=True)
    torchstep.output("data_dir", os.path.abspath(a.out))
    torchstep.output("dataset", info)


if __name__ == "__main__":
    main()
