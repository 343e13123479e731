"""Run a sweep on Ray Tune: `python -m sweeper.sweep sweep=NAME [overrides]`.

    python -m sweeper.sweep sweep=paper sweep.dry_run=true   # the plan; Ray is not started
    python -m sweeper.sweep sweep=paper                      # 3,000 trials on a local Ray instance
    python -m sweeper.sweep sweep=paper cluster.address=auto tracking.uri=http://HOST:5000 \\
        cluster.storage=/shared/ray_results                  # on a running Ray cluster

Other overrides (train.steps=..., cluster.cpus_per_trial=0.5, ...) apply to
every trial. The same command started again continues the sweep: trials with
a finished (or diverged) MLflow run are skipped, interrupted ones resume from
their last checkpoint in their own run. On a multi-node cluster
`cluster.storage` must be shared storage (an NFS path mounted alike on every
node, or s3://, gs://): trials resume from checkpoints written elsewhere.

Exit codes: the table of cli/exit_codes.py (0 every trial ended, 1 some trials failed after their
retries: start again to retry them, 2 rejected configuration, 4 tracking store unreachable at the start or
for longer than tracking.outage_s mid-sweep, 8 another driver runs this sweep, 130/143 stopped by
SIGINT/SIGTERM: running trials keep their last checkpoint and the same command resumes them, ...).
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Iterable
from urllib.parse import urlsplit

from omegaconf import DictConfig

from cli import console, exit_codes
from cli.entry import command
from config import grid
from config.compose import compose, group_options, searchpath_override, user_config_dirs, without_searchpath
from config.help import composed_config, config_groups
from config.schema import ConfigError
from sweeper.errors import ClusterError
from tracking import ui

if TYPE_CHECKING:
    from sweeper.record import SweepRecord

EXIT_FAILED = exit_codes.FAILED
NO_SWEEP = "none"  # the sweep group's default: a single run, nothing to sweep


def sweep_names(overrides: Iterable[str] = ()) -> list[str]:
    """The sweeps of conf/sweep/ and of the user config directories (config.compose.user_config_dirs)."""
    return [name for name in group_options("sweep", user_config_dirs(overrides)) if name != NO_SWEEP]


def load(overrides: list[str]) -> tuple[DictConfig, grid.Plan]:
    """Compose, expand and validate: every error here comes before Ray starts."""
    chosen = [o.split("=", 1)[1] for o in overrides if o.startswith("sweep=")]
    names = sweep_names(overrides)
    if not chosen or chosen[-1] not in names:
        got = f"sweep={chosen[-1]} is not a sweep" if chosen else "no sweep chosen"
        raise ConfigError(
            f"{got}: choose sweep=NAME with NAME one of {', '.join(names)} "
            "(conf/sweep/, or sweep/NAME.yaml of a --config-dir)"
        )
    cfg = compose(overrides)
    plan = grid.expand(cfg.sweep, grid.command_line_keys(overrides))
    grid.check(cfg, plan)
    return cfg, plan


def trial_overrides(overrides: list[str], plan: grid.Plan) -> list[str]:
    """The command line's overrides a trial composes with: not the sweep's, not the keys the grid sets; the
    user config directories as one override of absolute paths (a trial's worker has another working
    directory, and on a cluster not the driver's environment)."""
    gridded = {key for c in plan.configurations for key in c.overrides} | {"seed"}
    keys = [(o, grid.override_key(o)) for o in without_searchpath(overrides)]
    kept = [o for o, key in keys if key != "sweep" and not key.startswith("sweep.") and key not in gridded]
    return searchpath_override(user_config_dirs(overrides)) + kept


def jobs_of(jobs: list[grid.Job], resume_from: dict[str, str]) -> dict[str, dict]:
    """What each job needs, keyed by config_hash: plain data, shipped once to every worker.

    resume_from: config_hash -> the Tune checkpoint its unfinished run recorded (sweeper.ledger).
    """
    return {
        j.key: {
            "overrides": j.configuration.override_strings(),
            "seed": j.seed,
            "name": j.name,
            "subgrids": list(j.configuration.subgrids),
            "resume_from": resume_from.get(j.key),
        }
        for j in jobs
    }


def packs_of(jobs: list[grid.Job], pending: set[str], mode: str, size: int) -> dict[str, list[str]]:
    """Ray Tune's trials, each a list of the pending jobs (config_hash) it trains.

    mode none: one job per trial, keyed by its config_hash. mode seeds: the
    seeds of a configuration train together (training.packed). mode shapes: the
    jobs that share training.packed.SHARED_KEYS train together, `size` at most
    (cluster.pack_size), cut from the whole plan in its order. A pack is keyed
    by a hash of all its jobs' keys, done or not, so a restarted sweep packs
    what is left under the same key.
    """
    if mode == "none":
        return {j.key: [j.key] for j in jobs if j.key in pending}
    groups: dict[tuple, list[str]] = {}
    if mode == "seeds":
        for j in jobs:
            groups.setdefault(tuple(j.configuration.override_strings()), []).append(j.key)
        cuts = list(groups.values())
    else:
        from training.packed import SHARED_KEYS  # torch: only the sweeps that pack by shape need it

        for j in jobs:  # a key no configuration overrides has the sweep's one value
            groups.setdefault(tuple(j.configuration.overrides.get(k) for k in SHARED_KEYS), []).append(j.key)
        cuts = [keys[i : i + size] for keys in groups.values() for i in range(0, len(keys), size)]
    packs = {
        "pack-" + hashlib.sha256(" ".join(keys).encode()).hexdigest()[:12]: [k for k in keys if k in pending]
        for keys in cuts
    }
    return {key: members for key, members in packs.items() if members}


def display_name(members: list[str], jobs: dict[str, dict]) -> str:
    """A trial's name: its job's run name; a pack's, how many jobs and its first job's name."""
    first = jobs[members[0]]["name"]
    return first if len(members) == 1 else f"pack of {len(members)} from {first}"


def param_space(packs: dict[str, list[str]], jobs: dict[str, dict]) -> dict:
    """Tune's trials, one per pack: each trial's config holds its key and name (sweeper.trial.trial_entry).

    Its name travels in its config, so Tune's trial_name_creator keeps nothing of the sweep
    (sweeper.driver_only); the keys are the packs' (so a restart continues the same jobs).
    """
    from ray import tune

    from sweeper.trial import TRIAL, trial_entry

    trials = [trial_entry(key, display_name(members, jobs)) for key, members in packs.items()]
    return {TRIAL: tune.grid_search(trials)}


def reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast, naming the address, when nothing listens there (ray.init would retry for a minute)."""
    if address == "auto":
        return  # ray.init finds the local cluster's address file or says there is none
    parts = urlsplit(address if "://" in address else f"ray://{address}")
    port = parts.port or (10001 if address.startswith("ray://") else 6379)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as err:
        raise ClusterError(
            f"Ray cluster cluster.address={address} is unreachable ({err}); start one with "
            "`ray start --head`, fix the address, or leave cluster.address unset for a local "
            "instance"
        ) from None


def dashboard_installed(host: str | None) -> bool:
    """Whether a local Ray can serve its dashboard at `host` (cluster.dashboard_host; null: none wanted).

    `pip install leaner-clustering` brings ray[tune] without the dashboard's packages (the `cluster` extra,
    ray[default], has them), and Ray refuses to start a dashboard it cannot run: the sweep then starts
    without one and says so once, rather than failing on the default configuration.
    """
    if host is None:
        return False
    try:
        import ray.dashboard.optional_deps  # noqa: F401 - what Ray itself imports to decide the same
    except ImportError as err:
        print(
            f"Ray's dashboard is off: its packages are missing ({err.name or err}); "
            "pip install 'ray[default]' brings them; cluster.dashboard_host=null silences this"
        )
        return False
    return True


def connect(cluster: DictConfig) -> None:
    import ray

    if ray.is_initialized():  # a caller (a notebook, the tests) already chose the Ray instance
        return
    if cluster.address is None:  # "local": a new instance, never another sweep's that happens to run here
        host = cluster.dashboard_host if dashboard_installed(cluster.dashboard_host) else None  # null: none
        ray.init(address="local", include_dashboard=host is not None, dashboard_host=host)
        fits_this_machine(cluster, ray.cluster_resources())
        return
    reachable(cluster.address)
    try:
        ray.init(address=cluster.address)
    except ConnectionError as err:
        raise ClusterError(
            f"cannot join the Ray cluster at cluster.address={cluster.address}: {str(err).splitlines()[0]}"
        ) from None


def fits_this_machine(cluster: DictConfig, resources: dict[str, float]) -> None:
    """A local Ray instance is this machine and grows no nodes: a trial reserving more CPUs or GPUs than it
    has would wait forever (Tune only warns), so the sweep is refused before any trial starts. A cluster's
    nodes may join later (an autoscaler): not checked there."""
    for resource, key in (("CPU", "cpus_per_trial"), ("GPU", "gpus_per_trial")):
        have, want = resources.get(resource, 0), cluster[key]
        if want > have:
            raise ConfigError(
                f"cluster.{key}={want:g} is not allowed with a local Ray instance (cluster.address=null): "
                f"this machine has {have:g} {resource}s; reserve at most that, or join a cluster that has "
                "more (cluster.address)"
            )


def storage_path(cluster: DictConfig) -> str | None:
    if cluster.storage is None or "://" in cluster.storage:
        return cluster.storage
    return str(Path(cluster.storage).expanduser().resolve())


def check_shared(storage: str | None) -> None:
    """On several nodes, a local storage path must be one shared file system: try it from every node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n["Alive"]]
    if len(nodes) < 2 or (storage and "://" in storage):
        return
    if storage is None:
        raise ClusterError(
            f"the Ray cluster has {len(nodes)} nodes: set cluster.storage to shared storage "
            "(a path mounted alike on every node, or s3://, gs://) so trials resume anywhere"
        )
    marker = Path(storage) / f".shared-{uuid.uuid4().hex}"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("")
    sees = ray.remote(num_cpus=0)(os.path.exists)
    try:
        refs = [
            sees.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
                str(marker)
            )
            for n in nodes
        ]
        blind = [n["NodeManagerAddress"] for n, ok in zip(nodes, ray.get(refs, timeout=120)) if not ok]
    finally:
        marker.unlink()
    if blind:
        raise ClusterError(
            f"cluster.storage={storage} is not shared storage: nodes {', '.join(blind)} do not "
            "see it; on a multi-node cluster use a path mounted alike on every node, or s3://, gs://"
        )


