"""Host a c10d TCPStore on a free loopback port (like the local supervisor) until killed.

Usage: python store.py PORT_FILE — the port is written to PORT_FILE when ready.
"""

import os
import signal
import sys
from datetime import timedelta

from torch.distributed import TCPStore

store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=900))
tmp = sys.argv[1] + ".tmp"
with open(tmp, "w") as f:
    f.write(str(store.port))
os.replace(tmp, sys.argv[1])
while True:
    signal.pause()
