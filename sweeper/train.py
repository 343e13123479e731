"""Train one configuration (SPEC section 5): `python -m sweeper.train [hydra overrides]`.

Adam on the batch mean of the smoothed k-means surrogate of the model's
one-step centers; every train.eval_every steps the fixed validation set gives
val_kmeans and val_rel_lloyd, ReduceLROnPlateau steps on val_rel_lloyd, and a
checkpoint is written, from which the same command resumes after a crash.

Exit codes of the CLI: 0 finished, 2 rejected configuration, 3 diverged
(non-finite loss or parameters), 4 tracking store unreachable or unusable,
5 unusable checkpoint.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from models.lloyd import lloyd_step
from models.losses import kmeans_objective, smoothed_objective
from models.transformer import ClusteringTransformer
from sweeper import checkpoint
from sweeper.checkpoint import CheckpointError
from sweeper.config import ConfigError, compose, config_hash, flat_params, run_config, run_name, validate
from sweeper.faults import nan_at_step
from sweeper.metrics import (BEST_VAL_REL_LLOYD, CHECKPOINT_DIR, CONFIG_ARTIFACT, CONFIG_HASH, CURVE_ARTIFACT, DIVERGED,
                             DIVERGED_AT, FINISHED, GIT_COMMIT, LR, OUTCOME, SEED, TRAIN_LOSS,
                             VAL_KMEANS, VAL_REL_LLOYD)
from sweeper.run_tags import training_tags
from sweeper.tracking import MlflowRecorder, Recorder, TrackingError, git_commit
from tasks.sampler import TaskSpec, sample_tasks, validation_tasks

EXIT_CONFIG, EXIT_DIVERGED, EXIT_TRACKING, EXIT_CHECKPOINT = 2, 3, 4, 5
# What the command lines (train, rerun) report as one line, with its exit code.
CLI_ERRORS = (ConfigError, TrackingError, CheckpointError)

OnEval = Callable[[int, dict, Path], None]


@dataclass
class TrainResult:
    outcome: str                       # metrics.FINISHED or metrics.DIVERGED
    step: int                          # last step taken (the diverging one for a diverged run)
    metrics: dict[str, float]          # the last evaluation: val_kmeans, val_rel_lloyd, lr
    best_val: float                    # lowest val_rel_lloyd seen
    run_id: str
    diverged_at: int | None = None


@dataclass
class Progress:
    """What the loop carries from step to step beyond model and optimizer (checkpointed)."""

    step: int = 0
    best_val: float = math.inf
    window: list[float] = field(default_factory=list)  # batch losses since the last train_loss point
    history: dict[str, list[list[float]]] = field(default_factory=dict)  # metric -> [[step, value]], for curves.png
    metrics: dict[str, float] = field(default_factory=dict)  # the last evaluation


class Diverged(Exception):
    def __init__(self, step: int) -> None:
        super().__init__(f"non-finite loss or parameters at step {step}")
        self.step = step


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def compiled(forward: Callable, mode: str) -> Callable:
    """train.compile: the forward pass through torch.compile, or as is (off).

    Off by default: on CPU at the paper config inductor gained 5% per step at
    dropout 0 and lost 8% at dropout 0.01, after 35-50 s of compiling
    (analysis.bench step, compile=...). cudagraphs (inductor plus CUDA graphs)
    targets GPUs, where tiny models wait on kernel launches. Compiled kernels
    round differently, so the mode is part of the configuration.
    """
    if mode == "off":
        return forward
    if mode == "aot_eager":  # graph capture and autograd tracing without code generation
        return torch.compile(forward, backend="aot_eager")
    return torch.compile(forward, mode="reduce-overhead" if mode == "cudagraphs" else None)


def task_spec(cfg: DictConfig) -> TaskSpec:
    return TaskSpec(**OmegaConf.to_container(cfg.task))


def default_workdir(cfg: DictConfig) -> Path:
    """Where the CLI checkpoints a run: restarting the same command finds it again."""
    return Path(cfg.train.workdir) / config_hash(cfg)


class Validation:
    """The run's fixed validation set, with the one-Lloyd-step objectives computed once."""

    def __init__(self, cfg: DictConfig, device: torch.device) -> None:
        batches = validation_tasks(task_spec(cfg), cfg.seed, cfg.train.val_batches, cfg.train.batch)
        self.batches = [(X.to(device), C.to(device)) for X, C in batches]
        self.lloyd = [kmeans_objective(X, lloyd_step(X, C)) for X, C in self.batches]

    @torch.no_grad()
    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        model.eval()
        objective, ratio = [], []
        for (X, C), lloyd in zip(self.batches, self.lloyd):
            obj = kmeans_objective(X, model(X, C))
            objective.append(obj)
            ratio.append(obj / lloyd)
        model.train()
        return {VAL_KMEANS: torch.cat(objective).mean().item(), VAL_REL_LLOYD: torch.cat(ratio).mean().item()}


