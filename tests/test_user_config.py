"""A user config directory searched before conf/ (`--config-dir DIR`, `hydra.searchpath=[DIR]`,
$LEANER_CONFIG_DIR): a new sweep, a new option of a group, a file that replaces conf/'s; and the sweeps the
configuration refuses before Ray starts. The same from a wheel install: tests/test_packaging.py."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from support.configs import GAMMA_LR, PACED
from support.once import assert_every_job_once_every_point_once
from support.repo import REPO
from support.sweeps import interrupted_runs, kill_group, wait_for

from analysis.report import main as report_main
from cli import exit_codes
from cli.entry import CONFIG_DIR_ENV
from config.compose import compose, group_options, sweep_names, user_config_dirs
from config.identity import config_hash
from config.schema import ConfigError
from sweeper.sweep import load
from sweeper.sweep import main as sweep_main
from sweeper.train import main as train_main
from tracking.view import TAG

MINE = """# @package sweep
defaults: [smoke, _self_]
name: mine
seeds: [7, 8]
"""
WIDE = """defaults: [paper, _self_]
qkv_mult: 2
"""
SMOKE_REPLACED = """# @package sweep
defaults: [paper, _self_]
name: smoke
seeds: [9]
subgrids:
  - {name: smoke, embedding: [onehot]}
