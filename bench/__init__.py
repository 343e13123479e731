"""Benchmarks and probes: `python -m bench COMMAND [options] [hydra overrides]` (bench/cli.py lists them).

One module per benchmark; bench/common.py holds what they share. Nothing in
sweeper/, models/ or tasks/ imports from here, and nothing here imports sweeper/: `python -m bench scale`
runs the driver's side of its measurement as a process of its own (sweeper/scale_probe.py).
"""
