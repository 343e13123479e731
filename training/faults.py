"""Test-only fault injection: a NaN loss or a crash at a chosen step, or slow steps.

Not configuration: nothing here is in the config schema, its hash or a run's
MLflow params, so a real run can never carry it. Tests set an environment
variable, read here only; training.loop.Trainer asks once per run, and the
one training step (training.fused.Pack.step) acts at that step.
Ray workers started by a local ray.init inherit the driver's environment, so
a sweep test sets the variable before Ray starts.

    LEANER_TEST_NAN_AT_STEP=7                  every run's loss is NaN at step 7 (it diverges)
    LEANER_TEST_NAN_AT_STEP=7@HASH[,HASH...]   only the runs with these config hashes
    LEANER_TEST_CRASH_AT_STEP=7[@HASH,...]     the process raises InjectedCrash before step 7 (a worker dying)
    LEANER_TEST_STEP_PAUSE_S=0.05              every training step sleeps 0.05 s first: the fault tests'
                                               trials last seconds (a signal, a kill or an outage lands
                                               mid-trial) at a fraction of the CPU of training that long

A run it poisons is a normal configuration that diverges, so a test gives
those runs configurations of their own (their own config hashes).
"""

from __future__ import annotations

import logging
import os

NAN_AT_STEP = "LEANER_TEST_NAN_AT_STEP"
CRASH_AT_STEP = "LEANER_TEST_CRASH_AT_STEP"
STEP_PAUSE = "LEANER_TEST_STEP_PAUSE_S"
log = logging.getLogger(__name__)


class InjectedCrash(RuntimeError):
    """The crash LEANER_TEST_CRASH_AT_STEP asks for."""


def nan_at_step(key: str) -> int | None:
    """The step at which the run with config hash `key` gets a NaN loss; None, always outside tests."""
    return fault_step(NAN_AT_STEP, key)


def crash_at_step(key: str) -> int | None:
    """The step before which the run with config hash `key` crashes; None, always outside tests."""
    return fault_step(CRASH_AT_STEP, key)


def fault_step(variable: str, key: str) -> int | None:
    value = os.environ.get(variable, "")
    if not value:
        return None
    step, _, keys = value.partition("@")
    if not step.isdigit() or int(step) < 1:
        raise ValueError(f"{variable}={value!r}: expected STEP or STEP@HASH[,HASH...], with STEP >= 1")
    if keys and key not in keys.split(","):
        return None
    log.warning(f"{variable} is set: run {key} meets a test-only fault at step {step}")
    return int(step)


def step_pause() -> float:
    """Seconds every training step sleeps before it trains; 0, always outside tests."""
    value = os.environ.get(STEP_PAUSE, "")
    if not value:
        return 0.0
    try:
        pause = float(value)
    except ValueError:
        pause = -1.0
    if not 0 <= pause <= 10:
        raise ValueError(f"{STEP_PAUSE}={value!r}: expected seconds between 0 and 10")
    log.warning(f"{STEP_PAUSE} is set: every training step sleeps {pause} s (a test-only slow trial)")
    return pause
