"""``python -m torchstep.agent [torchrun flags] [torchstep flags] script [args]``."""

import sys

from torchstep.agent.cli import main

if __name__ == "__main__":
    sys.exit(main())