def scheduler_of(cfg: DictConfig, plan: grid.Plan):
    if cfg.sweep.scheduler != "asha":
        from sweeper.fifo import LiveFifo

        return LiveFifo()  # Tune's FIFO order, without its scan of every trial per step
    from ray.tune.schedulers import ASHAScheduler

    from sweeper.trial import STEP

    # The trials' own values: a sweep's `fixed` keys and axes override the base configuration's.
    steps = max(c.overrides.get("train.steps", cfg.train.steps) for c in plan.configurations)
    every = max(c.overrides.get("train.eval_every", cfg.train.eval_every) for c in plan.configurations)
    # Decisions from ten evaluations on: early validation ratios say little. max_t lies past the last
    # evaluation: a trial ends when its training does (its last report carries the outcomes), never by ASHA
    # at its last step, which would race that report.
    return ASHAScheduler(time_attr=STEP, max_t=steps + every, grace_period=min(10 * every, steps))


def run(cfg: DictConfig, plan: grid.Plan, overrides: list[str]) -> int:
    record = open_record(cfg, plan)
    return 0 if record is None else drive(cfg, plan, overrides, record)


def open_record(cfg: DictConfig, plan: grid.Plan) -> SweepRecord | None:
    """The sweep's record in MLflow (sweeper.record.SweepRecord), read once; None when nothing is left."""
    from sweeper.record import SweepRecord

    uri, cluster = cfg.tracking.uri, cfg.cluster
    if (cluster.address or "").startswith("ray://") and not uri.startswith(("http://", "https://")):
        raise ConfigError(
            f"cluster.address={cluster.address} runs the sweep driver, the MLflow writer, on the "
            f"cluster's head node: tracking.uri={uri} must be a server it reaches (http://HOST:PORT)"
        )
    jobs = grid.jobs(cfg, plan)
    record = SweepRecord(uri, cfg.tracking.experiment, plan.name, jobs, cfg.tracking.outage_s)
    adopted = record.adopt()
    if adopted:
        print(f"{adopted} runs finished outside this sweep now carry sweep={plan.name} too")
    if not record.pending():
        print(f"{len(jobs)} of {len(jobs)} trials already in MLflow; 0 to run")
        return None
    return record


