"""The training loop (docs/science.md section 5); its command line is sweeper.train.

Adam on the batch mean of the smoothed k-means surrogate of the model's
one-step centers; every train.eval_every steps the fixed validation set gives
val_kmeans and val_rel_lloyd, ReduceLROnPlateau steps on val_rel_lloyd, and a
checkpoint is written, from which the same command resumes after a crash.

One loop (train_models) trains a list of models: alone, a list of one
(train); packed, several that share one vectorised step (training.packed).
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

from config.compose import validate
from config.identity import config_hash, flat_params, run_config, run_name
from config.schema import ConfigError
from models.lloyd import lloyd_step
from models.losses import kmeans_objective, smoothed_objective
from models.transformer import ClusteringTransformer
from tasks.sampler import TaskSpec, sample_tasks, validation_tasks
from tracking.names import (
    BAD_CHECKPOINT,
    BEST_VAL_REL_LLOYD,
    CHECKPOINT_DIR,
    CONFIG_ARTIFACT,
    CONFIG_HASH,
    CURVE_ARTIFACT,
    DIVERGED,
    DIVERGED_AT,
    FINISHED,
    GIT_COMMIT,
    LR,
    OUTCOME,
    SEED,
    TRAIN_LOSS,
    VAL_KMEANS,
    VAL_REL_LLOYD,
)
from tracking.recorder import Recorder, git_commit
from training import checkpoint
from training.checkpoint import CheckpointError
from training.faults import InjectedCrash, crash_at_step, nan_at_step
from training.run_tags import training_tags

OnEval = Callable[[int, dict, Path], None]  # train(): (step, metrics, workdir) after each evaluation
OnRound = Callable[[int, dict[Path, dict]], None]  # train_models(): (step, {workdir: metrics}) per round


@dataclass
class TrainResult:
    outcome: str  # metrics.FINISHED or metrics.DIVERGED
    step: int  # last step taken (the diverging one for a diverged run)
    metrics: dict[str, float]  # the last evaluation: val_kmeans, val_rel_lloyd, lr
    best_val: float  # lowest val_rel_lloyd seen
    run_id: str
    diverged_at: int | None = None


@dataclass
class Progress:
    """What the loop carries from step to step beyond model and optimizer (checkpointed)."""

    step: int = 0
    best_val: float = math.inf
    window: list[float] = field(default_factory=list)  # batch losses since the last train_loss point
    history: dict[str, list[list[float]]] = field(
        default_factory=dict
    )  # metric -> [[step, value]], for curves.png
    metrics: dict[str, float] = field(default_factory=dict)  # the last evaluation


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def compiled(forward: Callable, mode: str) -> Callable:
    """train.compile: the forward pass through torch.compile, or as is (off).

    Off by default: on CPU at the paper config inductor gained 5% per step at
    dropout 0 and lost 8% at dropout 0.01, after 35-50 s of compiling
    (python -m bench step, compile=...). cudagraphs (inductor plus CUDA graphs)
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
    """One model's weights, optimizer, scheduler, task stream and progress."""

    def __init__(self, cfg: DictConfig, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        torch.manual_seed(cfg.seed)  # model initialisation, then dropout
        m = cfg.model
        self.model = ClusteringTransformer(
            cfg.task.d, cfg.task.k, m.embedding, m.gamma, m.dropout, m.qkv_mult
        ).to(device)
        if cfg.train.compile == "cudagraphs" and device.type != "cuda":
            raise ConfigError(
                f"train.compile=cudagraphs needs a CUDA device, and train.device={cfg.train.device} "
                f"is {device}: use train.compile=inductor or off"
            )
        self.forward = compiled(self.model, cfg.train.compile)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.optim.lr)
        self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            self.optimizer, mode="min", factor=cfg.optim.lr_factor, patience=cfg.optim.lr_patience
        )
        # The stream of training tasks, drawn on the training device: on a GPU the host never holds a step up
        # (so a CUDA run draws other tasks than a CPU run of the same seed; the validation set is the same).
        self.generator = torch.Generator(device=device).manual_seed(cfg.seed)
        self.spec = task_spec(cfg)
        self.progress = Progress()
        key = config_hash(cfg)  # the faults are None but in tests (training.faults)
        self.nan_at_step, self.crash_at_step = nan_at_step(key), crash_at_step(key)

    def state(self, run_id: str) -> dict:
        """The checkpoint: everything needed to continue bit-for-bit (loads with weights_only=True)."""
        p = self.progress
        return dict(
            model=self.model.state_dict(),
            optimizer=self.optimizer.state_dict(),
            scheduler=self.scheduler.state_dict(),
            generator=self.generator.get_state(),
            torch_rng=torch.get_rng_state(),
            cuda_rng=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            step=p.step,
            run_id=run_id,
            best_val=p.best_val,
            config=run_config(self.cfg),
            window=p.window,
            history=p.history,
            metrics=p.metrics,
        )

    def restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        try:
            self.generator.set_state(state["generator"])
        except RuntimeError:  # a CPU generator's state does not fit a CUDA one, nor the other way round
            raise CheckpointError(
                f"the checkpoint's task stream was drawn on another kind of device than "
                f"train.device={self.cfg.train.device} ({self.device}): resume it on the kind "
                "it started on, or start over with train.resume=never"
            ) from None
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self.progress = Progress(
            state["step"], state["best_val"], list(state["window"]), state["history"], state["metrics"]
        )

    def draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Start the next step: its batch of tasks (X, C0) from this model's own stream."""
        if self.progress.step + 1 == self.crash_at_step:
            raise InjectedCrash(f"test-only crash before step {self.crash_at_step}")
        self.progress.step += 1
        X, C0 = sample_tasks(self.spec, self.cfg.train.batch, self.generator)
        return X.to(self.device), C0.to(self.device)

    def loss(self, X: torch.Tensor, C1: torch.Tensor) -> torch.Tensor:
        """The step's loss for the model's new centers C1."""
        loss = smoothed_objective(X, C1, self.cfg.loss.tau, self.cfg.loss.regularizer).mean()
        if self.progress.step == self.nan_at_step:
            loss = loss * math.nan  # test-only fault: exercises divergence handling
        return loss

    def step(self) -> tuple[float, float]:
        """One optimizer step; returns the loss and the sum of all parameters."""
        X, C0 = self.draw()
        return update([self], [self.loss(X, self.forward(X, C0))])[0]

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]


