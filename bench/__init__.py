"""Benchmarks and probes: `python -m bench COMMAND [options] [hydra overrides]` (bench/cli.py lists them).

One module per benchmark; bench/common.py holds what they share. Nothing in
sweeper/, models/ or tasks/ imports from here.
"""
