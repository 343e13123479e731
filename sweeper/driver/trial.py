"""One Ray Tune trial of a sweep: the same training as `python -m sweeper.train`.

A trial trains one job (config.grid.Job: a configuration at a seed) or, with
cluster.pack=seeds, the seeds of one configuration together
(training.packed.train_pack); each job is a member (sweeper.driver.work.Member) with its own MLflow run.
A trial never touches MLflow (a SQLite store must have one writer). Each
member's recorder collects what training records (a Recorded), and one
tune.report hands all of them to Tune together with the checkpoint they lead
up to, so the driver's MlflowWriter stores points and checkpoint location in
step. The trial's checkpoint is its work folder, one
subfolder per member. A trial resumes from the checkpoint Tune gives back
after a crash, or from the ones a restarted sweep found recorded in its
members' unfinished MLflow runs. A trial that reserved a GPU trains on it or
fails at its start saying why, and caps its memory at its share of the GPU
(training.gpu_share); each report carries a sample of its
process's CPU, memory and GPU (training.system_metrics) into every member's run.
"""

from __future__ import annotations

import math
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ray import tune

from cli import console
from config.compose import compose
from config.identity import config_hash
from tracking.names import VAL_REL_LLOYD

if TYPE_CHECKING:  # the driver imports this module too, and must not import torch
    from sweeper.driver.work import Work
    from training.system_metrics import SystemSampler

PAYLOAD = "mlflow"  # result key the driver pops: job key -> its Recorded since the trial's last report
STEP = "step"  # result key: the training step reported (ASHA's time axis)


class Point(NamedTuple):
    name: str
    value: float
    step: int
    timestamp: int  # ms: the time of training, not of the driver's write


class Artifact(NamedTuple):
    folder: str | None  # its artifact path in the run
    name: str
    data: bytes  # bytes, not a path: the driver may be on another node; artifacts are small


class RunStart(NamedTuple):
    name: str
    params: dict[str, str]
    tags: dict[str, str]


@dataclass
class Recorded:
    """What one job recorded since its trial's last report: what the driver writes into the job's run."""

    start: RunStart | None = None  # the run's params and first tags, once, with the first report
    points: list[Point] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    artifacts: list[Artifact] = field(default_factory=list)
    status: str | None = None  # the MLflow status once training ended (its outcome tag is in `tags`)

    def __bool__(self) -> bool:
        return bool(self.start or self.points or self.tags or self.artifacts or self.status)


class TuneRecorder:
    """A Recorder (tracking.recorder) for one job that buffers everything for the trial's next report."""

    def __init__(self) -> None:
        self.recorded = Recorded()

    def take(self) -> Recorded:
        recorded, self.recorded = self.recorded, Recorded()
        return recorded

    def start(
        self, name: str, params: dict[str, str], tags: dict[str, str], run_id: str | None = None
    ) -> str:
        # The driver owns the MLflow run (it reuses an unfinished one on restart): the id here is a stand-in.
        self.recorded.start = RunStart(name, params, tags)
        return run_id or "tune-trial"

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        self.recorded.points.extend(Point(key, float(v), step, now) for key, v in metrics.items())

    def flush(self) -> None:
        pass  # the points travel with the checkpoint in the next report

    def set_tags(self, tags: dict[str, str]) -> None:
        self.recorded.tags.update(tags)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.recorded.artifacts.append(Artifact(artifact_path, path.name, path.read_bytes()))

    def finish(self, status: str) -> None:
        self.recorded.status = status


class Reporter:
    """The trial's members and their recorders; report() sends what they all recorded in one tune.report.

    every (cluster.report_every): a round of evaluations is sent once in `every` rounds, and whenever a
    member ended; the rounds between wait in the recorders. The driver writes each report into one MLflow
    run per member, so a pack of 21 costs it a few hundred milliseconds per report. A crash resumes from
    the last report's checkpoint and replays the steps after it (deterministically; the writer drops
    points it already stored).
    """

    def __init__(
        self, members: list[str], work: Path, every: int = 1, sampler: SystemSampler | None = None
    ) -> None:
        self.work, self.every = work, every
        self.sampler = sampler  # each report carries one sample of the trial's process (system metrics)
        self.ended: set[str] = set()  # members whose end was reported: their runs take no more samples
        self.recorders = {key: TuneRecorder() for key in members}
        self.latest: dict[str, float] = {}  # member -> its last val_rel_lloyd
        self.rounds = 0  # rounds of evaluations seen; the first is sent, so runs show up at once

    def workdir(self, key: str) -> Path:
        return self.work / key

    def report(self, step: int, evaluated: dict[str, dict[str, float]], checkpoint: bool = True) -> None:
        """evaluated: member -> its metrics at this step; checkpoint: the work folder holds their state
        (False: the trial's last report, after training)."""
        for key, metrics in evaluated.items():
            value = metrics.get(VAL_REL_LLOYD, math.inf)
            self.latest[key] = value if math.isfinite(value) else math.inf  # NaN breaks schedulers
        self.rounds += 1
        ended = any(rec.recorded.status for rec in self.recorders.values())
        if checkpoint and (self.rounds - 1) % self.every and not ended:
            return
        if self.sampler is not None:
            sample = self.sampler.sample()  # the trial's process since the last report, in each member's run
            for key, rec in self.recorders.items():
                if key not in self.ended:
                    rec.log_metrics(step, sample)
        payload = {key: rec.take() for key, rec in self.recorders.items()}
        self.ended.update(key for key, recorded in payload.items() if recorded.status)
        shown = (
            {VAL_REL_LLOYD: statistics.median(self.latest.values())} if self.latest else {}
        )  # a pack's median
        ckpt = tune.Checkpoint.from_directory(str(self.work)) if checkpoint else None
        tune.report({STEP: step, **shown, PAYLOAD: payload}, checkpoint=ckpt)


