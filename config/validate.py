"""The checks a configuration's types cannot express: ranges, and the allowed names, which come from tasks/
and models/ themselves. Every failure is one ConfigError naming the key, the value and what is allowed.

`validate` checks a training configuration in one pass (config.compose runs it on every composition, a
sweep's grid on each of its configurations: config.grid.jobs), `validate_analysis` the report's.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Collection

from omegaconf import DictConfig, OmegaConf

from cli.credentials import in_address, mask
from config import address
from config.schema import COMPILE_MODES, EVAL_CHECKPOINTS, PACK_MODES, RESUME_MODES, ConfigError
from models.options import EMBEDDINGS, REGULARIZERS
from tasks.spec import TaskSpec


def validate(cfg: DictConfig, trial: bool = False) -> None:
    """Range and name checks the types cannot express, in one pass; trial=True: also the devices a sweep's
    Ray trial can have (_trial_devices); raises ConfigError."""
    try:
        TaskSpec(**OmegaConf.to_container(cfg.task))
    except ValueError as err:
        raise ConfigError(str(err)) from None
    m, loss, opt, t, c = cfg.model, cfg.loss, cfg.optim, cfg.train, cfg.cluster
    _one_of("model.embedding", m.embedding, EMBEDDINGS)
    _positive("model.gamma", m.gamma, allow_inf=True)
    _require(0 <= m.dropout < 1, "model.dropout", m.dropout, "a number in [0, 1)")
    _at_least("model.qkv_mult", m.qkv_mult, 1)
    _one_of("loss.regularizer", loss.regularizer, REGULARIZERS)
    _positive("loss.tau", loss.tau)
    _positive("optim.lr", opt.lr)
    _require(0 < opt.lr_factor < 1, "optim.lr_factor", opt.lr_factor, "a number in (0, 1)")
    _at_least("optim.lr_patience", opt.lr_patience, 0)
    for key in ("steps", "batch", "eval_every", "val_batches", "log_every", "threads"):
        _at_least(f"train.{key}", t[key], 1)
    _device("train.device", t.device)
    _one_of("train.resume", t.resume, RESUME_MODES)
    _one_of("train.compile", t.compile, COMPILE_MODES)
    _require(
        t.compile != "cudagraphs" or t.device not in ("cpu", "mps"),
        "train.compile",
        t.compile,
        f"cudagraphs needs a CUDA device (train.device={t.device}): use inductor or off",
    )
    _require(0 <= cfg.seed < 2**63, "seed", cfg.seed, "an integer in [0, 2**63)")
    _tracking(cfg)
    _cluster(cfg)
    if cfg.sweep is not None:
        _search_settings(cfg.sweep)
    _storage(c)
    _cost(c)
    if trial:
        _trial_devices(cfg)


def _cluster(cfg: DictConfig) -> None:
    """The cluster section's ranges, in validate's order: a trial's resources, the sweep's concurrency and
    failures, the packing (against sweep.scheduler), reports and time budget; the cost preview's keys are
    _cost's."""
    c = cfg.cluster
    _positive("cluster.cpus_per_trial", c.cpus_per_trial)
    # Ray would reserve whole GPUs above 1, but a trial trains on one (training.gpu_share.trial_device).
    _require(
        0 <= c.gpus_per_trial <= 1,
        "cluster.gpus_per_trial",
        c.gpus_per_trial,
        "a number in [0, 1]: a fraction below 1 shares a GPU, and a trial trains on one GPU at most",
    )
    _require(
        c.max_concurrent is None or c.max_concurrent >= 1,
        "cluster.max_concurrent",
        c.max_concurrent,
        "null (no limit) or an integer >= 1",
    )
    _at_least("cluster.max_failures", c.max_failures, -1)
    _one_of("cluster.pack", c.pack, PACK_MODES)
    # ASHA decides on a trial's one value, a pack's median: a pack of one shape holds unrelated
    # configurations, which it would stop together (a pack of seeds is one configuration: stopped as one).
    _require(
        cfg.sweep is None or not (cfg.sweep.scheduler == "asha" and c.pack == "shapes"),
        "cluster.pack",
        c.pack,
        "with sweep.scheduler=asha choose cluster.pack=none or seeds (a pack of shapes holds unrelated "
        "configurations, which ASHA would stop together), or sweep.scheduler=none",
    )
    _at_least("cluster.pack_size", c.pack_size, 1)
    _at_least("cluster.report_every", c.report_every, 1)
    if c.time_budget_s is not None:
        _require(
            0 < c.time_budget_s < math.inf,
            "cluster.time_budget_s",
            c.time_budget_s,
            "null (no budget) or a number of seconds > 0, finite",
        )
    if c.drain_s is not None:
        _require(
            c.time_budget_s is not None and 0 < c.drain_s < c.time_budget_s,
            "cluster.drain_s",
            c.drain_s,
            "null (no drain) or a number of seconds > 0 and under cluster.time_budget_s (which must be set)",
        )


def _search_settings(s: DictConfig) -> None:
    """ASHA's settings and the random search's counts (its space is config.search's, which knows the axes)."""
    a = s.asha
    _require(
        a.grace_period is None or a.grace_period >= 1,
        "sweep.asha.grace_period",
        a.grace_period,
        "null (ten evaluations) or an integer >= 1 (training steps)",
    )
    _require(
        1 < a.reduction_factor < math.inf,
        "sweep.asha.reduction_factor",
        a.reduction_factor,
        "a number > 1, finite",
    )
    _at_least("sweep.asha.brackets", a.brackets, 1)
    _at_least("sweep.search.samples", s.search.samples, 0)
    _at_least("sweep.search.seed", s.search.seed, 0)