def update(trainers: list[Trainer], losses: list[torch.Tensor]) -> list[tuple[float, float]]:
    """Backpropagate each trainer's loss and step its optimizer; returns (loss, sum of parameters) per trainer."""
    for t in trainers:
        t.optimizer.zero_grad(set_to_none=True)
    loss = torch.stack(losses)
    # The models are independent, so the gradient of the sum is each model's own gradient.
    loss.sum().backward()
    for t in trainers:
        t.optimizer.step()
    # A non-finite parameter anywhere makes its model's sum non-finite.
    totals = torch.stack(
        [torch.stack([p.detach().sum() for p in t.model.parameters()]).sum() for t in trainers]
    )
    # One device sync per step: NaN parameters must not reach the next forward
    # pass (sparsemax of NaNs indexes out of bounds; on CUDA a device assert).
    return [(a, b) for a, b in torch.stack([loss.detach(), totals], 1).tolist()]


Step = Callable[[list[Trainer]], list[tuple[float, float]]]  # one optimizer step of each model: (loss, sum)


def solo_step(trainers: list[Trainer]) -> list[tuple[float, float]]:
    """The step of models trained alone (a pack of one): each its own Trainer.step."""
    return [t.step() for t in trainers]


@dataclass
class Run:
    """One model in the training loop, with where it records."""

    trainer: Trainer
    validation: Validation
    recorder: Recorder
    workdir: Path
    run_id: str
    result: TrainResult | None = None


def open_run(cfg: DictConfig, recorder: Recorder, workdir: Path) -> Run:
    """Resume from workdir's checkpoints (training.checkpoint) or start afresh, and open the recorder's run."""
    validate(cfg)
    torch.set_num_threads(cfg.train.threads)  # CPU sums depend on the thread count: fixed by the config
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    resume = checkpoint.resume_state(workdir, cfg.train.resume, run_config(cfg))
    trainer = Trainer(cfg, pick_device(cfg.train.device))
    if resume.state:
        trainer.restore(resume.state)
    tags = {
        CONFIG_HASH: config_hash(cfg),
        SEED: str(cfg.seed),
        GIT_COMMIT: git_commit(),
        **training_tags(cfg),
    }
    run_id = recorder.start(run_name(cfg), flat_params(cfg), tags, run_id=resume.run_id)
    if resume.damaged:
        recorder.set_tags({BAD_CHECKPOINT: resume.damaged})
    checkpoint.remember_run(workdir, run_id)
    if not resume.state:
        (workdir / CONFIG_ARTIFACT).write_text(OmegaConf.to_yaml(cfg))
        recorder.log_artifact(workdir / CONFIG_ARTIFACT)
    return Run(trainer, Validation(cfg, trainer.device), recorder, workdir, run_id)


def train(cfg: DictConfig, recorder: Recorder, workdir: Path, on_eval: OnEval | None = None) -> TrainResult:
    """Train one configuration, resuming from workdir/last.pt when it holds an unfinished run."""

    def each(step: int, evaluated: dict[Path, dict]) -> None:
        for path, metrics in evaluated.items():
            on_eval(step, metrics, path)

    return train_models([cfg], [recorder], [Path(workdir)], solo_step, each if on_eval else None)[0]


