"""``--run-path`` target: dump the environment like envdump.py, as a script path."""

import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from envdump import main  # noqa: E402

if __name__ == "__main__":
    main(sys.argv[1:])