def _storage(c: DictConfig) -> None:
    """A credential in cluster.storage's address would reach Ray's own records of the sweep (Tune's state,
    its logs), which no masking reaches: refused, naming where storage keys go instead."""
    if c.storage is not None and in_address(str(c.storage)):
        raise ConfigError(
            f"cluster.storage={mask(str(c.storage))!r} is not allowed: a credential in its address would be "
            "written into Ray's records of the sweep; give storage keys through the environment "
            "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...; docs/security.md)"
        )


def _cost(c: DictConfig) -> None:
    """The cost preview's keys (sweeper.driver.cost): its step times' file, its prices."""
    _require(
        c.step_seconds is None or Path(c.step_seconds).is_file(),
        "cluster.step_seconds",
        c.step_seconds,
        "null (no preview of hours) or an existing file: the JSON `python -m bench step_seconds --out FILE` "
        "wrote for the sweep",
    )
    for key in ("price_per_gpu_hour", "price_per_core_hour"):
        price = c[key]
        _require(
            price is None or 0 <= price < math.inf,
            f"cluster.{key}",
            price,
            "null (no price) or a number >= 0, finite",
        )


def _trial_devices(cfg: DictConfig) -> None:
    """train.device and train.compile against cluster.gpus_per_trial, for a sweep's Ray trials: what fails
    in every trial wherever it runs.

    Ray shows a trial only the GPUs it reserves, numbered from 0 (CUDA_VISIBLE_DEVICES), and none when it
    reserves none: there train.device=auto is the CPU. A single run (python -m sweeper.train) is checked
    against its own machine instead, when it starts (training.device.pick_device).
    """
    t, gpus = cfg.train, cfg.cluster.gpus_per_trial
    _require(
        re.fullmatch(r"cuda:\d+", t.device) is None,
        "train.device",
        t.device,
        "cpu, auto or cuda in a sweep: Ray numbers each trial's GPUs from 0, so an explicit index names "
        "a GPU the trial may not have",
    )
    if gpus == 0:
        _require(
            t.device != "cuda",
            "train.device",
            t.device,
            "cpu or auto with cluster.gpus_per_trial=0 (Ray hides the GPUs from a trial that reserves "
            "none): set cluster.gpus_per_trial, e.g. 1, or 0.25 to share a GPU among four trials",
        )
        _require(
            t.compile != "cudagraphs",
            "train.compile",
            t.compile,
            "off, inductor or aot_eager with cluster.gpus_per_trial=0 (cudagraphs needs a CUDA device, and "
            "Ray hides the GPUs from a trial that reserves none)",
        )


def _tracking(cfg: DictConfig) -> None:
    uri = cfg.tracking.uri
    _require(bool(uri), "tracking.uri", uri, f"a store address: {address.FORMS}")
    why = address.problem(uri)
    # The default reads $MLFLOW_TRACKING_URI: a bad one set long ago is nowhere on the command line.
    source = f" (it comes from ${address.ENV})" if os.environ.get(address.ENV) == uri else ""
    _require(why is None, "tracking.uri", uri, f"the address {why}{source}")
    _require(
        bool(cfg.tracking.experiment), "tracking.experiment", cfg.tracking.experiment, "a non-empty name"
    )
    _positive("tracking.outage_s", cfg.tracking.outage_s)


def validate_analysis(cfg: DictConfig) -> None:
    """The report's and the claims' ranges (conf/analysis.yaml); figure names are checked by the report."""
    _tracking(cfg)
    if cfg.experiments is not None:
        entries = list(cfg.experiments)
        names = [str(entry).partition("@")[0] for entry in entries]  # NAME@URI: NAME of another store
        _require(
            bool(names) and all(names) and len(set(names)) == len(names),
            "experiments",
            entries,
            "null or a list of distinct experiment names, [a,b,...] (NAME@URI: of another store)",
        )
    e = cfg.eval
    for key in ("batches", "batch", "steps", "dissimilarity_tasks", "threads", "max_elements"):
        _at_least(f"eval.{key}", e[key], 1)
    _at_least("eval.surface_points", e.surface_points, 2)
    _positive("eval.surface_span", e.surface_span)
    _require(all(n >= 1 for n in e.lengths), "eval.lengths", list(e.lengths), "a list of integers >= 1")
    _device("eval.device", e.device)
    _one_of("eval.checkpoint", e.checkpoint, EVAL_CHECKPOINTS)
    _require(e.d32_n is None or e.d32_n >= 1, "eval.d32_n", e.d32_n, "null or an integer >= 1")


def _require(ok: bool, key: str, value: object, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed: {allowed}")


def _one_of(key: str, value: object, choices: Collection[str]) -> None:
    _require(value in choices, key, value, f"choose one of {', '.join(choices)}")


def _positive(key: str, value: float, allow_inf: bool = False) -> None:
    ok = value > 0 and (allow_inf or math.isfinite(value))
    _require(ok, key, value, "a number > 0" + ("" if allow_inf else ", finite"))


def _at_least(key: str, value: int, low: int) -> None:
    _require(value >= low, key, value, f"an integer >= {low}")


def _device(key: str, value: str) -> None:
    ok = re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", value) is not None
    _require(ok, key, value, "auto, cpu, cuda, cuda:N or mps")
