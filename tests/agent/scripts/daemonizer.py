"""A worker that leaves a daemon behind: double fork, setsid, an empty environment.

daemonizer.py PIDFILE MODE   MODE: ok (exit 0), fail (exit 1), hang (sleep until killed)
"""

import os
import sys
import time

pidfile, mode = sys.argv[1], sys.argv[2]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(pidfile + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pidfile + ".tmp", pidfile)
        os.execve("/bin/sleep", ["sleep", "300"], {})
    os._exit(0)
os.wait()
while not os.path.exists(pidfile):
    time.sleep(0.01)
print("daemon started", flush=True)
if mode == "fail":
    sys.exit(1)
if mode == "hang":
    time.sleep(300)