def train_models(
    cfgs: list[DictConfig],
    recorders: list[Recorder],
    workdirs: list[Path],
    step: Step,
    on_eval: OnRound | None = None,
) -> list[TrainResult]:
    """The training loop: result i is what model i trained alone would give (training.packed: to 1e-5).

    step(trainers) takes one optimizer step of each model (solo_step, or
    training.packed.packed_step). A model that diverges is closed and leaves;
    the others go on. on_eval(step, {workdir: metrics}) is called after each
    round of evaluations (the models step together, so they evaluate
    together), when every evaluated model's checkpoint is written.
    """
    runs: list[Run] = []
    try:
        for cfg, recorder, workdir in zip(cfgs, recorders, workdirs):
            runs.append(open_run(cfg, recorder, workdir))
        fresh = [run for run in runs if run.trainer.progress.step == 0]
        for run in fresh:
            evaluate(run)
        tell(on_eval, fresh)
        active = [run for run in runs if run.trainer.progress.step < run.trainer.cfg.train.steps]
        bar = tqdm(
            total=cfgs[0].train.steps,
            initial=min((r.trainer.progress.step for r in active), default=0),
            desc="train",
            disable=not sys.stderr.isatty(),
            dynamic_ncols=True,
        )
        while active:
            losses = step([run.trainer for run in active])
            tell(on_eval, [run for run, (loss, total) in zip(active, losses) if after_step(run, loss, total)])
            for run in active:
                if run.result is None and run.trainer.progress.step >= run.trainer.cfg.train.steps:
                    close(run, FINISHED)
            show(bar, active[0].trainer)
            active = [run for run in active if run.result is None]
        bar.close()
    except (
        BaseException
    ) as err:  # a crash or Ctrl-C: every unfinished run stays resumable from its checkpoint
        for run in runs:
            if run.result is None:
                run.recorder.finish("KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED")
        raise
    return [run.result for run in runs]


def after_step(run: Run, loss: float, total: float) -> bool:
    """Record one model's step: divergence, the train_loss window, an evaluation when due (True if it evaluated)."""
    t, p = run.trainer.cfg.train, run.trainer.progress
    if not (math.isfinite(loss) and math.isfinite(total)):
        close(run, DIVERGED)
        return False
    p.window.append(loss)
    if p.step % t.log_every == 0:
        mean = sum(p.window) / len(p.window)
        run.recorder.log_metrics(p.step, {TRAIN_LOSS: mean})
        p.history.setdefault(TRAIN_LOSS, []).append([p.step, mean])
        p.window = []
    due = p.step % t.eval_every == 0 or p.step == t.steps
    if due:
        evaluate(run)
    return due


def tell(on_eval: OnRound | None, evaluated: list[Run]) -> None:
    if on_eval is not None and evaluated:
        on_eval(
            min(run.trainer.progress.step for run in evaluated),
            {run.workdir: run.trainer.progress.metrics for run in evaluated},
        )


def show(bar: tqdm, trainer: Trainer) -> None:
    """Advance the progress bar; at each train_loss point, show the (first) model's figures."""
    bar.update(1)
    p = trainer.progress
    if p.step % trainer.cfg.train.log_every == 0 and TRAIN_LOSS in p.history:
        bar.set_postfix(
            loss=f"{p.history[TRAIN_LOSS][-1][1]:.4g}",
            val=f"{p.metrics[VAL_REL_LLOYD]:.4f}",
            lr=f"{trainer.lr:.2g}",
            refresh=False,
        )


def evaluate(run: Run) -> None:
    """Validate, step the scheduler, record, then checkpoint (metrics flushed first, so a resume never loses any)."""
    trainer, p = run.trainer, run.trainer.progress
    metrics = {**run.validation(trainer.model), LR: trainer.lr}
    trainer.scheduler.step(metrics[VAL_REL_LLOYD])
    run.recorder.log_metrics(p.step, {**metrics, BEST_VAL_REL_LLOYD: min(p.best_val, metrics[VAL_REL_LLOYD])})
    run.recorder.flush()
    p.metrics = metrics
    for key in (VAL_KMEANS, VAL_REL_LLOYD, LR):
        p.history.setdefault(key, []).append([p.step, metrics[key]])
    improved = metrics[VAL_REL_LLOYD] < p.best_val
    if improved:
        p.best_val = metrics[VAL_REL_LLOYD]
    state = trainer.state(run.run_id)
    checkpoint.save(state, checkpoint.last_path(run.workdir))
    if improved:
        checkpoint.save(state, checkpoint.best_path(run.workdir))


def close(run: Run, outcome: str) -> None:
    """Store checkpoints and curves, tag the outcome, end the run with its result."""
    p, diverged = run.trainer.progress, outcome == DIVERGED
    run.recorder.flush()
    for path in (checkpoint.best_path(run.workdir), checkpoint.last_path(run.workdir)):
        if path.exists():
            run.recorder.log_artifact(path, CHECKPOINT_DIR)
    plot_curves(p.history, run.workdir / CURVE_ARTIFACT)
    run.recorder.log_artifact(run.workdir / CURVE_ARTIFACT)
    run.recorder.set_tags({OUTCOME: outcome, **({DIVERGED_AT: str(p.step)} if diverged else {})})
    run.recorder.finish("FAILED" if diverged else "FINISHED")
    run.result = TrainResult(outcome, p.step, p.metrics, p.best_val, run.run_id, p.step if diverged else None)


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
