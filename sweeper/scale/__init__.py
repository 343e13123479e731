"""The scale probe (`python -m sweeper.scale_probe`): the sweep driver measured at the paper grid's volume
(probe.py) against a tracking server of its own (server.py)."""