"""
LOOP = """# @package sweep
defaults: [loop, _self_]
"""


@pytest.fixture
def user_dir(tmp_path):
    """A user config directory: sweep=mine, model=wide, and a smoke sweep of its own."""
    (tmp_path / "sweep").mkdir()
    (tmp_path / "model").mkdir()
    (tmp_path / "sweep" / "mine.yaml").write_text(MINE)
    (tmp_path / "sweep" / "smoke.yaml").write_text(SMOKE_REPLACED)
    (tmp_path / "model" / "wide.yaml").write_text(WIDE)
    (tmp_path / "sweep" / "loop.yaml").write_text(LOOP)
    return tmp_path


def test_a_user_directory_adds_sweeps_and_options_and_is_searched_first(user_dir):
    searched = [f"hydra.searchpath=[{user_dir}]"]
    cfg = compose([*searched, "sweep=mine", "model=wide"])
    assert (cfg.sweep.name, list(cfg.sweep.seeds), cfg.model.qkv_mult) == ("mine", [7, 8], 2)
    assert cfg.model.embedding == "onehot"  # the rest of model=wide is conf/model/paper.yaml's
    assert list(compose([*searched, "sweep=smoke"]).sweep.seeds) == [9]  # the user's smoke, not conf/'s
    assert list(compose(["sweep=smoke"]).sweep.seeds) == [153476998, 235510766]
    assert group_options("model", user_config_dirs(searched)) == ["paper", "wide"]
    assert "mine" in sweep_names(user_config_dirs(searched)) and "mine" not in sweep_names()
    with pytest.raises(ConfigError, match=r"model=tall is not allowed: choose one of paper, wide"):
        compose([*searched, "model=tall"])
    with pytest.raises(ConfigError, match=r"^the defaults lists of sweep=loop .* include themselves"):
        compose([*searched, "sweep=loop"])
    with pytest.raises(ConfigError, match=r"hydra.searchpath='/no/such/dir' is not allowed: an existing dir"):
        compose(["hydra.searchpath=[/no/such/dir]"])


def test_a_sweeps_trials_compose_with_the_user_directory(user_dir, tmp_path, monkeypatch):
    """The driver hands its trials the user directories as one override of absolute paths (a Ray worker has
    another working directory, and on a cluster not the driver's environment): each trial composes what the
    driver planned, config_hash for config_hash, as sweeper.driver.trial.run_trial checks."""
    monkeypatch.chdir(user_dir.parent)
    overrides = [f"hydra.searchpath=[{user_dir.name}]", "sweep=mine", "model=wide"]
    sweep = load(overrides)
    base = list(sweep.base)
    assert base == [f"hydra.searchpath=['{user_dir}']", "model=wide"]
    monkeypatch.chdir(REPO)
    for job in sweep.jobs:
        trial = compose([*base, *job.configuration.override_strings(), f"seed={job.seed}"])
        assert config_hash(trial) == job.key and trial.model.qkv_mult == 2


def test_config_dir_flag_on_a_command_line(user_dir, capsys, monkeypatch):
    monkeypatch.delenv(CONFIG_DIR_ENV, raising=False)
    assert train_main(["-cd", str(user_dir), "sweep=mine", "model=wide", "--cfg", "job"]) == 0
    shown = capsys.readouterr().out
    assert "  qkv_mult: 2\n" in shown and "  name: mine\n" in shown
    assert sweep_main([f"--config-dir={user_dir}", "sweep=mine", "sweep.dry_run=true"]) == 0
    # mine extends smoke, which the user's directory replaces (one configuration): searched first.
    assert capsys.readouterr().out.splitlines()[-1] == "1 configurations x 2 seeds = 2 trials"
    assert CONFIG_DIR_ENV not in os.environ  # the command's own: main called in-process leaves none behind
    monkeypatch.setenv(CONFIG_DIR_ENV, str(user_dir))
    assert sweep_main(["sweep=mine", "sweep.dry_run=true"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 configurations x 2 seeds = 2 trials"
    assert train_main(["--help"]) == 0
    assert "  model: paper, wide\n" in capsys.readouterr().out
    monkeypatch.delenv(CONFIG_DIR_ENV)
    for line in (["-cd", str(user_dir / "nope")], ["sweep=smoke", "--config-dir"]):
        assert sweep_main(line) == 2
        (err,) = capsys.readouterr().err.splitlines()
        assert err.startswith("error: ") and "is not a directory" in err, err


def test_asha_with_packs_of_shapes_is_refused_before_ray(tmp_path):
    """sweep.scheduler=asha decides on a trial's one value, a pack's median: with cluster.pack=shapes it
    would stop unrelated configurations together. The real command refuses it, one line, exit 2, before
    Ray is imported or the store created."""
    store = tmp_path / "mlflow.db"
    line = [
        "sweep=smoke",
        "sweep.scheduler=asha",
        "cluster.pack=shapes",
        f"tracking.uri=sqlite:///{store}",
        f"cluster.storage={tmp_path / 'ray'}",
    ]
    probe = f"import sys; from sweeper.sweep import main; print(main({line!r}), 'ray' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr[-2000:]
    assert done.stderr.splitlines() == [
        "error: cluster.pack='shapes' is not allowed: with sweep.scheduler=asha choose cluster.pack=none or "
        "seeds (a pack of shapes holds unrelated configurations, which ASHA would stop together), or "
        "sweep.scheduler=none"
    ]
    assert sorted(tmp_path.iterdir()) == []
    load(["sweep=smoke", "sweep.scheduler=asha", "cluster.pack=seeds"])  # a pack of one configuration's seeds


# A new user's mistakes (issue 59), each answered by the console script in one line with exit 2 (a
# configuration error) before anything starts.
MISTAKES = [
    (
        ["sweep.seeds=3"],
        "error: sweep.seeds=3 is not allowed: a list, in brackets: sweep.seeds=[0,1,2] for 3 seeds "
        "(sweep.seeds=[3] is the one seed 3)",
    ),
    (
        ["lr=0.1"],
        "error: unknown key 'lr': did you mean optim.lr? allowed keys are task, model, loss, optim, train, "
        "tracking, cluster, seed, sweep",
    ),
    (
        ["sweep.subgrids=[{name: mine, gamma: [1, 2]}]"],
        "error: sweep 'smoke', axis 'gamma': unknown axis 'gamma'; allowed axes: tau, regularizer, "
        "embedding, d, k, family, lr; declare a new one in the sweep's axes, name -> config key: "
        "+sweep.axes.gamma=model.gamma, or axes: {gamma: model.gamma} in its file "
        "(docs/configuration.md, 'Declaring an axis of your own')",
    ),
]


@pytest.mark.slow  # three interpreters importing Hydra and the config tree
def test_a_new_users_mistakes_are_answered_in_one_line_by_the_console_script(tmp_path):
    script = os.path.join(os.path.dirname(sys.executable), "leaner-sweep")
    for words, line in MISTAKES:
        done = subprocess.run(
            [script, "sweep=smoke", "sweep.dry_run=true", *words],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (done.returncode, done.stderr.splitlines()) == (2, [line]), done.stderr[-2000:]
    # The hint's declaration works as written.
    declared = [
        "sweep=smoke",
        "sweep.subgrids=[{name: mine, gamma: [1, 2]}]",
        "+sweep.axes.gamma=model.gamma",
    ]
    assert [c.overrides["model.gamma"] for c in load(declared).plan.configurations] == [1, 2]


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder on a read-only tmpfs mount: what root cannot write either (a chmod would not stop root)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.slow  # three interpreters importing torch and MLflow
def test_report_and_claims_in_a_read_only_folder_say_so_in_one_line(read_only_folder, sqlite_uri, tiny):
    """Run where the report folder cannot be written (a colleague's results, a read-only mount), leaner-report
    and leaner-claims refuse before any work, naming `out`, exit 2: not a traceback under exit 1 ('some
    figures failed')."""
    bin_dir = os.path.dirname(sys.executable)
    trained = subprocess.run(
        [os.path.join(bin_dir, "leaner-train"), *tiny, f"tracking.uri={sqlite_uri}"],
        cwd=read_only_folder.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    for script in ("leaner-report", "leaner-claims"):
        done = subprocess.run(
            [os.path.join(bin_dir, script), f"tracking.uri={sqlite_uri}"],
            cwd=read_only_folder,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert (done.returncode, done.stderr.splitlines()) == (
            2,
            [
                "error: out='reports' is not allowed: reports/leaner-clustering cannot be written (Read-only "
                "file system); set out=DIR to a folder you can write"
            ],
        ), done.stderr[-2000:]


@pytest.mark.slow  # a real sweep of 4 tiny models on the worker's local Ray
def test_a_users_axes_name_its_runs_tag_them_and_head_the_view(tmp_path, sqlite_uri, local_ray):
    """A user's gamma x lr sweep: each axis in every run name and configuration tag (gamma only in an axis of
    the user's, lr as the paper's names spell it), and the experiment's runs view shows both as columns,
    rows sorted by val_rel_lloyd, with no chart for the parent run's model-steps a second."""
    (tmp_path / "mine" / "sweep").mkdir(parents=True)
    (tmp_path / "mine" / "sweep" / "gamma-lr.yaml").write_text(GAMMA_LR)
    line = ["-cd", str(tmp_path / "mine"), "sweep=gamma-lr", f"tracking.uri={sqlite_uri}"]
    assert sweep_main([*line, f"cluster.storage={tmp_path / 'ray'}"]) == 0
    client = MlflowClient(tracking_uri=sqlite_uri)
    experiment = client.get_experiment_by_name("leaner-clustering")
    runs = [r for r in client.search_runs([experiment.experiment_id]) if r.data.params]
    names = sorted(r.info.run_name for r in runs)
    assert names == [
        "OH-L2 tau1 d4 k6 n16 gamma0.5 s1",
        "OH-L2 tau1 d4 k6 n16 gamma1 s1",
        "OH-L2 tau1 d4 k6 n16 lr0.03 gamma0.5 s1",
        "OH-L2 tau1 d4 k6 n16 lr0.03 gamma1 s1",
    ]
    configurations = {r.info.run_name: r.data.tags["configuration"] for r in runs}
    assert all(tag.startswith(name.removesuffix(" s1") + " #") for name, tag in configurations.items())
    view = json.loads(json.loads(experiment.tags[TAG])["state"])
    assert {"params.`model.gamma`", "params.`optim.lr`"} <= set(view["selectedColumns"])
    assert (view["orderByKey"], view["orderByAsc"]) == ("metrics.`val_rel_lloyd`", True)
    hidden = {c["metricKey"] for c in view["compareRunCharts"] if c["deleted"]}
    assert "model_steps_per_s" in hidden
    # The report compares the axes: per value of each, the median of its runs' final val_rel_lloyd.
    report = ["figures=[convergence]", f"tracking.uri={sqlite_uri}", f"out={tmp_path / 'reports'}"]
    assert report_main(report) == 0
    axes = pd.read_csv(tmp_path / "reports" / "leaner-clustering" / "axes.csv")
    final = {r.info.run_name: r.data.metrics["val_rel_lloyd"] for r in runs}
    assert sorted(zip(axes["axis"], axes["value"].astype(float))) == [
        ("model.gamma", 0.5),
        ("model.gamma", 1.0),
        ("optim.lr", 0.01),
        ("optim.lr", 0.03),
    ]
    for row in axes.to_dict("records"):
        word = f"gamma{row['value']:g}" if row["axis"] == "model.gamma" else "lr0.03"
        wanted = row["axis"] == "model.gamma" or row["value"] > 0.01  # names with the word, else without
        has = [v for name, v in final.items() if (word in name) == wanted]
        assert (row["configurations"], row["finished runs"]) == (2, 2)
        assert row["median final val_rel_lloyd"] == pytest.approx(float(np.median(has)), rel=1e-12)


@pytest.mark.slow  # the console script twice, the second a real sweep of 4 tiny models
def test_the_printed_resume_command_is_the_one_typed_and_resumes_a_users_sweep(tmp_path, sqlite_uri):
    """leaner-sweep with --config-dir, stopped by its time budget before any trial: the resume hint is the
    command as typed (the console script, the directory, the words); run as printed (with a budget that
    fits), it finishes the sweep, and its parent run's command tag is that command too."""
    (tmp_path / "mine" / "sweep").mkdir(parents=True)
    (tmp_path / "mine" / "sweep" / "gamma-lr.yaml").write_text(GAMMA_LR)
    script = os.path.join(os.path.dirname(sys.executable), "leaner-sweep")
    words = ["sweep=gamma-lr", f"tracking.uri={sqlite_uri}", f"cluster.storage={tmp_path / 'ray'}"]
    typed = [script, "-cd", "mine", *words, "cluster.time_budget_s=0.001"]
    env = {k: v for k, v in os.environ.items() if k != CONFIG_DIR_ENV}
    stopped = subprocess.run(typed, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert stopped.returncode == 75, stopped.stdout[-2000:] + stopped.stderr[-2000:]
    hint = stopped.stdout.split("Resume with the same command:\n  ")[1].splitlines()[0]
    expected = ["leaner-sweep", "--config-dir", str(tmp_path / "mine"), *words, "cluster.time_budget_s=0.001"]
    assert shlex.split(hint) == expected
    again = [script, *shlex.split(hint)[1:-1], "cluster.time_budget_s=600"]
    done = subprocess.run(again, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    client = MlflowClient(tracking_uri=sqlite_uri)
    (parent,) = client.search_runs(
        [client.get_experiment_by_name("leaner-clustering").experiment_id],
        "tags.command LIKE 'leaner-sweep %'",
    )
    assert parent.data.tags["command"] == shlex.join(["leaner-sweep", *again[1:]])


@pytest.mark.slow
def test_a_users_sweep_stopped_by_ctrl_c_resumes_by_its_printed_command(tmp_path, sqlite_uri):
    """leaner-sweep with --config-dir, Ctrl-C (SIGINT to its process group, as a terminal sends it) once a
    trial has checkpointed: exit 130 and the resume hint is the command as typed; run as printed it ends the
    sweep, every model with one run and every metric point once (paced steps: a test-only pause that changes
    no number)."""
    (tmp_path / "mine" / "sweep").mkdir(parents=True)
    (tmp_path / "mine" / "sweep" / "gamma-lr.yaml").write_text(GAMMA_LR)
    script = os.path.join(os.path.dirname(sys.executable), "leaner-sweep")
    words = [
        "sweep=gamma-lr",
        "train.steps=400",
        f"tracking.uri={sqlite_uri}",
        f"cluster.storage={tmp_path}/ray",
    ]
    env = {k: v for k, v in os.environ.items() if k != CONFIG_DIR_ENV}
    log = tmp_path / "driver.log"
    with open(log, "wb") as out:
        driver = subprocess.Popen(
            [script, "-cd", "mine", *words],
            cwd=tmp_path,
            env={**env, **PACED},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: interrupted_runs(sqlite_uri, "gamma-lr"), driver, 300, "a trial checkpointed")
        os.killpg(driver.pid, signal.SIGINT)
        code = driver.wait(timeout=120)
    finally:
        kill_group(driver)
    out = log.read_text()
    assert code == exit_codes.SIGINT_STOP, out[-3000:]
    hint = out.split("Resume with the same command:\n  ")[1].splitlines()[0]
    assert shlex.split(hint) == ["leaner-sweep", "--config-dir", str(tmp_path / "mine"), *words]
    done = subprocess.run([script, *shlex.split(hint)[1:]], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    jobs = load([f"hydra.searchpath=[{tmp_path / 'mine'}]", *words]).jobs
    assert_every_job_once_every_point_once(
        sqlite_uri, "leaner-clustering", jobs, ["train.steps=400"], "gamma-lr"
    )