class Trainer:
    """One run's model, optimizer, scheduler, task stream and progress."""

    def __init__(self, cfg: DictConfig, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        torch.manual_seed(cfg.seed)  # model initialisation, then dropout
        m = cfg.model
        self.model = ClusteringTransformer(cfg.task.d, cfg.task.k, m.embedding, m.gamma, m.dropout,
                                           m.qkv_mult).to(device)
        if cfg.train.compile == "cudagraphs" and device.type != "cuda":
            raise ConfigError(f"train.compile=cudagraphs needs a CUDA device, and train.device={cfg.train.device} "
                              f"is {device}: use train.compile=inductor or off")
        self.forward = compiled(self.model, cfg.train.compile)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.optim.lr)
        self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            self.optimizer, mode="min", factor=cfg.optim.lr_factor, patience=cfg.optim.lr_patience)
        # The stream of training tasks, drawn on the training device: on a GPU the host never holds a step up
        # (so a CUDA run draws other tasks than a CPU run of the same seed; the validation set is the same).
        self.generator = torch.Generator(device=device).manual_seed(cfg.seed)
        self.spec = task_spec(cfg)
        self.progress = Progress()
        self.nan_at_step = nan_at_step(config_hash(cfg))  # None but in tests of divergence (sweeper.faults)

    def state(self, run_id: str) -> dict:
        """The checkpoint: everything needed to continue bit-for-bit (loads with weights_only=True)."""
        p = self.progress
        return dict(model=self.model.state_dict(), optimizer=self.optimizer.state_dict(),
                    scheduler=self.scheduler.state_dict(), generator=self.generator.get_state(),
                    torch_rng=torch.get_rng_state(),
                    cuda_rng=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                    step=p.step, run_id=run_id, best_val=p.best_val, config=run_config(self.cfg),
                    window=p.window, history=p.history, metrics=p.metrics)

    def restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        try:
            self.generator.set_state(state["generator"])
        except RuntimeError:  # a CPU generator's state does not fit a CUDA one, nor the other way round
            raise CheckpointError(f"the checkpoint's task stream was drawn on another kind of device than "
                                  f"train.device={self.cfg.train.device} ({self.device}): resume it on the kind "
                                  "it started on, or start over with train.resume=never") from None
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self.progress = Progress(state["step"], state["best_val"], list(state["window"]),
                                 state["history"], state["metrics"])

    def step(self) -> tuple[float, float]:
        """One optimizer step; returns the loss and the sum of all parameters."""
        self.progress.step += 1
        X, C0 = sample_tasks(self.spec, self.cfg.train.batch, self.generator)
        X, C0 = X.to(self.device), C0.to(self.device)
        loss = smoothed_objective(X, self.forward(X, C0), self.cfg.loss.tau, self.cfg.loss.regularizer).mean()
        if self.progress.step == self.nan_at_step:
            loss = loss * math.nan  # test-only fault: exercises divergence handling
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        # A non-finite parameter anywhere makes this sum non-finite.
        total = torch.stack([p.detach().sum() for p in self.model.parameters()]).sum()
        loss_value, total_value = torch.stack([loss.detach(), total]).tolist()
        return loss_value, total_value

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]


