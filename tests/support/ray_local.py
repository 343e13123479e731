"""An in-process local Ray instance: one a file's tests share, or a test's own with its own environment."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import pytest

SHARED_CPUS = 2  # what the tests on the shared instance declare per trial is sized for two CPUs


def start(num_cpus: float) -> None:
    """A new local instance, never another one running on this machine (a `ray start` head of a cluster
    test on the other pytest worker): ray.init with no address would join that one."""
    import ray

    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False)


def shared() -> None:
    """This worker's instance: started on first use, kept for the file's next test (tests/conftest.py stops it
    after the file)."""
    import ray

    if not ray.is_initialized():
        start(SHARED_CPUS)


@contextmanager
def own(num_cpus: float, env: dict[str, str] | None = None) -> Iterator[None]:
    """A test's own instance: Ray's workers inherit the environment of ray.init (the test-only faults of
    training/faults.py travel so). Whatever instance ran before is shut down; this one is at the end."""
    import ray

    ray.shutdown()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        start(num_cpus)
        try:
            yield
        finally:
            ray.shutdown()
