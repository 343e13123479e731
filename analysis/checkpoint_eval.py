"""Evaluations of trained models, from their checkpoints, on fresh tasks (docs/science.md section 7).

Each evaluation takes one training run, loads one of its checkpoints
(EvalSettings.checkpoint: the last, i.e. the model as trained, by default) and
returns a tidy table: one row per (condition, method, step) with the mean
over tasks of the log k-means objective (aggregate.task_mean_log). The tasks
are fresh: drawn from a generator seeded by (EvalSettings.seed, the run's
seed, the evaluation and condition), never the training or validation
stream, and the same for every model of that seed, so models and Lloyd's
are compared on identical tasks.

`final` measures what training's validation logs, and the training loss, on fresh tasks of any n: the claims
read the d 32 runs' final values there at the paper's n 512 (eval.d32_n), whatever n they trained at.

Iterating a model T times (`multistep`) comes in three forms:
  reembed    C_{t+1} = model(X, C_t): points and current centers embedded afresh each step;
  naive      the layer applied to its own output tokens (points and centers carried, never re-embedded);
  attention  the layer alone on [X, 0] and [C_t, 0]: attention updates without the centers' codes;
and Lloyd's iterations on the same tasks.

`Evaluator` caches each result (a local CSV, and an MLflow run tagged
eval_of=<training run> in the experiment '<experiment>-evaluations'), so a
second report reads instead of recomputing.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import pandas as pd
import torch
from mlflow.artifacts import download_artifacts
from mlflow.entities import Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from tqdm import tqdm

from analysis.aggregate import task_mean_log
from cli import console, exit_codes
from config.compose import compose
from config.schema import ConfigError
from models.embedding import embed
from models.lloyd import lloyd_step
from models.losses import kmeans_objective, smoothed_objective
from models.transformer import ClusteringTransformer
from tasks.sampler import TaskSpec, sample_tasks
from tasks.spec import FAMILIES
from tracking import sqlite_guard, store
from tracking.names import (
    BEST_CHECKPOINT,
    CHECKPOINT_DIR,
    EVAL_KEY,
    EVAL_OF,
    EVALUATION,
    LAST_CHECKPOINT,
    RESULT_ARTIFACT,
    SEED,
    TRAIN_LOSS,
    VAL_KMEANS,
    VAL_REL_LLOYD,
)
from tracking.run_tags import evaluation_link
from training.device import pick_device

VERSION = 1  # bump when an evaluation's definition changes: older cached results are then ignored

METHODS = ("reembed", "naive", "attention")
LLOYD_METHOD = "lloyd"
# eval.checkpoint -> (the artifact a probe loads, what it holds). `last` by default: `best` is the model at
# its lowest val_rel_lloyd, which for a run whose validation only worsens is the untrained model of step 0.
CHECKPOINTS = {
    "last": (LAST_CHECKPOINT, "the final weights, the model as trained"),
    "best": (BEST_CHECKPOINT, "the weights at the lowest val_rel_lloyd seen, step 0 included"),
}
SHIFTS = {
    "train": {},
    "unequal_weights": {"equal_weights": False},
    "anisotropic": {"equal_scales": False},
    "scale_0.05": {"scale": 0.05},
    "scale_0.2": {"scale": 0.2},
}
# The paper tests lengths as ratios of its training length (n 512 -> 128, 256, 1024, 2048: section 4).
LENGTH_RATIOS = (0.25, 0.5, 2.0, 4.0)


@dataclass(frozen=True)
class EvalSettings:
    """Sizes of the evaluations and the checkpoint they load: the report's `eval.*` keys, whose defaults and
    meanings live in conf/report/default.yaml (`configured`; tests use small ones). All but UNKEYED are part
    of a cached result's key (Evaluator.key)."""

    seed: int
    batches: int
    batch: int
    steps: int
    inits: tuple[str, ...]
    lengths: tuple[int, ...]  # empty: each run's task.n x LENGTH_RATIOS; else these n for every run
    dissimilarity_tasks: int
    surface_points: int
    surface_span: float
    device: str
    threads: int
    max_elements: int
    checkpoint: str  # a key of CHECKPOINTS
    d32_n: int | None  # the n the claims read d 32 runs' final values at (`final`); None: the logged ones

    @classmethod
    def of(cls, values: dict) -> "EvalSettings":
        """From the composed `eval` node (lists become tuples: the settings are hashed and frozen)."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})

    @classmethod
    def configured(cls, **changes: object) -> "EvalSettings":
        """conf/report's defaults with `changes`, as the report composes them."""
        return cls.of(OmegaConf.to_container(compose([], config_name="analysis").eval) | changes)

    def __post_init__(self) -> None:
        if self.checkpoint not in CHECKPOINTS:
            raise ConfigError(
                f"eval.checkpoint={self.checkpoint!r} is not allowed: choose one of {', '.join(CHECKPOINTS)}"
            )

    def checkpoint_note(self) -> str:
        """Which checkpoint the probes used, in words (the report's header and every probe figure's notes)."""
        artifact, words = CHECKPOINTS[self.checkpoint]
        chosen = f"eval.checkpoint={self.checkpoint}: {words}"
        return f"probes load each run's `{CHECKPOINT_DIR}/{artifact}` ({chosen})"

    def torch_device(self) -> torch.device:
        return pick_device(self.device, "eval.device")