def drive(cfg: DictConfig, plan: grid.Plan, overrides: list[str], record: SweepRecord, trainable=None) -> int:
    """Run what is left of the sweep, this driver alone on it; trainable: a stand-in for run_trial (bench)."""
    from sweeper.stop import STOP_DRAIN_S, Halt, stopped

    with record.locked():
        pending = record.pending()  # the lock may have found another driver's work since the read
        jobs = record.jobs
        print(f"{len(jobs) - len(pending)} of {len(jobs)} trials already in MLflow; {len(pending)} to run")
        if not pending:
            return 0
        work = jobs_of(pending, record.ledger.resume_from)
        packs = packs_of(jobs, set(work), cfg.cluster.pack, cfg.cluster.pack_size)
        for key, members in packs.items():
            for member in members:
                work[member]["pack"] = key if len(members) > 1 else None
        connect(cfg.cluster)
        storage = storage_path(cfg.cluster)
        check_shared(storage)
        # The MLflow UI groups the jobs' runs under the parent run: the plan, the command line and the counts.
        record.start(cfg, plan, overrides, work, packs)
        halt = Halt(record)
        with halt.on_signals():
            errors = tune_fit(
                cfg, plan, overrides, work, packs, storage, record, trainable=trainable, stop=halt
            )
            applied = record.close(STOP_DRAIN_S if halt.signal else None)
        if record.error is not None:
            raise record.error
        if halt.signal:
            return stopped(plan.name, overrides, record, applied, halt.signal)
        writer = record.writer
        complete = errors == 0 and len(writer.outcomes) == len(pending)
        record.finish(complete)
    counts = {o: list(writer.outcomes.values()).count(o) for o in sorted(set(writer.outcomes.values()))}
    again = " (start the same command again to retry them)" if errors else ""
    print(
        f"sweep {plan.name}: {len(writer.outcomes)} of {len(pending)} trials ended {counts}; "
        f"{writer.retries} retries; {errors} failed after retries{again}; "
        f"{writer.points_written} metric points written"
    )
    print(where_to_look(cfg.tracking.uri, cfg.tracking.experiment, record.experiment))
    return 0 if complete else EXIT_FAILED


