"""Test-only fault injection: a NaN loss or a crash at a chosen step, or slow steps.

Not configuration: nothing here is in the config schema, its hash or a run's
MLflow params, so a real run can never carry it. A Faults is the step hook of
training.fused.Pack: a test training in its own process hands one to
training.loop.train (train_pack, train_models). A test whose training runs
elsewhere (a sweep's Ray workers, the command line) sets environment
variables instead, which train_models alone reads, through from_environment.
Ray workers started by a local ray.init inherit the driver's environment, so
a sweep test sets the variables before Ray starts. Workers on a running
cluster inherit their node's environment instead: a driver joining one
forwards the variables set in its own (environment(), the job's runtime_env
in sweeper.driver.cluster.connect).

    LEANER_TEST_NAN_AT_STEP=7                  every run's loss is NaN at step 7 (it diverges)
    LEANER_TEST_NAN_AT_STEP=7@HASH[,HASH...]   only the runs with these config hashes
    LEANER_TEST_CRASH_AT_STEP=7[@HASH,...]     the process raises InjectedCrash at step 7, before its update
                                               (a worker dying)
    LEANER_TEST_STEP_PAUSE_S=0.05              every training step sleeps 0.05 s: the fault tests' trials
                                               last seconds (a signal, a kill or an outage lands mid-trial)
                                               at a fraction of the CPU of training that long

A run it poisons is a normal configuration that diverges, so a test gives
those runs configurations of their own (their own config hashes).
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if (
    TYPE_CHECKING
):  # no torch at import: a sweep's driver imports this module (sweeper.driver.cluster) and trains nothing
    import torch

NAN_AT_STEP = "LEANER_TEST_NAN_AT_STEP"
CRASH_AT_STEP = "LEANER_TEST_CRASH_AT_STEP"
STEP_PAUSE = "LEANER_TEST_STEP_PAUSE_S"
VARIABLES = (NAN_AT_STEP, CRASH_AT_STEP, STEP_PAUSE)
log = logging.getLogger(__name__)


class InjectedCrash(RuntimeError):
    """The crash a Faults' crash asks for."""


@dataclass(frozen=True)
class Fault:
    """A fault at `step` of the runs whose config hashes are `keys` (None: of every run)."""

    step: int
    keys: frozenset[str] | None = None

    def at(self, key: str) -> int | None:
        """The step at which the run with config hash `key` meets this fault; None if it never does."""
        return self.step if self.keys is None or key in self.keys else None


@dataclass(frozen=True)
class Faults:
    """Test-only faults, the step hook of training.fused.Pack: each step's losses pass through it."""

    nan: Fault | None = None  # the run's loss is NaN at this step (added: its gradients stay finite)
    crash: Fault | None = None  # InjectedCrash at this step, before its update
    pause_s: float = 0.0  # every step sleeps this long (a sleep costs no CPU)

    def __call__(self, keys: list[str], steps: list[int], loss: torch.Tensor) -> torch.Tensor:
        """The losses (P,) of the models with config hashes `keys`, at `steps` (the step each takes), as
        the faults make them."""
        if self.pause_s:
            time.sleep(self.pause_s)
        for key, step in zip(keys, steps):
            if self.crash and self.crash.at(key) == step:
                raise InjectedCrash(f"test-only crash before step {step}'s update")
        hit = [bool(self.nan) and self.nan.at(key) == step for key, step in zip(keys, steps)]
        if not any(hit):
            return loss
        return loss + loss.new_tensor([math.nan if h else 0.0 for h in hit])


def environment() -> dict[str, str] | None:
    """The LEANER_TEST_ variables set in this process, for the Ray workers of a cluster the driver joins;
    None when none is set (always, outside tests)."""
    found = {name: os.environ[name] for name in VARIABLES if os.environ.get(name)}
    return found or None


def from_environment() -> Faults | None:
    """The faults the LEANER_TEST_ variables ask for; None when none is set (always, outside tests)."""
    faults = Faults(fault(NAN_AT_STEP), fault(CRASH_AT_STEP), step_pause())
    if faults == Faults():
        return None
    log.warning(f"test-only faults are set: {faults}")
    return faults


def fault(variable: str) -> Fault | None:
    """The fault the variable asks for: STEP, or STEP@HASH[,HASH...]; None when it is unset."""
    value = os.environ.get(variable, "")
    if not value:
        return None
    step, _, keys = value.partition("@")
    if not step.isdigit() or int(step) < 1:
        raise ValueError(f"{variable}={value!r}: expected STEP or STEP@HASH[,HASH...], with STEP >= 1")
    return Fault(int(step), frozenset(keys.split(",")) if keys else None)


def step_pause() -> float:
    """Seconds every training step sleeps; 0 when the variable is unset."""
    value = os.environ.get(STEP_PAUSE, "")
    if not value:
        return 0.0
    try:
        pause = float(value)
    except ValueError:
        pause = -1.0
    if not 0 <= pause <= 10:
        raise ValueError(f"{STEP_PAUSE}={value!r}: expected seconds between 0 and 10")
    return pause
