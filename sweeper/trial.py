"""One sweep trial inside Ray Tune: the same training as `python -m sweeper.train`.

A trial trains one model or, with cluster.pack=seeds, the seeds of one
configuration together (training.packed.train_pack); each model is a
member with its own MLflow run. A trial never touches MLflow (a SQLite store
must have one writer). Each member's recorder collects what training records,
and one tune.report hands all of it to Tune, member by member, together with
the checkpoint it leads up to, so the driver's MlflowWriter stores points and
checkpoint location in step. The trial's checkpoint is its work folder, one
subfolder per member. A trial resumes from the checkpoint Tune gives back
after a crash, or from the ones a restarted sweep found recorded in its
members' unfinished MLflow runs.
"""

from __future__ import annotations

import math
import shutil
import statistics
import time
from pathlib import Path

from ray import tune

from config.compose import compose
from config.identity import config_hash
from sweeper import console
from tracking.names import VAL_REL_LLOYD
from training.packed import train_pack

PAYLOAD = "mlflow"  # result key the driver pops: member key -> what it recorded since the last report
STEP = "step"  # result key: the training step reported (ASHA's time axis)


class TuneRecorder:
    """A Recorder (tracking.recorder) for one member that buffers everything for the trial's next report."""

    def __init__(self) -> None:
        self.payload: dict = {}

    def take(self) -> dict:
        payload, self.payload = self.payload, {}
        return payload

    def start(
        self, name: str, params: dict[str, str], tags: dict[str, str], run_id: str | None = None
    ) -> str:
        # The driver owns the MLflow run (it reuses an unfinished one on restart), so the id here is a
        # stand-in.
        self.payload["start"] = {"name": name, "params": params, "tags": tags}
        return run_id or "tune-trial"

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)  # the time of training, not of the driver's write
        self.payload.setdefault("points", []).extend([key, float(v), step, now] for key, v in metrics.items())

    def flush(self) -> None:
        pass  # the points travel with the checkpoint in the next report

    def set_tags(self, tags: dict[str, str]) -> None:
        self.payload.setdefault("tags", {}).update(tags)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        # Bytes, not a path: the driver may be on another node. Artifacts are small (config, two checkpoints,
        # a PNG).
        self.payload.setdefault("artifacts", []).append([artifact_path, path.name, path.read_bytes()])

    def finish(self, status: str) -> None:
        self.payload["status"] = status


class Reporter:
    """The trial's members and their recorders; report() sends what all of them recorded in one tune.report."""

    def __init__(self, members: list[str], work: Path) -> None:
        self.work = work
        self.recorders = {key: TuneRecorder() for key in members}
        self.latest: dict[str, float] = {}  # member -> its last val_rel_lloyd

    def workdir(self, key: str) -> Path:
        return self.work / key

    def report(self, step: int, evaluated: dict[str, dict[str, float]], checkpoint: bool = True) -> None:
        """evaluated: member -> its metrics at this step; checkpoint: the work folder holds their state at step."""
        for key, metrics in evaluated.items():
            value = metrics.get(VAL_REL_LLOYD, math.inf)
            self.latest[key] = value if math.isfinite(value) else math.inf  # NaN breaks schedulers
        payload = {key: rec.take() for key, rec in self.recorders.items()}
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


def run_trial(config: dict, *, jobs: dict[str, dict], packs: dict[str, list[str]], base: list[str]) -> None:
    """Tune's function trainable; config["key"] names the trial in `packs`, its members are keys of `jobs`."""
    console.quiet()  # this worker's Ray Train logs a line per checkpoint otherwise
    members = packs[config["key"]]
    cfgs = []
    for key in members:
        job = jobs[key]
        cfgs.append(compose([*base, *job["overrides"], f"seed={job['seed']}"]))
        if config_hash(cfgs[-1]) != key:  # the driver's view and the trial's must be one configuration
            raise RuntimeError(
                f"trial member {key} composed to {config_hash(cfgs[-1])}: base overrides {base}"
            )
    reporter = Reporter(members, Path(tune.get_context().get_trial_dir()) / "work")
    restore(reporter.work, {key: jobs[key].get("resume_from") for key in members})
    recorders = [reporter.recorders[key] for key in members]
    workdirs = [reporter.workdir(key) for key in members]
    by_dir = dict(zip(workdirs, members))
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