def spec_of(run: pd.Series, **changes: object) -> TaskSpec:
    """The task distribution a run trained on, with some fields changed."""
    kinds = {
        "family": str,
        "n": int,
        "d": int,
        "k": int,
        "scale": float,
        "equal_weights": bool,
        "equal_scales": bool,
        "init": str,
    }
    fields = {f: run[f"task.{f}"] for f in kinds} | changes
    return TaskSpec(
        **{f: kind(fields[f]) for f, kind in kinds.items()}
    )  # plain Python values, not numpy scalars


def fresh_tasks(
    spec: TaskSpec, settings: EvalSettings, seed: int, stream: str
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """settings.batches batches of fresh tasks, fixed by (settings.seed, seed, stream)."""
    key = zlib.crc32(f"{settings.seed}/{seed}/{stream}".encode())
    generator = torch.Generator().manual_seed(key)
    return [sample_tasks(spec, settings.batch, generator) for _ in range(settings.batches)]


def load_model(
    client: MlflowClient, run: pd.Series, device: torch.device, checkpoint: str
) -> ClusteringTransformer:
    """The run's `checkpoint` (a key of CHECKPOINTS) in a fresh model, in eval mode; `client`: of its store,
    opened once for every run read (tracking.store.connect checks a SQLite file at each opening)."""
    chosen = f"{CHECKPOINT_DIR}/{CHECKPOINTS[checkpoint][0]}"
    names = {a.path for a in client.list_artifacts(run["run_id"], CHECKPOINT_DIR)}
    if chosen not in names:
        raise FileNotFoundError(
            f"run {run['run_id']} has no {chosen} artifact (eval.checkpoint={checkpoint}); "
            f"it has: {', '.join(sorted(names)) or 'no checkpoints'}"
        )
    with tempfile.TemporaryDirectory() as tmp:
        path = client.download_artifacts(run["run_id"], chosen, tmp)
        state = torch.load(path, map_location="cpu", weights_only=True)
    model = ClusteringTransformer(
        int(run["task.d"]),
        int(run["task.k"]),
        str(run["model.embedding"]),
        float(run["model.gamma"]),
        0.0,
        int(run["model.qkv_mult"]),
    )
    model.load_state_dict(state["model"])
    return model.to(device).eval()


def _chunks(
    X: torch.Tensor, C: torch.Tensor, settings: EvalSettings
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Split a batch so that attention over n points stays within settings.max_elements."""
    size = max(1, settings.max_elements // (X.shape[1] ** 2))
    return list(zip(X.split(size), C.split(size)))


@torch.no_grad()
def trajectories(
    model: ClusteringTransformer | None,
    X: torch.Tensor,
    C0: torch.Tensor,
    steps: int,
    methods: tuple[str, ...],
) -> dict[str, torch.Tensor]:
    """Per method, the k-means objective of every task at steps 0..T: (T+1, B). Lloyd's always included."""
    d = X.shape[-1]
    out: dict[str, list[torch.Tensor]] = {}
    C = C0
    out[LLOYD_METHOD] = [kmeans_objective(X, C0)]
    for _ in range(steps):
        C = lloyd_step(X, C)
        out[LLOYD_METHOD].append(kmeans_objective(X, C))
    for method in methods:
        C, values = C0, [kmeans_objective(X, C0)]
        if method == "naive":
            Xt, Ct = embed(X, C0, model.embedding)
        for _ in range(steps):
            if method == "reembed":
                C = model(X, C)
            elif method == "naive":
                Xt, Ct = model.layer(Xt, Ct)
                C = Ct[..., :d]
            elif method == "attention":
                pad = lambda T: torch.cat([T, T.new_zeros(*T.shape[:-1], model.d_emb - d)], -1)  # noqa: E731
                C = model.layer(pad(X), pad(C))[1][..., :d]
            else:
                raise ValueError(f"method={method!r} is not allowed: choose one of {', '.join(METHODS)}")
            values.append(kmeans_objective(X, C))
        out[method] = values
    return {method: torch.stack(values) for method, values in out.items()}


def curve_rows(
    model, tasks, steps: int, methods: tuple[str, ...], settings: EvalSettings, **condition
) -> list[dict]:
    """Rows (condition..., method, step, value): value = mean over all tasks of log objective at that step."""
    device = settings.torch_device()
    parts: dict[str, list[torch.Tensor]] = {}
    for X, C0 in tasks:
        for Xc, Cc in _chunks(X.to(device), C0.to(device), settings):
            for method, values in trajectories(model, Xc, Cc, steps, methods).items():
                parts.setdefault(method, []).append(values.cpu())
    rows = []
    for method, values in parts.items():
        objective = torch.cat(values, dim=1)  # (T+1, all tasks)
        rows += [
            {**condition, "method": method, "step": t, "value": task_mean_log(objective[t])}
            for t in range(steps + 1)
        ]
    return rows


def multistep(model, run: pd.Series, settings: EvalSettings) -> pd.DataFrame:
    rows = []
    for init in settings.inits:
        tasks = fresh_tasks(spec_of(run, init=init), settings, run[SEED], f"multistep/{init}")
        rows += curve_rows(model, tasks, settings.steps, METHODS, settings, init=init)
    return pd.DataFrame(rows)


def mixture_shift(model, run: pd.Series, settings: EvalSettings) -> pd.DataFrame:
    rows = []
    for shift, changes in SHIFTS.items():
        tasks = fresh_tasks(spec_of(run, **changes), settings, run[SEED], f"mixture_shift/{shift}")
        rows += curve_rows(model, tasks, settings.steps, ("reembed",), settings, shift=shift)
    return pd.DataFrame(rows)


def lengths_of(run: pd.Series, settings: EvalSettings) -> tuple[int, ...]:
    """The test lengths of a run: settings.lengths when given, else its training n x LENGTH_RATIOS, bar those
    its tasks cannot have (length_left_out)."""
    return tuple(n for n in _wanted_lengths(run, settings) if n not in length_left_out(run, settings))


def length_left_out(run: pd.Series, settings: EvalSettings) -> dict[int, str]:
    """The wanted test lengths no task of the run's shape can have, each with the task check's reason: a
    small sweep's n x 1/4 may fall below k (n 16, k 6: n 4)."""
    left_out = {}
    for n in _wanted_lengths(run, settings):
        try:
            spec_of(run, n=int(n))
        except ValueError as err:
            left_out[n] = str(err)
    return left_out


def _wanted_lengths(run: pd.Series, settings: EvalSettings) -> tuple[int, ...]:
    return tuple(settings.lengths) or tuple(round(r * int(run["task.n"])) for r in LENGTH_RATIOS)


def length(model, run: pd.Series, settings: EvalSettings) -> pd.DataFrame:
    rows = []
    for n in lengths_of(run, settings):
        tasks = fresh_tasks(spec_of(run, n=int(n)), settings, run[SEED], f"length/{n}")
        rows += curve_rows(model, tasks, settings.steps, ("reembed",), settings, n=int(n))
    return pd.DataFrame(rows)


def family_transfer(model, run: pd.Series, settings: EvalSettings) -> pd.DataFrame:
    rows = []
    for family in FAMILIES:
        tasks = fresh_tasks(spec_of(run, family=family), settings, run[SEED], f"family/{family}")
        rows += curve_rows(model, tasks, settings.steps, ("reembed",), settings, test_family=family)
    return pd.DataFrame(rows)


FINAL_METRICS = (VAL_KMEANS, VAL_REL_LLOYD, TRAIN_LOSS)


@torch.no_grad()
def final(model, run: pd.Series, settings: EvalSettings) -> pd.DataFrame:
    """A row per metric of FINAL_METRICS, on fresh tasks of the run's task spec: val_kmeans and val_rel_lloyd
    as training's validation computes them (training.trainer.Validation: the mean over tasks of the objective
    after one model step, and of its ratio to one Lloyd step's) and train_loss, the mean surrogate at the
    run's tau and regularizer (the loss it trained on)."""
    device = settings.torch_device()
    tau, regularizer = float(run["loss.tau"]), str(run["loss.regularizer"])
    parts: dict[str, list[torch.Tensor]] = {metric: [] for metric in FINAL_METRICS}
    for X, C0 in fresh_tasks(spec_of(run), settings, run[SEED], f"final/{run['task.n']}"):
        for Xc, Cc in _chunks(X.to(device), C0.to(device), settings):
            centers = model(Xc, Cc)
            objective = kmeans_objective(Xc, centers)
            parts[VAL_KMEANS].append(objective)
            parts[VAL_REL_LLOYD].append(objective / kmeans_objective(Xc, lloyd_step(Xc, Cc)))
            parts[TRAIN_LOSS].append(smoothed_objective(Xc, centers, tau, regularizer))
    return pd.DataFrame(
        [{"metric": metric, "value": torch.cat(values).mean().item()} for metric, values in parts.items()]
    )


def filter_normalized_direction(
    model: torch.nn.Module, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """A random direction, each weight row scaled to that row's norm (Li et al., 2018); biases get none."""
    direction = {}
    for name, p in model.named_parameters():
        if p.dim() < 2:
            direction[name] = torch.zeros_like(p)
            continue
        r = torch.randn(p.shape, generator=generator).to(p)
        direction[name] = r * (p.norm(dim=-1, keepdim=True) / r.norm(dim=-1, keepdim=True).clamp(min=1e-12))
    return direction


@torch.no_grad()
def loss_surface(model, run: pd.Series, settings: EvalSettings) -> pd.DataFrame:
    """The training loss on fresh tasks at weights + a*u + b*v, an a, b grid around the trained weights."""
    device = settings.torch_device()
    generator = torch.Generator().manual_seed(zlib.crc32(f"{settings.seed}/{run[SEED]}/surface".encode()))
    u, v = filter_normalized_direction(model, generator), filter_normalized_direction(model, generator)
    tasks = [
        (X.to(device), C.to(device))
        for X, C in fresh_tasks(spec_of(run), settings, run[SEED], "loss_surface")
    ]
    base = {name: p.detach().clone() for name, p in model.named_parameters()}
    grid = torch.linspace(-settings.surface_span, settings.surface_span, settings.surface_points).tolist()
    tau, regularizer = float(run["loss.tau"]), str(run["loss.regularizer"])
    rows = []
    for a in grid:
        for b in grid:
            params = {name: base[name] + a * u[name] + b * v[name] for name in base}
            losses = [
                smoothed_objective(X, torch.func.functional_call(model, params, (X, C)), tau, regularizer)
                for X, C in tasks
            ]
            rows.append({"alpha": a, "beta": b, "value": float(torch.cat(losses).mean())})
    return pd.DataFrame(rows)


EVALUATIONS: dict[str, Callable[[ClusteringTransformer, pd.Series, EvalSettings], pd.DataFrame]] = {
    "multistep": multistep,
    "mixture_shift": mixture_shift,
    "length": length,
    "family_transfer": family_transfer,
    "loss_surface": loss_surface,
    "final": final,
}
# Settings no cached table depends on: where and how fast it is computed, and d32_n, which reaches an
# evaluation as the n it is asked for (Evaluator.__call__), part of that table's key.
UNKEYED = ("device", "threads", "max_elements", "d32_n")


class Evaluator:
    """Runs an evaluation of a training run once; later calls read the cached table.

    Tables are cached under reports/ and, when the store is writable, logged to it as evaluation runs; a
    table cached under reports/ that the store lacks (it refused the table then, held by another process, or
    it is a copy made before) is logged the next time it is read, not computed again.
    """

    def __init__(self, uri: str, experiment: str, settings: EvalSettings, cache_dir: Path) -> None:
        self.uri, self.settings, self.cache_dir = uri, settings, cache_dir
        self.experiment = f"{experiment}-evaluations"
        self.client = store.connect(uri, write=False)
        self.store_results = sqlite_guard.writable(uri)  # a read-only store: cached under reports/ only
        self._logged: dict[str, str] | None = None
        self._read: dict[Path, pd.DataFrame] = {}  # tables this report already has: the claims reuse them
        cache_dir.mkdir(parents=True, exist_ok=True)

    def key(self, name: str, run_id: str, n: int | None = None) -> str:
        settings = {k: v for k, v in asdict(self.settings).items() if k not in UNKEYED}
        at = [n] if n is not None else []  # a table at the training n keeps the key it always had
        text = json.dumps([VERSION, name, run_id, settings, *at], sort_keys=True, default=list)
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def __call__(self, name: str, run: pd.Series, n: int | None = None) -> pd.DataFrame:
        """Evaluation `name` of a training run (cached), on tasks of its training n or of `n`."""
        key = self.key(name, run["run_id"], n)
        if n is not None:
            run = run.copy()
            run["task.n"] = n
        local = self.cache_dir / f"{name}-{key}.csv"
        if local not in self._read:
            self._read[local] = self._table(name, key, local, run)
        return self._read[local].copy()  # callers add columns to theirs

    def each(
        self, runs: pd.DataFrame, wanted: list[tuple[str, str, int | None]]
    ) -> dict[tuple[str, str, int | None], pd.DataFrame | Exception]:
        """Each wanted evaluation (name, run_id, n) of these runs, or the error that stopped it: raised again
        where a figure or claim reads it, so each says why it is missing (a run without its checkpoint; tasks
        of an n the run cannot have, n < k) and one that fails still fails alone, as when it evaluated for
        itself."""
        rows = runs.set_index("run_id", drop=False)
        found: dict[tuple[str, str, int | None], pd.DataFrame | Exception] = {}
        # A bar on a terminal only: in a log file a line per evaluation would drown the report's lines.
        bar = tqdm(wanted, desc="evaluations", unit="run", leave=False, disable=console.lines_not_bars())
        for want in bar:
            name, run_id, n = want
            try:
                found[want] = self(name, rows.loc[run_id], n=n)
            except Exception as err:  # noqa: BLE001 (kept, and raised where it is read)
                found[want] = err
        return found

    def _table(self, name: str, key: str, local: Path, run: pd.Series) -> pd.DataFrame:
        if local.exists():
            table = pd.read_csv(local)
            if self.store_results and key not in self.logged():  # a store that refused it then, or a copy
                self._record(name, key, run, table)
            return table
        if key in self.logged():
            with tempfile.TemporaryDirectory() as tmp:
                path = download_artifacts(
                    run_id=self.logged()[key],
                    artifact_path=RESULT_ARTIFACT,
                    dst_path=tmp,
                    tracking_uri=self.uri,
                )
                table = pd.read_csv(path)
        else:
            checkpoint = (
                "last" if name == "final" else self.settings.checkpoint
            )  # final: the model as trained
            model = load_model(self.client, run, self.settings.torch_device(), checkpoint)
            threads = torch.get_num_threads()
            torch.set_num_threads(self.settings.threads)
            try:
                table = EVALUATIONS[name](model, run, self.settings)
            finally:
                torch.set_num_threads(threads)
            if self.store_results:
                self._record(name, key, run, table)
        table.to_csv(local, index=False)
        return table

    def logged(self) -> dict[str, str]:
        """eval_key -> evaluation run id, for every finished evaluation run (one paginated search)."""
        if self._logged is None:
            found = store.find_experiment(self.client, self.experiment)
            runs = store.search(self.client, [found], "attributes.status = 'FINISHED'") if found else []
            self._logged = {r.data.tags[EVAL_KEY]: r.info.run_id for r in runs if EVAL_KEY in r.data.tags}
        return self._logged

    def _record(self, name: str, key: str, run: pd.Series, table: pd.DataFrame) -> None:
        """Log the evaluation to the store; where the store refuses (another process holds a SQLite file's
        lock past its timeout, a server away) the report goes on with its tables under reports/ alone,
        saying so once, rather than waiting again at each evaluation."""
        try:
            self._log(name, key, run, table)
        except MlflowException as err:
            self.store_results = False
            why = exit_codes.explained(err) or str(err).splitlines()[0]  # the store's own words, when named
            print(f"report: the evaluations are kept under {self.cache_dir} only: {why}", file=sys.stderr)

    def _log(self, name: str, key: str, run: pd.Series, table: pd.DataFrame) -> None:
        exp_id = store.ensure_experiment(self.client, self.experiment)
        tags = {
            EVAL_OF: run["run_id"],
            EVALUATION: name,
            EVAL_KEY: key,
            "mlflow.runName": f"{name}-{run['run_name']}",
        }
        eval_run = self.client.create_run(exp_id, tags=tags)
        rid = eval_run.info.run_id
        try:
            params = {k: str(v) for k, v in asdict(self.settings).items()}
            self.client.log_batch(rid, params=[Param(k, v[:6000]) for k, v in params.items()])
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / RESULT_ARTIFACT
                table.to_csv(path, index=False)
                self.client.log_artifact(rid, str(path))
        except BaseException:
            self.client.set_terminated(rid, "FAILED")
            raise
        self.client.set_terminated(rid, "FINISHED")
        self.client.set_tag(run["run_id"], *evaluation_link(name, rid))
        self.logged()[key] = rid
