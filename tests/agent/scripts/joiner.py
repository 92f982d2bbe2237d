"""Records each start of this worker (WORLD_SIZE, GROUP_RANK, restart count) in OUTDIR and
keeps running until its group has WANT members (or 60 s passed).

joiner.py OUTDIR WANT
"""

import os
import sys
import time

outdir, want = sys.argv[1], sys.argv[2]
env = os.environ
name = f"start-{env['GROUP_RANK']}-{env['TORCHELASTIC_RESTART_COUNT']}-{os.getpid()}"
with open(os.path.join(outdir, name), "w") as f:
    f.write(env["WORLD_SIZE"])
deadline = time.monotonic() + 60
while env["WORLD_SIZE"] != want and time.monotonic() < deadline:
    time.sleep(0.1)
time.sleep(1)
