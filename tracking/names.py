"""The names shared by training, sweeps and analysis: the only place they are spelled.

Metrics, tags, outcomes and artifact paths of an MLflow run. Anything that
writes or reads runs imports these instead of repeating string literals.
"""

from __future__ import annotations

from collections.abc import Mapping

# Metrics (step = training step).
TRAIN_LOSS = "train_loss"  # running mean of the batch loss over train.log_every steps
VAL_KMEANS = "val_kmeans"  # mean k-means objective after one model step, validation set
VAL_REL_LLOYD = "val_rel_lloyd"  # mean over tasks of model objective / one-Lloyd-step objective
LR = "lr"  # learning rate at each evaluation
BEST_VAL_REL_LLOYD = "best_val_rel_lloyd"  # lowest val_rel_lloyd so far: the one checkpoints/best.pt holds
METRICS = (TRAIN_LOSS, VAL_KMEANS, VAL_REL_LLOYD, LR, BEST_VAL_REL_LLOYD)

# System metrics (training.system_metrics; step = training step). MLflow's UI shows every metric named
# SYSTEM_PREFIX... in a run's System metrics tab; these are the names of MLflow's own monitor
# (mlflow.system_metrics), but the two of the training process, and a GPU's are per NVML index.
SYSTEM_PREFIX = "system/"
CPU_UTILIZATION = "system/cpu_utilization_percentage"  # the machine's CPUs, since the last sample
SYSTEM_MEMORY_MB = "system/system_memory_usage_megabytes"  # the machine's memory in use
SYSTEM_MEMORY_PERCENT = "system/system_memory_usage_percentage"
PROCESS_CPU = "system/process_cpu_utilization_percentage"  # the training process: 100 per busy core
PROCESS_RSS_MB = "system/process_memory_rss_megabytes"  # the training process's resident memory
# Every sample has these; on CUDA with NVML it adds the GPU's three.
SYSTEM_METRICS = (CPU_UTILIZATION, SYSTEM_MEMORY_MB, SYSTEM_MEMORY_PERCENT, PROCESS_CPU, PROCESS_RSS_MB)
GPU_UTILIZATION = "system/gpu_{index}_utilization_percentage"  # .format(index=NVML index): the GPU's
GPU_MEMORY_MB = "system/gpu_{index}_memory_usage_megabytes"  # the GPU's memory in use, all processes
GPU_MEMORY_PERCENT = "system/gpu_{index}_memory_usage_percentage"

# Tags.
CONFIG_HASH = "config_hash"  # hash of the run configuration (config.identity.run_config), seed included
SEED = "seed"
OUTCOME = "outcome"
DIVERGED_AT = "diverged_at_step"
GIT_COMMIT = "git_commit"
# The CUDA device's model (torch.cuda.get_device_name), absent on a CPU: a deterministic run repeats bit for
# bit on the same GPU model, driver, CUDA and torch, not across models (training.determinism).
GPU_MODEL = "gpu_model"
RERUN_OF = "rerun_of"  # run id a `python -m sweeper.rerun` run reproduces
SUBGRIDS = "subgrids"  # comma-separated named sub-grids of the sweeps naming a configuration
SWEEP = "sweep"  # comma-separated names of the sweeps a run belongs to (one that ran it, others adopt it)
PACK = "pack"  # set by the sweep driver (cluster.pack=seeds): the trial a model trained in with others
TUNE_CHECKPOINT = (
    "tune_checkpoint"  # set by the sweep driver: where a trial's latest Ray Tune checkpoint lies
)
CHECKPOINT_STEP = "tune_checkpoint_step"  # set with TUNE_CHECKPOINT: the step the model resumes from there
BAD_CHECKPOINT = "bad_checkpoint"  # a resume found a damaged checkpoint: which, and where training restarted

# MLflow's own tags (mlflow.utils.mlflow_tags, spelled here so that training, which sets them, needs no MLflow
# import: tests/test_tracking.py checks they match): the UI's Description, Source, User, git commit and the
# parent run a child run is nested under.
MLFLOW_RUN_NOTE = "mlflow.note.content"
MLFLOW_SOURCE_NAME = "mlflow.source.name"
MLFLOW_SOURCE_TYPE = "mlflow.source.type"
MLFLOW_USER = "mlflow.user"
MLFLOW_GIT_COMMIT = "mlflow.source.git.commit"
MLFLOW_PARENT_RUN_ID = "mlflow.parentRunId"
# A run's colour in the UI's charts and table (hex; tracking.view). Not in mlflow.utils.mlflow_tags: only
# MLflow's web app reads it.
UI_RUN_COLOR = "mlflow.runColor"

