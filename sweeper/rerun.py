"""Re-run one MLflow run's configuration locally: `python -m sweeper.rerun RUN_ID [--tracking-uri URI]`.

The configuration is rebuilt from the run's params (every value that
determines the numbers), trained from scratch in a temporary workdir and
logged to the same store and experiment as a new run tagged rerun_of=RUN_ID.
Prints the original and the new final val_rel_lloyd; on CPU they are equal,
except for a model trained in a pack (cluster.pack=seeds, tag `pack`): its
batched matmuls sum in another order, so a solo rerun matches it to about
1e-5 with model.dropout=0 and only in distribution with dropout (a pack draws
its dropout masks in one piece). Exit codes as for sweeper.train.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from sweeper import ui
from sweeper.config import ConfigError, compose, config_hash, run_overrides
from sweeper.metrics import CONFIG_HASH, DIVERGED, PACK, RERUN_OF, VAL_REL_LLOYD
from sweeper.tracking import MlflowRecorder, TrackingError, probe
from sweeper.train import CLI_ERRORS, EXIT_DIVERGED, TrainResult, report_error, train

DEFAULT_URI = "sqlite:///mlflow.db"


def rerun(run_id: str, uri: str) -> tuple[dict[str, str], float | None, TrainResult]:
    """Train run_id's configuration again as a new run; return (original's tags, its final value, new result)."""
    probe(uri)
    client = MlflowClient(tracking_uri=uri)
    try:
        original = client.get_run(run_id)
    except MlflowException:
        raise TrackingError(f"run {run_id} is not in the tracking store {uri}") from None
    experiment = client.get_experiment(original.info.experiment_id).name
    cfg = compose(run_overrides(original.data.params) +
                  [f"tracking.uri='{uri}'", f"tracking.experiment='{experiment}'", "train.resume=never"])
    recorded = original.data.tags.get(CONFIG_HASH)
    if recorded and recorded != config_hash(cfg):
        raise ConfigError(f"run {run_id} has {CONFIG_HASH}={recorded} but its params rebuild "
                          f"{config_hash(cfg)}: the config schema changed since it ran")
    recorder = MlflowRecorder(uri, experiment, tags={RERUN_OF: run_id})
    with tempfile.TemporaryDirectory(prefix="rerun-") as workdir:
        result = train(cfg, recorder, Path(workdir))
    return original.data.tags, original.data.metrics.get(VAL_REL_LLOYD), result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweeper.rerun", description=__doc__.splitlines()[0])
    parser.add_argument("run_id")
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_URI),
                        help="default: $MLFLOW_TRACKING_URI, else %(default)s")
    args = parser.parse_args(argv)
    try:
        tags, before, result = rerun(args.run_id, args.tracking_uri)
    except CLI_ERRORS as err:
        return report_error(err)
    after = result.metrics.get(VAL_REL_LLOYD)
    print(f"original run {args.run_id}: final {VAL_REL_LLOYD} {before!r}")
    print(f"rerun {result.run_id}: final {VAL_REL_LLOYD} {after!r} ({result.outcome})")
    experiment_id = MlflowClient(tracking_uri=args.tracking_uri).get_run(result.run_id).info.experiment_id
    print(f"MLflow: {ui.how_to_open(args.tracking_uri, ui.run_page(args.tracking_uri, experiment_id, result.run_id))}")
    if before is not None and after is not None:
        print("equal" if before == after else f"differ by {abs(after - before):.3g}")
    if PACK in tags:
        print(f"the original trained in pack {tags[PACK]} (cluster.pack=seeds): trained alone it matches to about "
              "1e-5 with model.dropout=0, and only in distribution with dropout > 0")
    return EXIT_DIVERGED if result.outcome == DIVERGED else 0


if __name__ == "__main__":
    sys.exit(main())
