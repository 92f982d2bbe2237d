"""``make soak``: a seeded fault campaign (issue 27). See docs/reliability.md for what it
checks and its latest figures; ``python -m tools.soak --help`` for the command line."""