def open_run(cfg: DictConfig, recorder: Recorder, workdir: Path) -> tuple[Trainer, str]:
    """Resume from workdir/last.pt or start afresh, and open the recorder's run; returns the trainer and run id."""
    validate(cfg)
    torch.set_num_threads(cfg.train.threads)  # CPU sums depend on the thread count: fixed by the config
    workdir.mkdir(parents=True, exist_ok=True)
    resumed = checkpoint.resume_state(workdir, cfg.train.resume, run_config(cfg))
    trainer = Trainer(cfg, pick_device(cfg.train.device))
    if resumed:
        trainer.restore(resumed)
    tags = {CONFIG_HASH: config_hash(cfg), SEED: str(cfg.seed), GIT_COMMIT: git_commit(), **training_tags(cfg)}
    run_id = recorder.start(run_name(cfg), flat_params(cfg), tags, run_id=resumed["run_id"] if resumed else None)
    if not resumed:
        (workdir / CONFIG_ARTIFACT).write_text(OmegaConf.to_yaml(cfg))
        recorder.log_artifact(workdir / CONFIG_ARTIFACT)
    return trainer, run_id


def train(cfg: DictConfig, recorder: Recorder, workdir: Path, on_eval: OnEval | None = None) -> TrainResult:
    """Train one configuration, resuming from workdir/last.pt when it holds an unfinished run."""
    workdir = Path(workdir)
    trainer, run_id = open_run(cfg, recorder, workdir)
    try:
        _loop(trainer, Validation(cfg, trainer.device), recorder, workdir, run_id, on_eval)
    except Diverged as err:
        close(trainer, recorder, workdir, {OUTCOME: DIVERGED, DIVERGED_AT: str(err.step)}, "FAILED")
        p = trainer.progress
        return TrainResult(DIVERGED, err.step, p.metrics, p.best_val, run_id, diverged_at=err.step)
    except BaseException as err:  # a crash or Ctrl-C: the run stays resumable from its checkpoint
        recorder.finish("KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED")
        raise
    close(trainer, recorder, workdir, {OUTCOME: FINISHED}, "FINISHED")
    p = trainer.progress
    return TrainResult(FINISHED, p.step, p.metrics, p.best_val, run_id)


def _loop(trainer: Trainer, validation: Validation, recorder: Recorder, workdir: Path, run_id: str,
          on_eval: OnEval | None) -> None:
    t, p = trainer.cfg.train, trainer.progress
    if p.step == 0:
        evaluate(trainer, validation, recorder, workdir, run_id, on_eval)
    bar = tqdm(total=t.steps, initial=p.step, desc="train", disable=not sys.stderr.isatty(), dynamic_ncols=True)
    while p.step < t.steps:
        loss, total = trainer.step()
        # One device sync per step: NaN parameters must not reach the next
        # forward pass (sparsemax of NaNs indexes out of bounds; on CUDA a device assert).
        if not (math.isfinite(loss) and math.isfinite(total)):
            raise Diverged(p.step)
        p.window.append(loss)
        bar.update(1)
        if p.step % t.log_every == 0:
            mean = sum(p.window) / len(p.window)
            recorder.log_metrics(p.step, {TRAIN_LOSS: mean})
            p.history.setdefault(TRAIN_LOSS, []).append([p.step, mean])
            p.window = []
            bar.set_postfix(loss=f"{mean:.4g}", val=f"{p.metrics[VAL_REL_LLOYD]:.4f}", lr=f"{trainer.lr:.2g}",
                            refresh=False)
        if p.step % t.eval_every == 0 or p.step == t.steps:
            evaluate(trainer, validation, recorder, workdir, run_id, on_eval)
    bar.close()


