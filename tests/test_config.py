"""The config tree: paper defaults, one clear error per bad value, hashing, params round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from cli import exit_codes
from cli.entry import CONFIG_DIR_ENV
from config.compose import compose
from config.defaults import default
from config.identity import (
    config_hash,
    configuration_hash,
    configuration_name,
    flat_params,
    operational_values,
    run_config,
    run_name,
    run_overrides,
)
from config.run import RunSpec
from config.schema import RUN_GROUPS, ConfigError
from models.embedding import EMBEDDINGS
from models.losses import REGULARIZERS
from sweeper.train import main
from tasks.spec import FAMILIES
from training.device import pick_device
from training.trainer import Trainer


def test_defaults_are_the_papers():
    cfg = compose()
    # docs/science.md section 5 and the docs/science.md section 6 baseline.
    assert (cfg.optim.lr, cfg.optim.lr_factor, cfg.optim.lr_patience) == (0.01, 0.5, 5)
    assert (cfg.train.batch, cfg.task.n, cfg.train.steps, cfg.train.eval_every, cfg.train.val_batches) == (
        32,
        512,
        10_000,
        50,
        10,
    )
    assert (cfg.loss.tau, cfg.loss.regularizer, cfg.model.embedding) == (1.0, "l2", "onehot")
    assert (cfg.task.d, cfg.task.k, cfg.task.family, cfg.task.scale) == (4, 6, "normal", 0.1)
    assert (cfg.model.gamma, cfg.model.dropout, cfg.seed) == (1.0, 0.01, 153476998)
    assert cfg.tracking.uri == "sqlite:///mlflow.db"
    assert cfg.cluster.address is None


def test_default_reads_what_compose_gives(monkeypatch):
    """config.defaults reads conf/'s files without Hydra: the value of every key of the run groups is the one
    a composition with no overrides has (and no user config directory)."""
    monkeypatch.delenv(CONFIG_DIR_ENV, raising=False)
    cfg = compose()
    for group in RUN_GROUPS:
        for name, value in cfg[group].items():
            assert default(f"{group}.{name}") == value, f"{group}.{name}"


@pytest.mark.parametrize(
    "override, key, allowed",
    [
        ("task.foo=1", "task.foo", "family"),
        ("nothing=1", "nothing", "task"),
        ("task.d=abc", "task.d", "integer"),
        ("train.steps=1.5", "train.steps", "integer"),
        ("task.equal_weights=maybe", "task.equal_weights", "true or false"),
        ("loss.tau=0", "loss.tau", "> 0"),
        ("loss.tau=-0.5", "loss.tau", "> 0"),
        ("optim.lr=0", "optim.lr", "> 0"),
        ("optim.lr_factor=1.5", "optim.lr_factor", "(0, 1)"),
        ("model.embedding=sparse", "model.embedding", ", ".join(EMBEDDINGS)),
        ("loss.regularizer=l1", "loss.regularizer", ", ".join(REGULARIZERS)),
        ("task.family=uniform", "task.family", ", ".join(FAMILIES)),
        ("task.init=kmeans", "task.init", "gonzalez"),
        ("task.k=1", "task.k", ">= 2"),
        ("task.n=5", "task.n", ">= k"),
        ("model.dropout=1.0", "model.dropout", "[0, 1)"),
        ("train.device=gpu", "train.device", "cuda"),
        ("train.resume=sometimes", "train.resume", "auto, never, must"),
        ("cluster.max_concurrent=0", "cluster.max_concurrent", ">= 1"),
        ("cluster.pack=configs", "cluster.pack", "none, seeds"),
        ("train.compile=jit", "train.compile", "off, inductor, cudagraphs, aot_eager"),
        ("task=nonexistent", "task=nonexistent is not allowed", "choose one of paper"),
        ("tracking=srv", "tracking=srv is not allowed", "choose one of local, server"),
    ],
)
def test_bad_value_gives_one_clear_error(override, key, allowed):
    with pytest.raises(ConfigError) as err:
        compose([override])
    message = str(err.value)
    assert key in message and allowed in message
    assert "\n" not in message
    if "unknown key" not in message and "/" not in key:
        assert override.split("=", 1)[1].split(".")[0] in message  # the rejected value is named


def test_a_variable_read_from_an_unset_environment_variable_is_one_line_naming_both(monkeypatch):
    """Hydra reads ${oc.env:NAME} only when validation asks for the value: it ended in a traceback."""
    monkeypatch.delenv("LEANER_NOT_SET", raising=False)
    for override in (
        "optim.lr_patience=${oc.env:LEANER_NOT_SET}",
        "tracking.experiment=${oc.env:LEANER_NOT_SET}",
    ):
        with pytest.raises(ConfigError) as err:
            compose([override])
        message = str(err.value)
        assert message.startswith(f"{override.split('=')[0]} cannot be read: ") and "\n" not in message
        assert "'LEANER_NOT_SET' not found" in message
    monkeypatch.setenv("LEANER_NOT_SET", "3")
    assert compose(["optim.lr_patience=${oc.env:LEANER_NOT_SET}"]).optim.lr_patience == 3


def test_cudagraphs_needs_a_cuda_device():
    with pytest.raises(ConfigError, match="train.compile.*CUDA"):
        compose(["train.compile=cudagraphs", "train.device=cpu"])
    if (
        not torch.cuda.is_available()
    ):  # train.device=auto resolves to the CPU here: caught when training starts
        with pytest.raises(ConfigError, match="train.compile=cudagraphs needs a CUDA device"):
            Trainer(RunSpec.of(compose(["train.compile=cudagraphs"])), pick_device("auto"))


def test_hash_is_per_configuration_and_seed():
    base = compose()
    assert config_hash(base) == config_hash(compose())
    assert config_hash(base) != config_hash(compose(["seed=235510766"]))
    assert config_hash(base) != config_hash(compose(["loss.tau=0.1"]))
    assert config_hash(base) != config_hash(
        compose(["train.compile=inductor"])
    )  # compiled kernels round differently
    # Where and how a run executes is not part of what it computes.
    same = compose(
        [
            "tracking.uri=http://example:5000",
            "train.device=cpu",
            "train.resume=never",
            "train.workdir=/elsewhere",
            "cluster.address=auto",
            "cluster.pack=seeds",
            "sweep=paper",
        ]
    )
    assert config_hash(same) == config_hash(base)
    assert set(run_config(base)) == {"task", "model", "loss", "optim", "train", "seed"}


def test_run_name_is_readable_and_the_configuration_seed_free():
    overrides = ["task.d=32", "task.k=10", "model.embedding=binary", "loss.tau=0.1"]
    cfg = compose(overrides)
    configuration = f"BN-L2 tau0.1 d32 k10 n512 #{configuration_hash(cfg)[:6]}"
    assert configuration_name(cfg) == configuration
    assert run_name(cfg, "paper") == "BN-L2 tau0.1 d32 k10 n512 s153476998"
    assert run_name(cfg) == "BN-L2 tau0.1 d32 k10 n512 s153476998 train"  # outside a sweep
    # The family and the learning rate are spelt when they are not the paper's usual normal and 0.01.
    other = compose(["model.embedding=none", "loss.regularizer=ne", "task.family=cauchy", "optim.lr=0.1"])
    assert run_name(other, "paper") == "NA-NE tau1 d4 k6 n512 cauchy lr0.1 s153476998"
    # One configuration for every seed; another for anything that changes the numbers, the axes or not.
    assert configuration_name(compose([*overrides, "seed=1"])) == configuration
    assert configuration_hash(compose(["train.steps=20"])) != configuration_hash(compose())
    assert configuration_hash(compose(["train.device=cpu", "tracking.experiment=x"])) == configuration_hash(
        compose()
    )


def flat(tree: dict, prefix: str = "") -> dict:
    """Leaves of a nested dict with dotted keys (the test's own walk)."""
    out = {}
    for key, value in tree.items():
        out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def test_a_run_spec_is_the_validated_configuration_and_its_identity_derived_once():
    cfg = compose(["seed=7", "loss.tau=0.1"])
    run = RunSpec.of(cfg)
    assert (run.cfg, run.key, run.config, run.name) == (cfg, config_hash(cfg), run_config(cfg), run_name(cfg))
    assert (run.params, run.configuration) == (flat_params(cfg), configuration_name(cfg))
    assert run.operational == operational_values(cfg)
    cfg.loss.tau = -1.0  # past composition: the description validates what it describes
    with pytest.raises(ConfigError, match=r"loss.tau=-1.0 is not allowed"):
        RunSpec.of(cfg)


def test_params_rebuild_the_same_configuration():
    cfg = compose(
        ["task.init=kmeans++", "loss.tau=0.25", "model.gamma=inf", "task.equal_weights=false", "seed=1"]
    )
    params = flat_params(cfg)
    assert params["task.init"] == "kmeans++"
    # Where and how it ran is no param (it would crowd MLflow's column picker): only what determines the
    # numbers.
    assert not [k for k in params if k.startswith(("tracking.", "cluster.", "sweep"))]
    assert not {"train.workdir", "train.device", "train.resume"} & set(params)
    assert all(isinstance(v, str) for v in params.values())
    assert run_config(compose(run_overrides(params))) == run_config(cfg)
    # ... which the run carries as tags instead: with its params, every value of the config but the sweep's.
    tags = operational_values(cfg)
    assert not set(tags) & set(params) and tags["train.device"] == cfg.train.device
    leaves = {k for k in flat(OmegaConf.to_container(cfg, resolve=True)) if k.split(".")[0] != "sweep"}
    assert set(params) | set(tags) == leaves
    secret = operational_values(compose(["tracking.uri=http://ann:s3cret@mlflow:5000"]))["tracking.uri"]
    assert secret == "http://ann:***@mlflow:5000", "credentials in a URI stay out of the tags"


def test_cli_rejects_a_bad_config_before_writing_anything(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["loss.tau=0"]) == exit_codes.CONFIG
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "loss.tau" in err
    assert list(tmp_path.iterdir()) == []  # no mlflow.db, no runs/


def test_retiring_a_key_keeps_the_hashes_and_reruns_of_earlier_runs():
    """train.inject_nan_at_step left the schema; runs recorded with it (as null) keep their config_hash.

    The hashes below were computed by the code before the key was retired (commit de8c7e0).
    """
    earlier = {
        "": "ad5d220245ee9f9c",
        "task.d=32 task.k=10 model.embedding=binary loss.tau=0.1": "8ff3de1bc79c6c71",
    }
    for overrides, recorded in earlier.items():
        cfg = compose(overrides.split())
        assert config_hash(cfg) == recorded
        params = {**flat_params(cfg), "train.inject_nan_at_step": "null"}  # what such a run logged
        assert config_hash(compose(run_overrides(params))) == recorded


def test_adding_train_deterministic_keeps_the_hashes_and_reruns_of_earlier_runs():
    """train.deterministic joined the schema (default true, which every earlier run had in effect: CPU
    kernels are deterministic, and no CUDA run was recorded): at true it is left out of the hash, so the
    hashes computed before it (test_retiring_a_key_keeps_the_hashes_and_reruns_of_earlier_runs) hold."""
    cfg = compose()
    assert cfg.train.deterministic is True and config_hash(cfg) == "ad5d220245ee9f9c"
    params = flat_params(cfg)
    assert params["train.deterministic"] == "true"  # recorded with the run, as any value that sets numbers
    earlier = {k: v for k, v in params.items() if k != "train.deterministic"}  # what such a run logged
    assert config_hash(compose(run_overrides(earlier))) == config_hash(cfg)
    # Off, CUDA may sum in another order: another configuration.
    fast = compose(["train.deterministic=false"])
    assert config_hash(fast) != config_hash(cfg) and flat_params(fast)["train.deterministic"] == "false"
    assert config_hash(compose(run_overrides(flat_params(fast)))) == config_hash(fast)
