"""Check a training result: the loss must have dropped below ``--max_ratio`` of its first
value; otherwise the model is useless and the step fails without retry."""

import argparse

import torchstep


@torchstep.record
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--loss", type=float, required=True)
    p.add_argument("--first_loss", type=float, required=True)
    p.add_argument("--max_ratio", type=float, default=0.5)
    a = p.parse_args()
    ratio = a.loss / a.first_loss if a.first_loss else float("inf")
    print(f"loss {a.first_loss:.4f} -> {a.loss:.4f}: ratio {ratio:.3f} (at most {a.max_ratio})", flush=True)
    torchstep.output("loss_ratio", round(ratio, 6))
    if ratio > a.max_ratio:
        raise torchstep.NonRetryableError(f"the loss did not drop enough: ratio {ratio:.3f} > {a.max_ratio}")


if __name__ == "__main__":
    main()
