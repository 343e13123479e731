"""Re-run one MLflow run's configuration locally: `python -m sweeper.rerun RUN_ID [tracking.uri=URI]`.

The configuration is rebuilt from the run's params (every value that
determines the numbers), trained from scratch in a temporary workdir and
logged to the same store and experiment as a new run tagged rerun_of=RUN_ID.
Prints the original and the new final val_rel_lloyd; on CPU they are equal,
except for a model trained in a pack (cluster.pack=seeds, tag `pack`): its
batched matmuls sum in another order, so a solo rerun matches it to about
1e-5 with model.dropout=0 and only in distribution with dropout (a pack draws
its dropout masks in one piece). tracking.uri defaults to $MLFLOW_TRACKING_URI, else
sqlite:///mlflow.db (conf/tracking/local.yaml).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, RESOURCE_DOES_NOT_EXIST, ErrorCode

from cli import console, exit_codes
from cli.credentials import missing_password
from cli.entry import ArgumentParser, about, command, exit_code_lines
from config.compose import check_spacing, compose
from config.help import composed_config
from config.identity import config_hash, run_overrides
from config.schema import ConfigError
from sweeper.errors import NoSuchRun
from tracking import ui
from tracking.mlflow_recorder import MlflowRecorder
from tracking.names import CONFIG_HASH, DIVERGED, PACK, RERUN_OF, VAL_REL_LLOYD
from tracking.store import connect
from training.loop import OnEval, TrainResult, train


def rerun(run_id: str, uri: str) -> tuple[dict[str, str], float | None, TrainResult]:
    """Train run_id's configuration again as a new run; return (original's tags, its final value, new
    result)."""
    client = connect(uri, create=False)  # its run cannot be in a new store: a missing one is refused
    try:
        original = client.get_run(run_id)
    except MlflowException as err:
        if err.error_code not in (
            ErrorCode.Name(RESOURCE_DOES_NOT_EXIST),
            ErrorCode.Name(INVALID_PARAMETER_VALUE),
        ):
            raise  # an id MLflow finds malformed ("_") is in no store either
        raise NoSuchRun(
            f"run {run_id} is not in the tracking store {uri}: copy the id from the MLflow UI or "
            f"`analysis.report`'s tables, or set tracking.uri to the store that holds it"
        ) from None
    experiment = client.get_experiment(original.info.experiment_id).name
    cfg = compose(
        run_overrides(original.data.params)
        + [f"tracking.uri='{uri}'", f"tracking.experiment='{experiment}'", "train.resume=never"]
    )
    recorded = original.data.tags.get(CONFIG_HASH)
    if recorded and recorded != config_hash(cfg):
        raise ConfigError(
            f"run {run_id} has {CONFIG_HASH}={recorded} but its params rebuild "
            f"{config_hash(cfg)}: the config schema changed since it ran"
        )
    recorder = MlflowRecorder(uri, experiment, tags={RERUN_OF: run_id})
    with tempfile.TemporaryDirectory(prefix="rerun-") as workdir:
        result = train(cfg, recorder, Path(workdir), progress_lines(cfg.train.steps))
    return original.data.tags, original.data.metrics.get(VAL_REL_LLOYD), result


def progress_lines(steps: int) -> OnEval | None:
    """Into a log file (stderr not a terminal, where the training bar is off): a line per evaluation."""
    if not console.lines_not_bars():
        return None
    return lambda step, metrics, _: print(
        f"rerun: step {step}/{steps}: {VAL_REL_LLOYD} {metrics[VAL_REL_LLOYD]:.6f}",
        file=sys.stderr,
        flush=True,
    )


@command("leaner-rerun", show_config=composed_config, own_options=True)
def main(argv: list[str]) -> int:
    parser = ArgumentParser(
        prog="leaner-rerun",
        description=about(__doc__),
        epilog=exit_code_lines(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "run_id", help="the MLflow run to train again (its id: the run page, or `mlflow runs list`)"
    )
    parser.add_argument(
        "tracking",
        nargs="?",
        metavar="tracking.uri=URI",
        help="the store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)",
    )
    check_spacing(argv)  # `tracking.uri = URI`: the words argparse would call unrecognized, named whole
    args = parser.parse_args(argv)
    if args.tracking and not args.tracking.startswith("tracking.uri="):
        raise ConfigError(f"unknown argument {args.tracking!r}: the one override is tracking.uri=URI")
    uri = compose([args.tracking] if args.tracking else []).tracking.uri
    if missing_password(uri):  # a record's address holds no password: the environment gives it, or nothing
        print(f"rerun: {missing_password(uri)}", file=sys.stderr, flush=True)
    tags, before, result = rerun(args.run_id, uri)
    after = result.metrics.get(VAL_REL_LLOYD)
    print(f"original run {args.run_id}: final {VAL_REL_LLOYD} {before!r}")
    print(f"rerun {result.run_id}: final {VAL_REL_LLOYD} {after!r} ({result.outcome})")
    experiment_id = connect(uri).get_run(result.run_id).info.experiment_id
    print(f"MLflow: {ui.how_to_open(uri, ui.run_page(uri, experiment_id, result.run_id))}")
    if before is not None and after is not None:
        print("equal" if before == after else f"differ by {abs(after - before):.3g}")
    if PACK in tags:
        print(
            f"the original trained in pack {tags[PACK]}: trained alone it matches to about "
            "1e-5 with model.dropout=0, and only in distribution with dropout > 0"
        )
    return exit_codes.DIVERGED if result.outcome == DIVERGED else exit_codes.OK


if __name__ == "__main__":
    sys.exit(main())