# Experiment tag: MLflow 3's UI opens an experiment of this kind on its runs table (not on traces).
EXPERIMENT_KIND = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"
CONFIGURATION = (
    "configuration"  # seed-free: readable name plus hash (config.identity.configuration_name); UI "Group by"
)
EVALUATION_LINK = (
    "evaluation."  # + evaluation name, on a training run: the id of its run in <experiment>-evaluations
)
DRIVER = "sweep_driver"  # on a sweep's parent run: the driver running it (sweeper.driver.lock), while it runs
# Tags of an evaluation run (analysis.checkpoint_eval): they describe evaluation runs, never training runs.
EVAL_OF = "eval_of"  # the id of the training run evaluated
EVALUATION = "evaluation"  # the evaluation's name
EVAL_KEY = "eval_key"  # hash of (version, name, training run, settings): the key a cached result is found by

# Outcomes (values of the OUTCOME tag).
FINISHED = "finished"
DIVERGED = "diverged"

# Artifact paths inside a run.
CONFIG_ARTIFACT = "config.yaml"
CHECKPOINT_DIR = "checkpoints"  # holds BEST_CHECKPOINT and LAST_CHECKPOINT
BEST_CHECKPOINT = "best.pt"
LAST_CHECKPOINT = "last.pt"
CURVE_ARTIFACT = "curves.png"
RESULT_ARTIFACT = "evaluation.csv"  # an evaluation run's result table (analysis.checkpoint_eval)

# Outcome of a sweep's model the ASHA scheduler stopped early (sweep.scheduler=asha): not run again, and its
# run ends FINISHED, as Ray Tune calls a trial its scheduler stopped TERMINATED, not failed (KILLED reads as a
# failure in the MLflow UI and is left to a stopped sweep's unfinished runs); the outcome tells it apart.
PRUNED = "pruned"
ENDED = (FINISHED, DIVERGED, PRUNED)  # outcomes that end a model for good: a sweep never runs it again
STATUS = {FINISHED: "FINISHED", DIVERGED: "FAILED", PRUNED: "FINISHED"}  # MLflow run status per outcome
# Outcomes under their earlier names, as older stores hold them: an ASHA stop was "stopped" (its run KILLED)
# until 2026-12-06. Read as today's name (outcome), a resumed sweep never trains such a model again.
RETIRED_OUTCOMES = {"stopped": PRUNED}


def outcome(tags: Mapping[str, str]) -> str | None:
    """A run's outcome (tags: its MLflow tags), under today's name; None before it ended."""
    value = tags.get(OUTCOME)
    return RETIRED_OUTCOMES.get(value, value)


# The parent run of a sweep (tracking.parent_run).
COMMAND = "command"  # tag: the command line that (last) started the sweep
PLAN_TAGS = ("plan.configurations", "plan.seeds", "plan.trials")  # tags: the plan's sizes
PLAN_ARTIFACT = "plan.txt"  # the plan's table, as the dry run prints it
PLAN_TRIALS_ARTIFACT = "plan.csv"  # one row per trial: run name, configuration, seed, sub-grids, config_hash
SWEEP_ARTIFACT = "sweep.yaml"  # the sweep's definition (conf/sweep/ with the command line's overrides)
REPORT_DIR = "report"  # analysis.report's figures, index.md and claims of the sweep
PENDING = "pending"
STEP_RATE = "model_steps_per_s"  # metric: the model-steps a second the sweep trained in its last allocation
TRIAL_COUNTS = {outcome: f"trials_{outcome}" for outcome in (*ENDED, PENDING)}  # metrics
# The sweep's summary, logged on its parent run by analysis.report (so that sweeps compare in the UI).
MEDIAN_FINAL = (
    "median_val_rel_lloyd."  # + embedding: median over the sweep's finished runs of the final value
)
# metrics: how many claims read each verdict (analysis.claims.cases.STATUSES, in that order)
CLAIM_COUNTS = {
    "PASS": "claims_passed",
    "PARTIAL": "claims_partial",
    "FAIL": "claims_failed",
    "UNTESTED": "claims_untested",
}
REPORT_HTML = "index.html"  # the report in one self-contained page (figures inline), for MLflow's viewer