def tune_fit(
    cfg: DictConfig,
    plan: grid.Plan,
    overrides: list[str],
    jobs: dict[str, dict],
    packs: dict[str, list[str]],
    storage: str | None,
    record: SweepRecord,
    trainable=None,
    stop=None,
) -> int:
    """Run the trials of `packs` (with sweeper.trial.run_trial, or a stand-in); how many failed after retries.

    record: the Tune callback that records the trials (sweeper.record); stop: a Tune stopper or None.
    """
    from ray import tune

    from sweeper.trial import run_trial, trial_dirname, trial_name
    from tracking.names import VAL_REL_LLOYD

    c = cfg.cluster
    trainable = tune.with_parameters(
        trainable or run_trial, jobs=jobs, packs=packs, base=trial_overrides(overrides, plan)
    )
    trainable = tune.with_resources(trainable, {"cpu": c.cpus_per_trial, "gpu": c.gpus_per_trial})
    scheduler = scheduler_of(cfg, plan)
    tuner = tune.Tuner(
        trainable,
        param_space=param_space(packs, jobs),
        tune_config=tune.TuneConfig(
            max_concurrent_trials=c.max_concurrent,
            scheduler=scheduler,
            reuse_actors=True,  # imports once per worker
            metric=VAL_REL_LLOYD if cfg.sweep.scheduler == "asha" else None,
            mode="min" if cfg.sweep.scheduler == "asha" else None,
            trial_name_creator=trial_name,
            trial_dirname_creator=trial_dirname,
        ),
        run_config=tune.RunConfig(
            name=f"{plan.name}-{time.strftime('%Y%m%d-%H%M%S')}",
            storage_path=storage,
            callbacks=[record],
            stop=stop,
            failure_config=tune.FailureConfig(max_failures=c.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=None),
            verbose=console.tune_output(),  # quiet: the status table, not a box per trial event
        ),
    )  # the record's MlflowWriter prunes them
    results = tuner.fit()
    return len(results.errors)


def where_to_look(uri: str, experiment: str, experiment_id: str) -> str:
    return (
        f"MLflow: experiment {experiment} in {uri}; {ui.how_to_open(uri, ui.runs_table(uri, experiment_id))}"
    )


@command("leaner-sweep", show_config=composed_config, options=config_groups)
def main(argv: list[str]) -> int:
    cfg, plan = load(argv)
    print(plan.table())
    if cfg.cluster.pack == "seeds":
        print(
            f"cluster.pack=seeds: {len(plan.configurations)} Ray Tune trials, each training the "
            f"{len(plan.seeds)} seeds of one configuration together"
        )
    print(plan.summary(), flush=True)  # the plan's last line (docs/science.md section 8)
    if cfg.sweep.dry_run:
        return 0
    return run(cfg, plan, argv)


if __name__ == "__main__":
    sys.exit(main())
