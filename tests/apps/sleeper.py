"""Sleep with a child process and a double-forked daemon grandchild (both sleep too)."""

import os
import subprocess
import sys
import time

seconds = float(sys.argv[1])
child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
if os.fork() == 0:  # a daemon: fork, new session, fork again, parent exits
    os.setsid()
    if os.fork() == 0:
        time.sleep(seconds)
    os._exit(0)
print(f"sleeping {seconds} s (child {child.pid})", flush=True)
time.sleep(seconds)
