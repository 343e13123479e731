"""Train one configuration (docs/science.md section 5): `python -m sweeper.train [hydra overrides]`.

Composes the configuration (with sweep=NAME, at that sweep's `fixed` values,
as its trials train), records the run to MLflow and resumes from the workdir's
checkpoint when there is one.

Exit codes: the table of cli/exit_codes.py (0 finished, 2 rejected configuration, 3 diverged, ...).
"""

from __future__ import annotations

import sys

from cli import exit_codes
from cli.credentials import mask
from cli.entry import command
from config.grid import compose_one
from config.help import composed_config, config_groups
from tracking.mlflow_recorder import MlflowRecorder
from tracking.names import DIVERGED, VAL_KMEANS, VAL_REL_LLOYD
from training.device import pick_device
from training.loop import default_workdir, train
from training.system_metrics import SystemSampler


@command("leaner-train", show_config=composed_config, options=config_groups)
def main(argv: list[str]) -> int:
    cfg = compose_one(argv)
    device = pick_device(cfg.train.device)  # a device this machine lacks: exit 2 before anything is written
    recorder = MlflowRecorder(cfg.tracking.uri, cfg.tracking.experiment)
    sampler = SystemSampler(device)  # MLflow's System metrics tab, one sample per evaluation

    def sample(step: int, metrics: dict, workdir) -> None:
        recorder.log_metrics(step, sampler.sample())

    result = train(cfg, recorder, default_workdir(cfg), on_eval=sample)
    where = f"run {result.run_id} in {mask(cfg.tracking.uri)} (experiment {cfg.tracking.experiment})"
    if result.outcome == DIVERGED:
        print(
            f"diverged: {result.cause} at step {result.diverged_at}; {where} marked FAILED", file=sys.stderr
        )
        return exit_codes.DIVERGED
    print(
        f"finished {result.step} steps: {VAL_REL_LLOYD} {result.metrics[VAL_REL_LLOYD]:.6f}, "
        f"{VAL_KMEANS} {result.metrics[VAL_KMEANS]:.6f}, best {VAL_REL_LLOYD} {result.best_val:.6f}; {where}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
