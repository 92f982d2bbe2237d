"""Publish the arguments as rank-0 outputs (and a metrics dict)."""

import argparse

import torchstep

p = argparse.ArgumentParser()
for flag in ("--lr", "--epochs", "--name", "--tags", "--extra", "--debug", "--app-id"):
    p.add_argument(flag)
a = p.parse_args()
torchstep.output("lr", float(a.lr))
torchstep.output("epochs", int(a.epochs))
torchstep.output("name", a.name)
torchstep.output("tags", a.tags.split(",") if a.tags else [])
torchstep.output("extra", dict(kv.split("=", 1) for kv in a.extra.split(",")) if a.extra else {})
torchstep.output("debug", a.debug)
torchstep.output("app_id", a.app_id)
torchstep.output("metrics", {"accuracy": 0.75, "loss": float(a.lr) / 2})
print(f"echo {a.name!r} lr={a.lr}", flush=True)
