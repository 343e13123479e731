"""The fused step of a pack: P models of one shape trained as one (a solo run is a pack of one).

Each model keeps what it has alone: its own initialisation, learning rate and
ReduceLROnPlateau schedule (host-side, at evaluations), Adam state, task
stream, validation set, loss (tau, regularizer) and divergence. What the pack
shares is the work: the weights live stacked for the life of the pack
(models.stacked), one vectorised loss covers all models, one Adam update
(training.adam) steps them all, and the host reads the models' numbers back
only when the loop needs them (Pack.due: a train_loss point, an evaluation).

A model whose loss or weights turn non-finite is masked on the device from
that step on: its update is not committed, so its weights stay finite and no
NaN reaches the next forward pass (sparsemax of NaNs indexes out of bounds),
and the step is kept on the device for the next read-back to record.

Task draws: every chunk steps each model draws chunk steps' tasks at once
from its own generator, so the Python cost per step does not grow with the
number of models. chunk divides train.eval_every, so checkpoints sit on chunk
boundaries and a resumed run draws what the uninterrupted one drew.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Callable

import torch

from models import flash_dropout
from models.losses import kmeans_objective, regularized_weights, sq_distances
from models.stacked import StackedTransformer, stacked_forward
from tasks.sampler import OK, draw_each, raise_if_bad
from tracking.names import VAL_KMEANS, VAL_REL_LLOYD
from training.adam import PackedAdam
from training.host_memory import keep_freed_memory

if TYPE_CHECKING:
    from training.trainer import Trainer, Validation

# The stacked weights and their gradients are views into flat (P, N) tensors (models.stacked); autograd warns
# that such strided views miss its preferred layout, then adds into them in place as intended.
warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout contract")

# At most this many task coordinates per model per chunk, by device type. CPU: 4 MB of float32, which
# stays in cache while the chunk is used. CUDA: 32 MB, so that the paper's n 512, d 32 draws 10 steps at
# once (a pack of 100: 2 GB), not 2, and the draws' kernel launches are spread over more steps. Chunks set
# the task stream, so a run draws the same tasks on every device of one type.
CHUNK_VALUES = {"cpu": 2**20, "cuda": 2**23}


def chunk_steps(eval_every: int, batch: int, n: int, d: int, device: str = "cpu") -> int:
    """Steps of tasks a model draws at once: the largest divisor of eval_every within CHUNK_VALUES[device]
    (the CPU's for other device types)."""
    per_step, cap = batch * n * d, CHUNK_VALUES.get(device, CHUNK_VALUES["cpu"])
    return max(c for c in range(1, eval_every + 1) if eval_every % c == 0 and (c == 1 or c * per_step <= cap))


def compiled(forward: Callable, mode: str) -> Callable:
    """train.compile: the training step's forward pass through torch.compile, or as is (off); evaluation
    stays eager (models.stacked.StackedTransformer.forward).

    Off by default: on CPU at the paper config inductor gained 5% per step at
    dropout 0 and lost 8% at dropout 0.01, after 35-50 s of compiling
    (python -m bench step, compile=...); on fused packs at the laptop size
    (n 128, d 4, k 6, 1 thread) it gained 9% / 10% / 2% at P 1 / 10 / 30 at
    dropout 0 and lost 23% / 4% / 4% at dropout 0.01, after 20-30 s of
    compiling per new pack size (warm cache; minutes cold). cudagraphs
    (inductor plus CUDA graphs) targets GPUs, where tiny models wait on kernel
    launches. Compiled kernels round differently, so the mode is part of the
    configuration.
    """
    if mode == "off":
        return forward
    flash_dropout.keep_eager_under_compile()
    if mode == "aot_eager":  # graph capture and autograd tracing without code generation
        return torch.compile(forward, backend="aot_eager")
    return torch.compile(forward, mode="reduce-overhead" if mode == "cudagraphs" else None)


# A step hook sees each step's losses (P,) before the update, with the models' config hashes and the step
# each takes, and returns the losses to train on: the test-only faults (training.faults.Faults).
StepHook = Callable[[list[str], list[int], torch.Tensor], torch.Tensor]

_COMPILED: dict[
    str, Callable
] = {}  # train.compile mode -> stacked_forward through it, compiled once per process


class Pack:
    """The models of `trainers` (training.trainer.Trainer, one shape: training.packed.SHARED_KEYS) as one.

    Built from the trainers' current state (fresh or restored); Pack.store writes
    a model's state back into its trainer, for its checkpoint. `validations`
    (training.trainer.Validation, one per trainer) are needed only by validate;
    `hook` (tests only: training.faults) sees every step's losses.
    """

    def __init__(
        self,
        trainers: list[Trainer],
        validations: list[Validation] | None = None,
        hook: StepHook | None = None,
    ) -> None:
        keep_freed_memory()  # a step's host memory is reused, not faulted in again (training.host_memory)
        self.trainers = list(trainers)
        cfg, device = trainers[0].cfg, trainers[0].device
        t = cfg.train
        self.batch, self.log_every, self.eval_every, self.steps = t.batch, t.log_every, t.eval_every, t.steps
        self.chunk = chunk_steps(t.eval_every, t.batch, cfg.task.n, cfg.task.d, device.type)
        if t.compile not in _COMPILED:
            _COMPILED[t.compile] = compiled(stacked_forward, t.compile)

        def column(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        # What each model keeps alone, a row per model, then the weights and Adam state the pack steps as one.
        self.tau = column([tr.cfg.loss.tau for tr in trainers], torch.float32).view(-1, 1, 1, 1)
        self.starts = [tr.progress.step for tr in trainers]  # each model's step is its start + self.taken
        self.offsets = sorted(set(self.starts))  # one, but after resuming from different checkpoints
        self.taken = 0
        self.step_of = column(self.starts, torch.int64)  # on the device: the step each model is at
        self.alive = column([True] * len(trainers), torch.bool)
        self._group_by_regularizer()
        self.diverged_at = column([0] * len(trainers), torch.int64)  # 0: has not diverged
        self.drawn = column([OK] * len(trainers), torch.int64)  # the first bad draw's code (tasks.sampler)
        self.hook = hook
        self.pending: list[torch.Tensor] = []  # each step's (P,) losses since the last read-back
        self.tasks: list[torch.Tensor] = []  # the chunk's X (chunk, P, B, n, d) and C0 (chunk, P, B, k, d)
        self.validation = None if validations is None else self._stack_validation(validations)
        self.stacked = StackedTransformer([tr.model for tr in trainers])
        self.stacked.forward_fn = _COMPILED[t.compile]
        self.adam = PackedAdam(self.stacked.flat, [tr.lr for tr in trainers])
        for row, tr in enumerate(trainers):
            self.adam.load(row, tr.adam)

    def __len__(self) -> int:
        return len(self.trainers)

    @staticmethod
    def _stack_validation(validations: list[Validation]) -> list[tuple[torch.Tensor, ...]]:
        """Batch i of every model's validation set, stacked: X (P, B, n, d), C (P, B, k, d), Lloyd (P, B)."""
        return [
            tuple(torch.stack(parts) for parts in zip(*[(*v.batches[i], v.lloyd[i]) for v in validations]))
            for i in range(len(validations[0].batches))
        ]

    def step(self) -> None:
        """One optimizer step of every model, without reading anything back to the host."""
        at = self.taken % self.chunk
        if at == 0:
            self._draw()
        X, C0 = self.tasks[0][at], self.tasks[1][at]
        self.taken += 1
        self.step_of += 1
        loss = self._loss(X, self.stacked.forward(X, C0))
        if self.hook:  # tests only
            loss = self.hook([tr.run_spec.key for tr in self.trainers], self.now(), loss)
        self.stacked.grad.zero_()
        # The models are independent, so the gradient of the sum is each model's own gradient.
        loss.sum().backward()
        proposal = self.adam.propose(self.stacked.flat, self.stacked.grad)
        # A non-finite weight anywhere makes its model's sum non-finite.
        ok = self.alive & torch.isfinite(loss.detach() + proposal[0].sum(1))
        self.diverged_at = torch.where(self.alive & ~ok, self.step_of, self.diverged_at)
        self.alive = ok
        self.adam.commit(self.stacked.flat, proposal, ok)
        self.pending.append(loss.detach())

    def _draw(self) -> None:
        """The next chunk steps of tasks of every model, each from its own stream: (chunk, P, B, ...)."""
        specs, generators = [tr.spec for tr in self.trainers], [tr.generator for tr in self.trainers]
        # What is computed from the draws runs for the pack at once on a GPU (its kernel launches are what
        # it pays); on a CPU for a cache's worth of models at a time (CHUNK_VALUES), which draws as fast
        # as one model at a time where a model's chunk fills it, and faster where it does not.
        values = None if self.alive.device.type == "cuda" else CHUNK_VALUES["cpu"]
        *tasks, codes = draw_each(specs, self.chunk, self.batch, generators, values)
        self.tasks = [part.to(self.alive.device) for part in tasks]
        # Checked on the device; read back with the losses (read), so a draw never waits on the host.
        self.drawn = torch.where(self.drawn == OK, codes.to(self.drawn.device), self.drawn)

    def _loss(self, X: torch.Tensor, C1: torch.Tensor) -> torch.Tensor:
        """Each model's batch mean of its smoothed k-means surrogate (its own tau and regularizer): (P,)."""
        P, B = X.shape[:2]
        r = sq_distances(X.flatten(0, 1), C1.flatten(0, 1)).view(P, B, *X.shape[2:3], C1.shape[2])
        if len(self.rows) == 1:
            (regularizer,) = self.rows
            return (regularized_weights(r, self.tau, regularizer) * r).sum((-2, -1)).mean(-1)
        # Each model's weights by its own regularizer only: softmax and sparsemax of every model's distances
        # cost 6% of a step of the 21-model pack of `make reproduce` (18 l2, 3 ne), most of it discarded.
        parts = []
        for regularizer, rows in self.rows.items():
            r_rows = r[rows]
            w = regularized_weights(r_rows, self.tau[rows], regularizer)
            parts.append((w * r_rows).sum((-2, -1)).mean(-1))
        return torch.cat(parts)[self.order]

    def _group_by_regularizer(self) -> None:
        """self.rows: regularizer -> the rows of its models; self.order: their losses back in row order."""
        names = [tr.cfg.loss.regularizer for tr in self.trainers]
        groups = {name: [row for row, n in enumerate(names) if n == name] for name in sorted(set(names))}
        grouped = [row for rows in groups.values() for row in rows]  # loss i is that of model grouped[i]
        device = self.alive.device
        self.rows = {name: torch.tensor(rows, device=device) for name, rows in groups.items()}
        self.order = torch.tensor(sorted(range(len(grouped)), key=grouped.__getitem__), device=device)

    def due(self) -> bool:
        """Whether the loop reads back after this step: a train_loss point or an evaluation."""
        for start in self.offsets:
            s = start + self.taken
            if s % self.log_every == 0 or s % self.eval_every == 0 or s == self.steps:
                return True
        return False

    def now(self) -> list[int]:
        """The step each model is at (known on the host: no read-back)."""
        return [start + self.taken for start in self.starts]

    def read(self) -> tuple[list[list[float]], list[int], list[int]]:
        """Per model: its losses since the last read-back, the step it diverged at (0: none), its step now.

        FloatingPointError (tasks.sampler.raise_if_bad) if a model drew non-finite tasks since the last.
        """
        losses = torch.stack(self.pending, 1).tolist() if self.pending else [[] for _ in self.trainers]
        self.pending = []
        diverged_at, drawn = torch.stack([self.diverged_at, self.drawn]).tolist()
        for tr, code in zip(self.trainers, drawn):
            raise_if_bad(code, tr.spec)
        return losses, diverged_at, self.now()

    @torch.no_grad()
    def validate(self) -> list[dict[str, float]]:
        """Each model's val_kmeans and val_rel_lloyd on its own validation set, in one pass over the pack."""
        objective, ratio = [], []
        for X, C, lloyd in self.validation:
            P, B = X.shape[:2]
            C1 = self.stacked.forward(X, C, training=False)
            obj = kmeans_objective(X.flatten(0, 1), C1.flatten(0, 1)).view(P, B)
            objective.append(obj)
            ratio.append(obj / lloyd)
        means = torch.stack([torch.cat(objective, 1).mean(1), torch.cat(ratio, 1).mean(1)], 1).tolist()
        return [{VAL_KMEANS: a, VAL_REL_LLOYD: b} for a, b in means]

    def set_lrs(self) -> None:
        """Take up each trainer's learning rate (its Plateau schedule acts on the trainer's AdamState)."""
        self.adam.set_lrs([tr.lr for tr in self.trainers])

    def store(self, row: int) -> None:
        """Write model `row`'s weights and Adam state into its trainer (whose state() is the checkpoint)."""
        tr = self.trainers[row]
        self.stacked.store(row, tr.model)
        self.adam.store(row, tr.adam)

    def keep(self, rows: list[int]) -> None:
        """Go on with the models at `rows` only (the others finished or diverged)."""
        index = torch.tensor(rows, dtype=torch.int64, device=self.alive.device)
        self.stacked.keep(index)
        self.adam.keep(index)
        self.trainers = [self.trainers[r] for r in rows]
        self.starts = [self.starts[r] for r in rows]
        self.offsets = sorted(set(self.starts))
        for name in ("tau", "step_of", "alive", "diverged_at", "drawn"):
            setattr(self, name, getattr(self, name)[index])
        self._group_by_regularizer()
        self.tasks = [part[:, index] for part in self.tasks]
        if self.validation is not None:
            self.validation = [tuple(part[index] for part in batch) for batch in self.validation]
