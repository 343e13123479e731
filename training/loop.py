"""The training loop (docs/science.md section 5); its command line is sweeper.train.

Adam on the batch mean of the smoothed k-means surrogate of the model's
one-step centers; every train.eval_every steps the fixed validation set gives
val_kmeans and val_rel_lloyd, ReduceLROnPlateau steps on val_rel_lloyd, and a
checkpoint is written, from which the same command resumes after a crash.

One loop (train_models) trains a list of models on one code path: alone, a
pack of one (train); packed, several that share one fused step
(training.fused, training.packed). Each model's state is a training.trainer.Trainer.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from cli.credentials import masked
from config.identity import config_hash
from config.run import RunSpec
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
from tracking.run_tags import training_tags
from training import checkpoint
from training.determinism import set_deterministic, warn_if_compiled
from training.device import gpu_model, pick_device
from training.faults import from_environment
from training.fused import Pack, StepHook
from training.trainer import Trainer, Validation

OnEval = Callable[[int, dict, Path], None]  # train(): (step, metrics, workdir) after each evaluation
OnRound = Callable[[int, dict[Path, dict]], None]  # train_models(): (step, {workdir: metrics}) per round


NON_FINITE = "non-finite loss or parameters"  # TrainResult.cause of a run the pack stopped


@dataclass
class TrainResult:
    outcome: str  # metrics.FINISHED or metrics.DIVERGED
    step: int  # last step taken (the diverging one for a diverged run)
    metrics: dict[str, float]  # the last evaluation: val_kmeans, val_rel_lloyd, lr
    best_val: float  # lowest val_rel_lloyd seen
    run_id: str
    diverged_at: int | None = None
    cause: str = ""  # why a diverged run diverged, in words: NON_FINITE or its final objective past n * d


def default_workdir(cfg: DictConfig) -> Path:
    """Where the CLI checkpoints a run: restarting the same command finds it again."""
    return Path(cfg.train.workdir) / config_hash(cfg)


@dataclass
class Run:
    """One model in the training loop, with where it records."""

    trainer: Trainer
    recorder: Recorder
    workdir: Path
    run_id: str
    result: TrainResult | None = None


def open_run(spec: RunSpec, recorder: Recorder, workdir: Path) -> Run:
    """Resume from workdir's checkpoints (training.checkpoint) or start afresh, and open the recorder's
    run."""
    cfg = spec.cfg
    device = pick_device(cfg.train.device)
    gpu = gpu_model(device)
    torch.set_num_threads(cfg.train.threads)  # CPU sums depend on the thread count: fixed by the config
    set_deterministic(cfg.train.deterministic)  # before the run's first CUDA operation
    warn_if_compiled(cfg.train.compile, cfg.train.deterministic, device)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    resume = checkpoint.resume_state(workdir, cfg.train.resume, spec.config)
    trainer = Trainer(spec, device)
    if resume.state:
        trainer.restore(resume.state)
    tags = {CONFIG_HASH: spec.key, SEED: str(cfg.seed), GIT_COMMIT: git_commit(), **training_tags(spec, gpu)}
    run_id = recorder.start(spec.name, spec.params, tags, run_id=resume.run_id)
    if resume.damaged:
        recorder.set_tags({BAD_CHECKPOINT: resume.damaged})
    checkpoint.remember_run(workdir, run_id)
    if not resume.state:
        (workdir / CONFIG_ARTIFACT).write_text(OmegaConf.to_yaml(masked(cfg)))  # a record: no credential
        recorder.log_artifact(workdir / CONFIG_ARTIFACT)
    return Run(trainer, recorder, workdir, run_id)


def train(
    cfg: DictConfig,
    recorder: Recorder,
    workdir: Path,
    on_eval: OnEval | None = None,
    hook: StepHook | None = None,
) -> TrainResult:
    """Train one configuration, resuming from workdir/last.pt when it holds an unfinished run; `hook` as
    train_models'."""

    def each(step: int, evaluated: dict[Path, dict]) -> None:
        for path, metrics in evaluated.items():
            on_eval(step, metrics, path)

    return train_models([cfg], [recorder], [Path(workdir)], each if on_eval else None, hook)[0]


