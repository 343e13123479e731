"""The learning-rate schedule: torch's ReduceLROnPlateau(mode="min", factor, patience), on an AdamState.

torch's scheduler needs a torch Optimizer, and constructing one imports
torch._dynamo (training.adam says why that matters). This is its rule with
the arguments training always used (a relative threshold of 1e-4, no
cooldown, no minimum rate), and its state_dict format, so checkpoints load
into either (tests/test_packed.py checks both against torch's).
"""

from __future__ import annotations

import math

from training.adam import AdamState

THRESHOLD = 1e-4  # an evaluation improves on the best when below best * (1 - THRESHOLD)
EPS = 1e-8  # a reduction smaller than this is not applied


class Plateau:
    """Multiply adam.lr by factor after more than `patience` evaluations without improvement."""

    def __init__(self, adam: AdamState, factor: float, patience: int) -> None:
        self.adam, self.factor, self.patience = adam, factor, patience
        self.best, self.num_bad_epochs, self.last_epoch = math.inf, 0, 0

    def step(self, metric: float) -> None:
        current = float(metric)
        self.last_epoch += 1
        if current < self.best * (1.0 - THRESHOLD):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.num_bad_epochs > self.patience:
            lower = self.adam.lr * self.factor  # torch's max with a minimum rate of 0: a no-op here
            if self.adam.lr - lower > EPS:
                self.adam.lr = lower
            self.num_bad_epochs = 0

    def state_dict(self) -> dict:
        """torch's ReduceLROnPlateau.state_dict() for these arguments."""
        return {
            "factor": self.factor,
            "default_min_lr": 0,
            "min_lrs": [0],
            "patience": self.patience,
            "cooldown": 0,
            "eps": EPS,
            "last_epoch": self.last_epoch,
            "_last_lr": [self.adam.lr],
            "mode_worse": math.inf,
            "mode": "min",
            "threshold": THRESHOLD,
            "threshold_mode": "rel",
            "best": self.best,
            "cooldown_counter": 0,
            "num_bad_epochs": self.num_bad_epochs,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        self.best = state_dict["best"]
        self.num_bad_epochs = state_dict["num_bad_epochs"]
        self.last_epoch = state_dict["last_epoch"]
