"""What Ray Tune keeps of the sweep's own objects: nothing.

Tune pickles its callbacks, its stopper and its name creators into the
experiment state (tuner.pkl, experiment_state-*.json: cloudpickled, rewritten
as trials change) and deep-copies its experiment spec. The sweep never
restores a Tune experiment from that state (a restart reads MLflow: sweeper.driver.ledger),
so an object that lives in the driver (a live queue, a thread, a client, the
jobs of the whole sweep) pickles as nothing and copies as itself. A Tune
trial carries its identity in its config (sweeper.driver.work.TrialId); the trial's
name and folder creators are module functions, pickled by reference.
"""

from __future__ import annotations


class DriverOnly:
    """A base for the sweep's objects that Tune holds: pickled empty, deep-copied as the same object."""

    def __getstate__(self) -> dict:
        return {}

    def __deepcopy__(self, memo: dict) -> DriverOnly:
        return self