def evaluate(trainer: Trainer, validation: Validation, recorder: Recorder, workdir: Path, run_id: str,
             on_eval: OnEval | None = None) -> None:
    """Validate, step the scheduler, record, then checkpoint (metrics flushed first, so a resume never loses any)."""
    p = trainer.progress
    metrics = {**validation(trainer.model), LR: trainer.lr}
    trainer.scheduler.step(metrics[VAL_REL_LLOYD])
    recorder.log_metrics(p.step, {**metrics, BEST_VAL_REL_LLOYD: min(p.best_val, metrics[VAL_REL_LLOYD])})
    recorder.flush()
    p.metrics = metrics
    for key in (VAL_KMEANS, VAL_REL_LLOYD, LR):
        p.history.setdefault(key, []).append([p.step, metrics[key]])
    improved = metrics[VAL_REL_LLOYD] < p.best_val
    if improved:
        p.best_val = metrics[VAL_REL_LLOYD]
    state = trainer.state(run_id)
    checkpoint.save(state, checkpoint.last_path(workdir))
    if improved:
        checkpoint.save(state, checkpoint.best_path(workdir))
    if on_eval is not None:
        on_eval(p.step, metrics, workdir)


def close(trainer: Trainer, recorder: Recorder, workdir: Path, tags: dict[str, str], status: str) -> None:
    """Store checkpoints and curves, tag the outcome, end the run."""
    recorder.flush()
    for path in (checkpoint.best_path(workdir), checkpoint.last_path(workdir)):
        if path.exists():
            recorder.log_artifact(path, CHECKPOINT_DIR)
    plot_curves(trainer.progress.history, workdir / CURVE_ARTIFACT)
    recorder.log_artifact(workdir / CURVE_ARTIFACT)
    recorder.set_tags(tags)
    recorder.finish(status)


def plot_curves(history: dict[str, list[list[float]]], path: Path) -> None:
    """train_loss and val_rel_lloyd against step (below the dashed line beats one Lloyd step)."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state

    fig = Figure(figsize=(9, 3.5), layout="constrained")
    left, right = fig.subplots(1, 2)
    for ax, key in ((left, TRAIN_LOSS), (right, VAL_REL_LLOYD)):
        points = history.get(key, [])
        ax.plot([s for s, _ in points], [v for _, v in points])
        ax.set_xlabel("step")
        ax.set_title(key)
    left.set_yscale("log")
    right.axhline(1.0, color="black", linestyle="--", linewidth=1, label="one Lloyd step")
    right.legend()
    fig.savefig(path, dpi=100)


def report_error(err: Exception) -> int:
    """Print one of CLI_ERRORS as one line on stderr; return its exit code."""
    print(f"error: {err}", file=sys.stderr)
    codes = {ConfigError: EXIT_CONFIG, TrackingError: EXIT_TRACKING, CheckpointError: EXIT_CHECKPOINT}
    return next(code for kind, code in codes.items() if isinstance(err, kind))


def main(argv: list[str] | None = None) -> int:
    overrides = sys.argv[1:] if argv is None else argv
    if overrides and overrides[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\nDefault configuration (override any key as group.key=value):\n")
        print(OmegaConf.to_yaml(compose([])))
        return 0
    try:
        cfg = compose(overrides)
        recorder = MlflowRecorder(cfg.tracking.uri, cfg.tracking.experiment)
        result = train(cfg, recorder, default_workdir(cfg))
    except CLI_ERRORS as err:
        return report_error(err)
    where = f"run {result.run_id} in {cfg.tracking.uri} (experiment {cfg.tracking.experiment})"
    if result.outcome == DIVERGED:
        print(f"diverged: non-finite loss or parameters at step {result.diverged_at}; {where} marked FAILED",
              file=sys.stderr)
        return EXIT_DIVERGED
    print(f"finished {result.step} steps: {VAL_REL_LLOYD} {result.metrics[VAL_REL_LLOYD]:.6f}, "
          f"{VAL_KMEANS} {result.metrics[VAL_KMEANS]:.6f}, best {VAL_REL_LLOYD} {result.best_val:.6f}; {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