def train_models(
    cfgs: list[DictConfig],
    recorders: list[Recorder],
    workdirs: list[Path],
    on_eval: OnRound | None = None,
    hook: StepHook | None = None,
) -> list[TrainResult]:
    """The training loop: result i is what model i trained alone would give (training.packed: to 1e-5).

    The models step together as one pack (training.fused.Pack). The host reads
    their losses and divergences back only at train_loss points and
    evaluations; a model whose loss or weights turned non-finite is closed
    there, at the step it diverged, and leaves; the others go on. Every other
    model trains to train.steps, and its final evaluation decides: past
    objective_bound it is diverged, else finished (a blow-up it came back from
    leaves it finished at its worse final value). on_eval(step, {workdir: metrics})
    is called after each round of evaluations (the models step together, so
    they evaluate together), when every evaluated model's checkpoint is written.
    hook: the test-only faults of training.faults, given or set in the environment; None in real training.
    """
    runs: list[Run] = []
    try:
        for cfg, recorder, workdir in zip(cfgs, recorders, workdirs):
            runs.append(open_run(RunSpec.of(cfg), recorder, workdir))  # validated, its identity derived
        active = [run for run in runs if run.trainer.progress.step < run.trainer.cfg.train.steps]
        if active:
            step_pack(active, on_eval, hook, cfgs[0].train.steps)
    except BaseException as err:
        # A crash or Ctrl-C: every unfinished run stays resumable from its checkpoint.
        for run in runs:
            if run.result is None:
                run.recorder.finish("KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED")
        raise
    return [run.result for run in runs]


def step_pack(active: list[Run], on_eval: OnRound | None, hook: StepHook | None, steps: int) -> None:
    """Step the unfinished runs `active` together as one pack until every one is closed (train_models).

    The host reads the pack back only when it is due (a train_loss point or an evaluation); `hook` as
    train_models' (None: the environment's faults); `steps`, the first configuration's train.steps, is
    the progress bar's length.
    """
    # The pack holds the validation sets stacked: each model's own is dropped once copied in.
    pack = Pack(
        [run.trainer for run in active],
        [Validation(r.trainer.cfg, r.trainer.device) for r in active],
        hook if hook is not None else from_environment(),
    )
    fresh = [row for row, run in enumerate(active) if run.trainer.progress.step == 0]
    tell(on_eval, evaluate(pack, fresh, active))
    bar = tqdm(
        total=steps,
        initial=min(r.trainer.progress.step for r in active),
        desc="train",
        disable=not sys.stderr.isatty(),
        dynamic_ncols=True,
    )
    while active:
        pack.step()
        bar.update(1)
        if not pack.due():
            continue
        losses, diverged, now = pack.read()
        due = [row for row, run in enumerate(active) if record(run, losses[row], diverged[row], now[row])]
        tell(on_eval, evaluate(pack, due, active))
        for run in active:
            if run.result is None and run.trainer.progress.step >= run.trainer.cfg.train.steps:
                end(run)
        show(bar, active[0].trainer)
        active = still_training(pack, active)
    bar.close()


def still_training(pack: Pack, active: list[Run]) -> list[Run]:
    """The runs of `active` not yet closed; the pack goes on with their models only."""
    rows = [row for row, run in enumerate(active) if run.result is None]
    if len(rows) < len(active):
        pack.keep(rows)
    return [active[row] for row in rows]


def objective_bound(cfg: DictConfig) -> float:
    """n * d: the most any centers in the unit cube can give a task's k-means objective.

    Tasks live in the unit cube (tasks.sampler.to_unit_cube), so every point is within squared distance
    d of any center inside it. A model whose final mean validation objective exceeds this ends worse than
    every center placement in the data's own domain: it has blown up, not found a worse local minimum, and
    its run is diverged (docs/science.md, "Divergence"). A blow-up it comes back from before the end is
    not: its run ends at the worse local minimum it found.
    """
    return float(cfg.task.n * cfg.task.d)


def blown_up(metrics: dict[str, float], cfg: DictConfig) -> bool:
    """Whether an evaluation's val_kmeans leaves the range of any centers in the cube (NaN included)."""
    return not metrics[VAL_KMEANS] <= objective_bound(cfg)


def end(run: Run) -> None:
    """Close a run that trained to train.steps: diverged if its final evaluation is past objective_bound
    (or not finite), else finished."""
    cfg, metrics = run.trainer.cfg, run.trainer.progress.metrics
    if not blown_up(metrics, cfg):
        close(run, FINISHED)
        return
    bound = objective_bound(cfg)
    close(
        run, DIVERGED, f"final validation k-means objective {metrics[VAL_KMEANS]:.4g} above n*d = {bound:g}"
    )


