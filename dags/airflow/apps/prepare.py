"""Make a small synthetic regression dataset (y = X @ w + noise) and publish its path.

Runs as one process under torchstep-agent; plain Python, no torch needed.
"""

import argparse
import json
import os
import random

import torchstep


@torchstep.record
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out_dir", required=True)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--features", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = random.Random(a.seed)
    w = [rng.uniform(-2, 2) for _ in range(a.features)]
    rows = []
    for _ in range(a.rows):
        x = [rng.uniform(-1, 1) for _ in range(a.features)]
        rows.append({"x": x, "y": sum(xi * wi for xi, wi in zip(x, w, strict=True)) + rng.gauss(0, 0.01)})
    os.makedirs(a.out_dir, exist_ok=True)
    path = os.path.join(a.out_dir, "data.json")
    with open(path, "w") as f:
        json.dump({"rows": rows, "true_w": w}, f)
    print(f"wrote {len(rows)} rows to {path}", flush=True)
    torchstep.output("data", path)
    torchstep.output("rows", len(rows))


if __name__ == "__main__":
    main()
