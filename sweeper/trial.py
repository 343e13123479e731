"""One sweep trial inside Ray Tune: the same train() as `python -m sweeper.train`.

A trial never touches MLflow (a SQLite store must have one writer). Its
recorder collects what train() records and hands it to Tune with the next
tune.report: metric points together with the checkpoint they lead up to, so
the driver's MlflowWriter stores points and checkpoint location in step. A
trial resumes from the checkpoint Tune gives back after a crash, or from the
one a restarted sweep found recorded in the trial's unfinished MLflow run.
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path

from ray import tune

from sweeper.config import compose, config_hash
from sweeper.metrics import VAL_REL_LLOYD
from sweeper.train import train

PAYLOAD = "mlflow"  # result key the driver pops: what the trial recorded since the last report
STEP = "step"       # result key: the training step reported (ASHA's time axis)


class TuneRecorder:
    """A Recorder (sweeper.tracking) that buffers everything for the next tune.report."""

    def __init__(self) -> None:
        self.payload: dict = {}

    def _take(self) -> dict:
        payload, self.payload = self.payload, {}
        return payload

    def start(self, name: str, params: dict[str, str], tags: dict[str, str], run_id: str | None = None) -> str:
        # The driver owns the MLflow run (it reuses an unfinished one on restart), so the id here is a stand-in.
        self.payload["start"] = {"name": name, "params": params, "tags": tags}
        return run_id or "tune-trial"

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)  # the time of training, not of the driver's write
        self.payload.setdefault("points", []).extend([key, float(v), step, now] for key, v in metrics.items())

    def flush(self) -> None:
        pass  # the points travel with the checkpoint in the next report; see on_eval

    def set_tags(self, tags: dict[str, str]) -> None:
        self.payload.setdefault("tags", {}).update(tags)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        # Bytes, not a path: the driver may be on another node. Artifacts are small (config, two checkpoints, a PNG).
        self.payload.setdefault("artifacts", []).append([artifact_path, path.name, path.read_bytes()])

    def finish(self, status: str) -> None:
        self.payload["status"] = status

    def report(self, step: int, metrics: dict[str, float], checkpoint_dir: Path | None = None) -> None:
        shown = {key: (v if math.isfinite(v) else math.inf) for key, v in metrics.items()}  # NaN breaks schedulers
        checkpoint = tune.Checkpoint.from_directory(str(checkpoint_dir)) if checkpoint_dir else None
        tune.report({STEP: step, **shown, PAYLOAD: self._take()}, checkpoint=checkpoint)


def restore(workdir: Path, resume_from: str | None) -> None:
    """Make workdir hold exactly the trial's last reported checkpoint, or nothing.

    Files written after that report (a newer last.pt) are dropped: the metric
    points leading up to them never reached the driver, so training replays them.
    """
    shutil.rmtree(workdir, ignore_errors=True)
    checkpoint = tune.get_checkpoint()  # set when Tune retries this trial after a failure
    if checkpoint is None and resume_from:  # a restarted sweep: the path the trial's MLflow run recorded
        checkpoint = tune.Checkpoint(resume_from)
    if checkpoint is None:
        return
    try:
        with checkpoint.as_directory() as found:
            shutil.copytree(found, workdir)
        print(f"trial: resuming from checkpoint {checkpoint.path}")
    except OSError as err:  # gone (pruned, or storage not shared): start over; the writer drops replayed points
        print(f"trial: cannot restore checkpoint {checkpoint.path} ({err}); starting from step 0")
        shutil.rmtree(workdir, ignore_errors=True)


def run_trial(config: dict, *, jobs: dict[str, dict], base: list[str]) -> None:
    """Tune's function trainable; config["key"] names the job (a config_hash) in `jobs`."""
    job = jobs[config["key"]]
    cfg = compose([*base, *job["overrides"], f"seed={job['seed']}"])
    if config_hash(cfg) != config["key"]:  # the driver's view and the trial's must be one configuration
        raise RuntimeError(f"trial {config['key']} composed to {config_hash(cfg)}: base overrides {base}")
    workdir = Path(tune.get_context().get_trial_dir()) / "work"
    restore(workdir, job.get("resume_from"))
    recorder = TuneRecorder()
    result = train(cfg, recorder, workdir, on_eval=recorder.report)  # each evaluation: points + checkpoint
    recorder.report(result.step, {VAL_REL_LLOYD: result.metrics.get(VAL_REL_LLOYD, math.inf)})
