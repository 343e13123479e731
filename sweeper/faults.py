"""Test-only fault injection: a NaN loss at a chosen step, to exercise divergence handling.

Not configuration: nothing here is in the config schema, its hash or a run's
MLflow params, so a real run can never carry it. Tests set one environment
variable, read here only; sweeper.train.Trainer asks once per run, and both
training loops (Trainer.step, sweeper.packed.packed_step) poison that step.
Ray workers started by a local ray.init inherit the driver's environment, so
a sweep test sets the variable before Ray starts.

    LEANER_TEST_NAN_AT_STEP=7                  every run's loss is NaN at step 7
    LEANER_TEST_NAN_AT_STEP=7@HASH[,HASH...]   only the runs with these config hashes

A run it poisons is a normal configuration that diverges, so a test gives
those runs configurations of their own (their own config hashes).
"""

from __future__ import annotations

import logging
import os

NAN_AT_STEP = "LEANER_TEST_NAN_AT_STEP"
log = logging.getLogger(__name__)


def nan_at_step(key: str) -> int | None:
    """The step at which the run with config hash `key` gets a NaN loss; None, always outside tests."""
    value = os.environ.get(NAN_AT_STEP, "")
    if not value:
        return None
    step, _, keys = value.partition("@")
    if not step.isdigit() or int(step) < 1:
        raise ValueError(f"{NAN_AT_STEP}={value!r}: expected STEP or STEP@HASH[,HASH...], with STEP >= 1")
    if keys and key not in keys.split(","):
        return None
    log.warning(f"{NAN_AT_STEP} is set: run {key} gets a NaN loss at step {step} (a test-only fault)")
    return int(step)
