"""``python -m torchstep.agent [torchrun flags] [torchstep flags] script [args]``."""

from torchstep.agent.cli import main

if __name__ == "__main__":
    main()