def restore(work: Path, resume_from: dict[str, str | None]) -> None:
    """Make work hold exactly the trial's last reported checkpoint, or nothing.

    Files written after that report (a newer last.pt) are dropped: the metric
    points leading up to them never reached the driver, so training replays them.
    A damaged file among those copied is found when training opens it, and
    training restarts from the last good one (training.checkpoint).
    resume_from: member -> the checkpoint its unfinished MLflow run recorded (a restarted sweep).
    """
    shutil.rmtree(work, ignore_errors=True)
    retried = tune.get_checkpoint()  # set when Tune retries this trial after a failure
    sources: dict[str, list[str]] = {}  # checkpoint path -> the members resuming from it
    for key, path in resume_from.items():
        if retried or path:
            sources.setdefault(retried.path if retried else path, []).append(key)
    for path, keys in sources.items():
        checkpoint = retried or tune.Checkpoint(path)
        try:
            with checkpoint.as_directory() as found:
                if not Path(found).is_dir():  # a local checkpoint that is gone reads as its bare path
                    raise FileNotFoundError(found)
                for key in keys:
                    if (Path(found) / key).is_dir():  # absent: that model starts over
                        shutil.copytree(Path(found) / key, work / key)
            print(f"trial: resuming from checkpoint {checkpoint.path}")
        except (
            OSError
        ) as err:  # gone (pruned, or storage not shared): start over; the writer drops replayed points
            print(f"trial: cannot restore checkpoint {checkpoint.path} ({err}); starting from step 0")
            for key in keys:
                shutil.rmtree(work / key, ignore_errors=True)


def run_trial(config: dict, *, work: Work) -> None:
    """Tune's function trainable: trains the members of the trial of `work` that `config` names."""
    # Imported here, in the Ray worker: the driver imports this module for Tune, and training would make it
    # import torch (1.4 s of CPU) for nothing.
    from training.gpu_share import cap_memory, trial_device
    from training.packed import train_pack
    from training.system_metrics import SystemSampler

    console.quiet()  # this worker's Ray Train logs a line per checkpoint otherwise
    trial = work.trial_of(config)
    keys = [m.key for m in trial.members]
    cfgs = []
    for member in trial.members:
        cfgs.append(compose([*work.base, *member.overrides, f"seed={member.seed}"]))
        if config_hash(cfgs[-1]) != member.key:  # the driver's view and the trial's must be one configuration
            raise RuntimeError(
                f"trial member {member.key} composed to {config_hash(cfgs[-1])}: "
                f"base overrides {list(work.base)}"
            )
    share = cfgs[0].cluster.gpus_per_trial
    device = trial_device(cfgs[0].train.device, share)  # a reserved GPU is trained on, or the trial fails
    cap_memory(device, share)  # trials sharing a GPU keep to their shares
    reporter = Reporter(
        keys,
        Path(tune.get_context().get_trial_dir()) / "work",
        cfgs[0].cluster.report_every,
        SystemSampler(device),
    )
    restore(reporter.work, {m.key: m.resume_from for m in trial.members})
    recorders = [reporter.recorders[key] for key in keys]
    workdirs = [reporter.workdir(key) for key in keys]
    by_dir = dict(zip(workdirs, keys))
    # A pack of one trains alone: exactly the numbers of `python -m sweeper.train`.
    results = train_pack(
        cfgs,
        recorders,
        workdirs,
        on_eval=lambda step, evaluated: reporter.report(
            step, {by_dir[workdir]: metrics for workdir, metrics in evaluated.items()}
        ),
    )
    reporter.report(
        max(r.step for r in results), {}, checkpoint=False
    )  # the members' outcomes, artifacts, status
