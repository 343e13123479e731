"""What the tests share, one concern a module: `from support.servers import MlflowServer` (fixtures:
conftest.py).

repo: the checkout and its subprocess environment; configs: the tiny configurations and the small sweep;
servers: MLflow servers and ports; readme: the docs' pages and code blocks; sweeps: sweep stores and driver
subprocesses; histories: metric points against local training; ray_local: an in-process local Ray;
ray_nodes: a cluster of `ray start` nodes, and the session's one-node cluster.
"""
