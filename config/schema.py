"""The configuration schema: one dataclass per conf/ group, keys and types only.

Every default value lives in the YAML files under conf/; config.compose merges
them on this schema, so an unknown key or a wrongly typed value fails there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from cli import exit_codes

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
RESUME_MODES = ("auto", "never", "must")
COMPILE_MODES = ("off", "inductor", "cudagraphs", "aot_eager")  # train.compile; see training.fused.compiled
# cluster.pack: one model per sweep trial, the seeds of a configuration together, or up to cluster.pack_size
# models of one shape (SHARED_KEYS) together.
PACK_MODES = ("none", "seeds", "shapes")
# Keys every model of a pack must share (training.packed; a sweep with cluster.pack=shapes packs by them):
# they fix tensor shapes, the attention kernel and the step schedule.
SHARED_KEYS = (
    "task.n",
    "task.d",
    "task.k",
    "model.embedding",
    "model.gamma",
    "model.dropout",
    "model.qkv_mult",
    "train.steps",
    "train.batch",
    "train.eval_every",
    "train.log_every",
    "train.val_batches",
    "train.device",
    "train.compile",
    "train.deterministic",  # a process-wide mode (training.determinism)
)
# Keys of `train` that say how and where a run executes, not what it computes:
# they stay out of run_config and config_hash, so a resumed run (say with
# train.resume=must) keeps its hash and finds its own checkpoint.
OPERATIONAL_TRAIN_KEYS = ("device", "resume", "workdir")
# train.* keys since removed from the schema, with the one value every run recorded: hashed as if still
# there, so runs recorded before keep their config_hash (the sweep's ledger, reruns), and skipped when a
# configuration is rebuilt from a run's params.
RETIRED_TRAIN_KEYS = {"inject_nan_at_step": None}
# train.* keys added to the schema after runs were recorded, with the value every earlier run had in effect:
# left out of run_config at that value (so of config_hash and a checkpoint's config), so those runs keep
# their hashes (the sweep's ledger, reruns) and resume. Their params are logged as any other.
ADDED_TRAIN_KEYS = {"deterministic": True}  # CPU runs were deterministic, and no CUDA run was recorded
RUN_GROUPS = ("task", "model", "loss", "optim", "train")
EVAL_CHECKPOINTS = ("last", "best")  # eval.checkpoint: the checkpoints a run logs (analysis.checkpoint_eval)


class ConfigError(ValueError, exit_codes.CommandError):
    """A rejected configuration; the message names key, value and what is allowed."""

    exit_code = exit_codes.CONFIG


# The schema: one dataclass per config group, keys and types only. They look alike on purpose (the
# `duplicates` tool pairs them by shape): each mirrors one conf/ group, and their defaults live in the YAML.
@dataclass
class TaskConfig:
    family: str = MISSING
    n: int = MISSING
    d: int = MISSING
    k: int = MISSING
    scale: float = MISSING
    equal_weights: bool = MISSING
    equal_scales: bool = MISSING
    init: str = MISSING


@dataclass
class ModelConfig:
    embedding: str = MISSING
    gamma: float = MISSING
    dropout: float = MISSING
    qkv_mult: int = MISSING


@dataclass
class LossConfig:
    regularizer: str = MISSING
    tau: float = MISSING


@dataclass
class OptimConfig:
    lr: float = MISSING
    lr_factor: float = MISSING
    lr_patience: int = MISSING


@dataclass
class TrainConfig:
    steps: int = MISSING
    batch: int = MISSING
    eval_every: int = MISSING
    val_batches: int = MISSING
    log_every: int = MISSING
    threads: int = MISSING
    deterministic: bool = MISSING
    compile: str = MISSING
    device: str = MISSING
    resume: str = MISSING
    workdir: str = MISSING


@dataclass
class TrackingConfig:
    uri: str = MISSING
    experiment: str = MISSING
    outage_s: float = MISSING


@dataclass
class ClusterConfig:
    address: Optional[str] = MISSING
    cpus_per_trial: float = MISSING
    gpus_per_trial: float = MISSING
    max_concurrent: Optional[int] = MISSING
    storage: Optional[str] = MISSING
    max_failures: int = MISSING
    dashboard_host: Optional[str] = MISSING
    pack: str = MISSING
    pack_size: int = MISSING
    report_every: int = MISSING
    time_budget_s: Optional[float] = MISSING
    drain_s: Optional[float] = MISSING
    step_seconds: Optional[str] = MISSING
    price_per_gpu_hour: Optional[float] = MISSING
    price_per_core_hour: Optional[float] = MISSING


@dataclass
class AshaConfig:
    """sweep.asha: Ray Tune's ASHAScheduler (sweeper.driver.tune.scheduler_of) when sweep.scheduler=asha."""

    grace_period: Optional[int] = MISSING
    reduction_factor: float = MISSING
    brackets: int = MISSING


@dataclass
class SearchConfig:
    """sweep.search: a random search over declared ranges (config.search)."""

    samples: int = MISSING
    seed: int = MISSING
    space: Dict[str, Any] = MISSING


@dataclass
class SweepConfig:
    """The keys of a sweep (conf/sweep/*.yaml); config.grid checks what types cannot."""

    name: str = MISSING
    dry_run: bool = MISSING
    scheduler: str = MISSING
    asha: AshaConfig = MISSING
    search: SearchConfig = MISSING
    axes: Dict[str, str] = MISSING
    baseline: Dict[str, Any] = MISSING
    seeds: List[Any] = MISSING
    fixed: Dict[str, Any] = MISSING
    subgrids: List[Any] = MISSING
    confirm: bool = MISSING
    confirm_trials: Optional[int] = MISSING
    confirm_hours: Optional[float] = MISSING


@dataclass
class Config:
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    seed: int = MISSING
    sweep: Optional[SweepConfig] = None  # conf/sweep/; `none` (no keys) for a single run


@dataclass
class SelectConfig:
    sweep: Optional[str] = MISSING
    subgrid: Optional[str] = MISSING


@dataclass
class EvalConfig:
    """The report's evaluations (analysis.checkpoint_eval.EvalSettings holds them for the code)."""

    seed: int = MISSING
    batches: int = MISSING
    batch: int = MISSING
    steps: int = MISSING
    inits: List[str] = MISSING
    lengths: List[int] = MISSING
    dissimilarity_tasks: int = MISSING
    surface_points: int = MISSING
    surface_span: float = MISSING
    device: str = MISSING
    threads: int = MISSING
    max_elements: int = MISSING
    checkpoint: str = MISSING
    d32_n: Optional[int] = MISSING


@dataclass
class AnalysisConfig:
    """`python -m analysis.report` and `analysis.claims` (conf/analysis.yaml): the store, then conf/report."""

    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    figures: Optional[List[str]] = MISSING
    experiments: Optional[List[str]] = MISSING
    out: str = MISSING
    select: SelectConfig = field(default_factory=SelectConfig)
    speed_json: Optional[str] = MISSING
    step_json: Optional[str] = MISSING
    eval: EvalConfig = field(default_factory=EvalConfig)


SCHEMAS = {"config": Config, "analysis": AnalysisConfig}  # primary config (conf/NAME.yaml) -> its schema
ConfigStore.instance().store(name="schema", node=Config)
ConfigStore.instance().store(name="analysis_schema", node=AnalysisConfig)
