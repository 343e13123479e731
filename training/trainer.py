"""One model's state in training: weights, Adam state, learning-rate schedule, task stream, validation set
and progress, with its checkpoint (Trainer.state, Trainer.restore).

It takes no step: training.fused.Pack steps trainers, and training.loop drives the pack; both import this
module, which imports neither.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from omegaconf import DictConfig, OmegaConf

from config.run import RunSpec
from config.schema import ConfigError
from models.lloyd import lloyd_step
from models.losses import kmeans_objective
from models.transformer import ClusteringTransformer
from tasks.sampler import TaskSpec, validation_tasks
from tracking.names import VAL_KMEANS, VAL_REL_LLOYD
from training import checkpoint
from training.adam import AdamState
from training.checkpoint import CheckpointError
from training.device import cuda_index
from training.plateau import Plateau


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


def task_spec(cfg: DictConfig) -> TaskSpec:
    return TaskSpec(**OmegaConf.to_container(cfg.task))


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
    """One model's state: weights, Adam state, learning-rate schedule, task stream and progress, of the run
    `run_spec` describes (config.run: its configuration and identity, derived once).

    It takes no step: a training.fused.Pack steps it (a pack of one when
    alone), holding its weights and Adam moments while it trains and writing
    them back here for each checkpoint (state, restore); `adam` holds the
    learning rate its `plateau` schedule sets.
    """

    def __init__(self, run_spec: RunSpec, device: torch.device) -> None:
        self.run_spec, self.device = run_spec, device
        self.cfg = cfg = run_spec.cfg  # the values it trains with
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
        # Adam's state and schedule in torch's checkpoint format, without torch's Optimizer (training.adam).
        self.adam = AdamState([p.shape for p in self.model.parameters()], cfg.optim.lr)
        self.plateau = Plateau(self.adam, cfg.optim.lr_factor, cfg.optim.lr_patience)
        # The stream of training tasks, drawn on the training device: on a GPU the host never holds a step up
        # (so a CUDA run draws other tasks than a CPU run of the same seed; the validation set is the same).
        self.generator = torch.Generator(device=device).manual_seed(cfg.seed)
        self.spec = task_spec(cfg)
        self.progress = Progress()

    def state(self, run_id: str) -> dict:
        """The checkpoint: everything needed to continue bit-for-bit (loads with weights_only=True)."""
        p = self.progress
        return dict(
            model=self.model.state_dict(),
            optimizer=self.adam.state_dict(),
            scheduler=self.plateau.state_dict(),
            generator=self.generator.get_state(),
            torch_rng=torch.get_rng_state(),
            cuda_rng=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            cuda_rng_device=self.cuda_index(),  # which of cuda_rng trained (checkpoint.cuda_rng_states)
            step=p.step,
            run_id=run_id,
            best_val=p.best_val,
            config=self.run_spec.config,
            window=p.window,
            history=p.history,
            metrics=p.metrics,
        )

    def restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.adam.load_state_dict(state["optimizer"])
        self.plateau.load_state_dict(state["scheduler"])
        try:
            self.generator.set_state(state["generator"])
        except RuntimeError:  # a CPU generator's state does not fit a CUDA one, nor the other way round
            raise CheckpointError(
                f"the checkpoint's task stream was drawn on another kind of device than "
                f"train.device={self.cfg.train.device} ({self.device}): resume it on the kind "
                "it started on, or start over with train.resume=never"
            ) from None
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] and torch.cuda.is_available():  # onto the GPUs this process has
            mapped = checkpoint.cuda_rng_states(
                state["cuda_rng"], state.get("cuda_rng_device"), torch.cuda.device_count(), self.cuda_index()
            )
            for index, rng in mapped.items():
                torch.cuda.set_rng_state(rng, index)
        self.progress = Progress(
            state["step"], state["best_val"], list(state["window"]), state["history"], state["metrics"]
        )

    def cuda_index(self) -> int | None:
        """The visible index of the GPU this model trains on; None when not on CUDA."""
        return cuda_index(self.device) if self.device.type == "cuda" else None

    @property
    def lr(self) -> float:
        return self.adam.lr
