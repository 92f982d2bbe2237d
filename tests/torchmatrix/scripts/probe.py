"""A worker that says how it was started: whether torch was already imported when it began
(forked from the zygote) and by whom, the torch it runs on, and a gloo all-reduce.

probe.py OUTDIR — writes OUTDIR/rank<RANK>.json; rank 0 also reports torchstep outputs.
"""

import json
import os
import sys

preloaded = "torch" in sys.modules  # before this script imported anything: the zygote's import

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torchstep  # noqa: E402

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
info = {
    "rank": dist.get_rank(),
    "world": int(t.item()),
    "pid": os.getpid(),
    "ppid": os.getppid(),
    "preloaded": preloaded,
    "torch": torch.__version__,
    "cuda_initialized": torch.cuda.is_initialized(),
    "local_rank": os.environ.get("LOCAL_RANK"),
}
os.makedirs(sys.argv[1], exist_ok=True)
with open(os.path.join(sys.argv[1], f"rank{info['rank']}.json"), "w") as f:
    json.dump(info, f)
torchstep.output("world", info["world"])
print(f"probe rank {info['rank']} preloaded={preloaded}", flush=True)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # skip the interpreter's teardown (~0.5-1 s with torch loaded)
