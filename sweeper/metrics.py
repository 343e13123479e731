"""The names shared by training, sweeps and analysis: the only place they are spelled.

Metrics, tags, outcomes and artifact paths of an MLflow run. Anything that
writes or reads runs imports these instead of repeating string literals.
"""

# Metrics (step = training step).
TRAIN_LOSS = "train_loss"        # running mean of the batch loss over train.log_every steps
VAL_KMEANS = "val_kmeans"        # mean k-means objective after one model step, validation set
VAL_REL_LLOYD = "val_rel_lloyd"  # mean over tasks of model objective / one-Lloyd-step objective
LR = "lr"                        # learning rate at each evaluation
METRICS = (TRAIN_LOSS, VAL_KMEANS, VAL_REL_LLOYD, LR)

# Tags.
CONFIG_HASH = "config_hash"      # hash of the run configuration (sweeper.config.run_config), seed included
SEED = "seed"
OUTCOME = "outcome"
DIVERGED_AT = "diverged_at_step"
GIT_COMMIT = "git_commit"
RERUN_OF = "rerun_of"            # run id a `python -m sweeper.rerun` run reproduces
SUBGRIDS = "subgrids"            # comma-separated named sub-grids of the sweeps naming a configuration
SWEEP = "sweep"                  # comma-separated names of the sweeps a run belongs to (one that ran it, others adopt it)
PACK = "pack"                    # set by the sweep driver (cluster.pack=seeds): the trial a model trained in with others
TUNE_CHECKPOINT = "tune_checkpoint"  # set by the sweep driver: where a trial's latest Ray Tune checkpoint lies
DRIVER = "sweep_driver"          # on a sweep's parent run: the driver running it (sweeper.claim), while it runs

# Outcomes (values of the OUTCOME tag).
FINISHED = "finished"
DIVERGED = "diverged"

# Artifact paths inside a run.
CONFIG_ARTIFACT = "config.yaml"
CHECKPOINT_DIR = "checkpoints"   # holds BEST_CHECKPOINT and LAST_CHECKPOINT
BEST_CHECKPOINT = "best.pt"
LAST_CHECKPOINT = "last.pt"
CURVE_ARTIFACT = "curves.png"

# Outcome of a sweep trial the ASHA scheduler stopped early (MLflow status KILLED; not run again).
STOPPED = "stopped"
