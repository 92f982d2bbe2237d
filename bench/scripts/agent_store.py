"""Host a c10d TCPStore on a free loopback port until killed (the local supervisor's role).

Usage: agent_store.py PORT_FILE
"""

import os
import signal
import sys
from datetime import timedelta

from torch.distributed import TCPStore

store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=900))
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(store.port))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    signal.pause()