def record(run: Run, losses: list[float], diverged_at: int, now: int) -> bool:
    """Record one model's steps since the last read-back (their losses, the step now).

    A divergence (diverged_at > 0) closes the run at that step; else the losses
    join the train_loss window, logged when due. True if an evaluation is due.
    """
    t, p = run.trainer.cfg.train, run.trainer.progress
    if diverged_at:
        p.window.extend(losses[: diverged_at - p.step - 1])
        p.step = diverged_at
        close(run, DIVERGED, NON_FINITE)
        return False
    p.window.extend(losses)
    p.step = now
    if p.step % t.log_every == 0:
        mean = sum(p.window) / len(p.window)
        run.recorder.log_metrics(p.step, {TRAIN_LOSS: mean})
        p.history.setdefault(TRAIN_LOSS, []).append([p.step, mean])
        p.window = []
    return p.step % t.eval_every == 0 or p.step == t.steps


def tell(on_eval: OnRound | None, evaluated: list[Run]) -> None:
    if on_eval is not None and evaluated:
        on_eval(
            min(run.trainer.progress.step for run in evaluated),
            {run.workdir: run.trainer.progress.metrics for run in evaluated},
        )


def show(bar: tqdm, trainer: Trainer) -> None:
    """At a train_loss point, show the (first) model's figures by the progress bar."""
    p = trainer.progress
    if p.step % trainer.cfg.train.log_every == 0 and TRAIN_LOSS in p.history:
        bar.set_postfix(
            loss=f"{p.history[TRAIN_LOSS][-1][1]:.4g}",
            val=f"{p.metrics[VAL_REL_LLOYD]:.4f}",
            lr=f"{trainer.lr:.2g}",
            refresh=False,
        )


def evaluate(pack: Pack, rows: list[int], runs: list[Run]) -> list[Run]:
    """Evaluate the models at `rows` of the pack (one validation pass over all of it); returns their runs.

    Each: step its learning-rate schedule, record, then checkpoint (metrics flushed first, so a resume
    never loses any).
    """
    if not rows:
        return []
    metrics = pack.validate()
    for row in rows:
        run = runs[row]
        trainer, p = run.trainer, run.trainer.progress
        m = {**metrics[row], LR: trainer.lr}
        trainer.plateau.step(m[VAL_REL_LLOYD])
        run.recorder.log_metrics(p.step, {**m, BEST_VAL_REL_LLOYD: min(p.best_val, m[VAL_REL_LLOYD])})
        run.recorder.flush()
        p.metrics = m
        for key in (VAL_KMEANS, VAL_REL_LLOYD, LR):
            p.history.setdefault(key, []).append([p.step, m[key]])
        improved = m[VAL_REL_LLOYD] < p.best_val
        if improved:
            p.best_val = m[VAL_REL_LLOYD]
        pack.store(row)
        state = trainer.state(run.run_id)
        checkpoint.save(state, checkpoint.last_path(run.workdir))
        if improved:
            checkpoint.save(state, checkpoint.best_path(run.workdir))
    pack.set_lrs()
    return [runs[row] for row in rows]


def close(run: Run, outcome: str, cause: str = "") -> None:
    """Store checkpoints and curves, tag the outcome, end the run with its result (a diverged one with its
    cause)."""
    p, diverged = run.trainer.progress, outcome == DIVERGED
    run.recorder.flush()
    for path in (checkpoint.best_path(run.workdir), checkpoint.last_path(run.workdir)):
        if path.exists():
            run.recorder.log_artifact(path, CHECKPOINT_DIR)
    plot_curves(p.history, run.workdir / CURVE_ARTIFACT)
    run.recorder.log_artifact(run.workdir / CURVE_ARTIFACT)
    run.recorder.set_tags({OUTCOME: outcome, **({DIVERGED_AT: str(p.step)} if diverged else {})})
    run.recorder.finish("FAILED" if diverged else "FINISHED")
    run.result = TrainResult(
        outcome, p.step, p.metrics, p.best_val, run.run_id, p.step if diverged else None, cause
    )


def plot_curves(history: dict[str, list[list[float]]], path: Path) -> None:
    """train_loss and val_rel_lloyd against step (below the dashed line beats one Lloyd step)."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state

    fig = Figure(figsize=(9, 3.5))
    left, right = fig.subplots(1, 2)
    for ax, key in ((left, TRAIN_LOSS), (right, VAL_REL_LLOYD)):
        points = history.get(key, [])
        ax.plot([s for s, _ in points], [v for _, v in points])
        ax.set_xlabel("step")
        # Placed, not fitted above the tick labels: the fitting was a third of a figure's cost.
        ax.set_title(key, y=1.0, pad=6)
    left.set_yscale("log")
    right.axhline(1.0, color="black", linestyle="--", linewidth=1, label="one Lloyd step")
    right.legend()
    # Fixed margins, not layout="constrained": every run of a sweep draws this, and the layout engine
    # more than doubled its cost (0.30 s against 0.13 s a figure).
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.14, top=0.9, wspace=0.25)
    fig.savefig(path, dpi=100)
