"""The tests' small configurations (overrides of conf/): one definition each, extended where a test needs
more."""

from __future__ import annotations

from training.faults import STEP_PAUSE

# Trains in about a second: 40 steps, evaluations at 0, 10, 20, 30, 40 (the `tiny` fixture).
TINY = [
    "task.n=64",
    "task.d=2",
    "task.k=3",
    "train.batch=4",
    "train.steps=40",
    "train.eval_every=10",
    "train.val_batches=2",
    "train.log_every=5",
    "train.device=cpu",
]

# Twelve steps with a checkpoint every 3: restarts and packs at many steps in well under a second.
SHORT = [
    "task.n=24",
    "task.d=3",
    "task.k=4",
    "train.batch=4",
    "train.steps=12",
    "train.eval_every=3",
    "train.log_every=2",
    "train.val_batches=2",
    "train.device=cpu",
]
# SHORT for packs: dropout 0, so models restarting at different steps draw no dropout masks together,
# and no learning-rate patience, so a plateau changes the rate at once.
PACKABLE = [*SHORT, "model.dropout=0.0", "optim.lr_patience=0"]

# A sweep subprocess's local Ray without its dashboard: nothing in a test reads it, and it costs every driver
# seconds to start (the docs' own commands, run by test_docs, keep it).
NO_DASHBOARD = "cluster.dashboard_host=null"
# The sweep subprocess tests' sweep: 2 smoke configurations x 2 seeds = 4 trials, evaluated (and Tune
# checkpointed) every 10 steps; each test sets its own train.steps, long enough for its fault to land
# mid-trial.
FOUR_TRIALS = [
    "sweep=smoke",
    "sweep.seeds=[1, 2]",
    "sweep.subgrids=[{name: smoke, embedding: [onehot, binary]}]",
    "train.eval_every=10",
    NO_DASHBOARD,
]
# The environment of the fault tests' sweeps (signals, kills, outages): every training step sleeps 50 ms first
# (training.faults), so a trial of 60 steps lasts 3 s, long enough for the fault to land mid-trial, at the CPU
# of 60 steps (the suite's two cores go to the other tests meanwhile). It changes no number a run records.
PACED = {STEP_PAUSE: "0.05"}
# One trial of the smoke grid (20 steps, evaluations every 5): the crash-and-resume tests' sweep.
ONE_TRIAL = ["sweep=smoke", "sweep.seeds=[1]", "sweep.subgrids=[{name: smoke, embedding: [onehot]}]"]
# Packed: the two seeds of a configuration in one trial, one trial at a time (dropout 0: packed equals solo).
PACKED = ["cluster.pack=seeds", "cluster.max_concurrent=1", "model.dropout=0.0"]

# Report settings small enough for tests: test_analysis and test_mlflow_ui pass the same ones, so both reuse
# the evaluations cached in the session's smoke store.
SMALL_EVAL = [
    "eval.batches=1",
    "eval.batch=4",
    "eval.steps=4",
    "eval.inits=[random,gonzalez]",
    "eval.lengths=[16,32]",
    "eval.surface_points=3",
    "eval.dissimilarity_tasks=2",
    "eval.device=cpu",
]

# A user's own sweep file (DIR/sweep/gamma-lr.yaml, run with --config-dir DIR): two axes, an axis of the
# user's (gamma) and one of the paper's (lr), 2 x 2 configurations of the smoke grid's tiny model, one seed.
GAMMA_LR = """# @package sweep
defaults: [smoke, _self_]
name: gamma-lr
seeds: [1]
axes: {gamma: model.gamma}
subgrids:
  - {name: mine, gamma: [0.5, 1.0], lr: [0.01, 0.03]}
"""
