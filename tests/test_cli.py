"""The command line every command shares (cli/entry.py) and the exit-code table (cli/exit_codes.py).

Each command's main is the console script's entry point (pyproject.toml's [project.scripts]), so calling
`main(argv)` runs what `leaner-train ARGS` runs; two tests start real `python -m` subprocesses. Messages
users read are asserted verbatim. Nothing here starts Ray or trains: dry runs and rejections only.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from support.repo import REPO

from analysis import report
from analysis.claims import __main__ as claims
from cli import console, exit_codes, shadowing
from config.compose import compose
from config.schema import ConfigError
from sweeper import rerun, sweep, train

SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
HYDRA_COMMANDS = {
    "leaner-train": train.main,
    "leaner-sweep": sweep.main,
    "leaner-report": report.main,
    "leaner-claims": claims.main,
}


def run_main(main, argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("script", sorted(HYDRA_COMMANDS))
@pytest.mark.parametrize("where", ["first", "last"])
def test_help_anywhere_prints_the_usage_and_exits_0(script, where, capsys):
    words = ["sweep=paper", "task.d=32"]
    argv = ["--help", *words] if where == "first" else [*words, "--help"]
    code, out, err = run_main(HYDRA_COMMANDS[script], argv, capsys)
    assert code == 0 and err == ""
    module = SCRIPTS[script].split(":")[0].removesuffix(".__main__")  # a package's: python -m PACKAGE
    # The sweep's one flag of its own (sweeper.driver.confirm).
    own = " [--yes]" if script == "leaner-sweep" else ""
    assert out.startswith(
        f"usage: {script} [key=value ...] [--cfg job]{own}   (or: python -m {module} ...)\n"
    )
    assert "  7  nothing to analyse: no training runs in the chosen experiment (report, claims)\n" in out


HELP_SHOWS = {  # a line of each command's options in its --help
    "leaner-train": "  task: ",
    "leaner-sweep": "  sweep: demo, lite, lite-plus, lite32, none, paper, points, smoke\n",
    "leaner-report": "  eval.batches=4\n",
    "leaner-claims": "  select.sweep=null\n",
    "leaner-rerun": "  tracking.uri=URI  the store",
}


@pytest.mark.parametrize("script", sorted(HELP_SHOWS))
def test_help_lists_the_options_and_every_exit_code_and_no_internals(script, capsys):
    code, out, err = run_main({**HYDRA_COMMANDS, "leaner-rerun": rerun.main}[script], ["--help"], capsys)
    assert code == 0 and err == ""
    assert HELP_SHOWS[script] in out
    for row in exit_codes.TABLE:
        assert f"\n  {row.code}  {row.meaning}\n" in out + "\n", row.code
    assert not re.search(r"judge_\w+|Context|`check`", out), "names of the code are not the user's business"
    # nor its modules (but in the `python -m` forms) or constants (but environment variables)
    module = (
        r"(?<!-m )(?<![/\w.])(analysis|sweeper|training|models|tasks|bench|config|tracking\.\w+)\.[a-z_]+"
    )
    constant = r"\b(?<!\$)(?!RUN_ID)[A-Z]{2,}_[A-Z_]+\b"  # RUN_ID: the argument's placeholder
    assert not re.search(f"{module}|{constant}", out), out


@pytest.mark.parametrize("script", sorted(HYDRA_COMMANDS))
def test_verbose_is_taken_anywhere_by_every_command(script, capsys, monkeypatch):
    # Ray Tune: imported by the tests that use it, not at every worker's collection.
    from sweeper.driver import tune

    monkeypatch.setenv(console.VERBOSE, "0")
    word = "eval.batches=1" if "report" in script or "claims" in script else "sweep=smoke"
    code, out, err = run_main(HYDRA_COMMANDS[script], [word, "--verbose", "--cfg", "job"], capsys)
    assert (code, err) == (0, "") and yaml.safe_load(out)
    assert console.verbose() and tune.verbosity() == 2
    run_main(HYDRA_COMMANDS[script], [word, "--cfg", "job"], capsys)
    assert not console.verbose() and tune.verbosity() == 1
    assert os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] == "1"  # no TensorBoard hint from Tune


def test_a_benchmark_run_by_the_bench_command_keeps_its_verbose(monkeypatch, capsys):
    """`python -m bench NAME --verbose` hands the line to NAME's own command, which must not set the console
    quiet again for want of the flag the outer command took."""
    from bench import __main__ as bench

    monkeypatch.setenv(console.VERBOSE, "0")
    assert bench.main(["step_seconds", "--verbose", "--help"]) == 0
    assert console.verbose()
    assert bench.main(["step_seconds", "--help"]) == 0
    assert not console.verbose()


def test_quiet_tune_prints_no_trial_boxes_and_a_table_a_minute(monkeypatch, capsys):
    """sweeper.driver.tune.verbosity sets two class attributes of Ray Tune's reporter, which are not public:
    on a Ray whose reporter moved them this fails (the sweep then still runs, as loud as Tune's default)."""
    from ray.tune.experiment import Trial
    from ray.tune.experimental import output

    from sweeper.driver import tune

    monkeypatch.setenv(console.VERBOSE, "0")
    reporter = output.TuneTerminalReporter(output.AirVerbosity(tune.verbosity()))
    trial = Trial("quiet", config={"x": 1}, stub=True)  # a real trial, never run
    reporter.on_trial_start(0, [trial], trial)
    reporter.on_trial_complete(0, [trial], trial)
    reporter._last_heartbeat_time = time.time() - 45  # Tune redraws its table after 30 s, quiet after 60
    reporter.print_heartbeat([trial])
    assert capsys.readouterr().out == ""


def test_training_commands_list_every_group_option_in_their_help(capsys):
    _, out, _ = run_main(train.main, ["--help"], capsys)
    assert "  tracking: local, server\n" in out
    assert "  sweep: demo, lite, lite-plus, lite32, none, paper, points, smoke\n" in out


@pytest.mark.slow  # two interpreters importing torch and MLflow: about 10 s
def test_help_of_the_real_commands_exits_0():
    """`analysis.report --help` was an error with exit code 1; `task.d=32 --help` a lexer error."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for argv in (["analysis.report", "--help"], ["sweeper.train", "task.d=32", "--help"]):
        done = subprocess.run(
            [sys.executable, "-m", *argv], capture_output=True, text=True, cwd=REPO, env=env, timeout=120
        )
        assert done.returncode == 0 and done.stdout.startswith("usage: leaner-"), done.stderr[-2000:]
        assert "Exception" not in done.stdout + done.stderr


def test_cfg_job_prints_the_composed_config(capsys):
    code, out, _ = run_main(train.main, ["task.d=32", "--cfg", "job", "loss.tau=0.5"], capsys)
    assert code == 0
    assert yaml.safe_load(out) == OmegaConf.to_container(compose(["task.d=32", "loss.tau=0.5"]), resolve=True)
    code, out, _ = run_main(sweep.main, ["sweep=smoke", "--cfg=job"], capsys)
    assert code == 0 and yaml.safe_load(out)["sweep"]["name"] == "smoke"
    code, out, _ = run_main(report.main, ["--cfg", "job", "eval.batches=1", "tracking.experiment=x"], capsys)
    shown = yaml.safe_load(out)
    assert code == 0 and shown["eval"]["batches"] == 1 and shown["tracking"]["experiment"] == "x"


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["-m"],
            "error: not supported: -m (a flag of Hydra's own command line): sweeps are "
            "`leaner-sweep sweep=NAME` (conf/sweep/), not Hydra's multirun",
        ),
        (
            ["--info"],
            "error: not supported: --info (a flag of Hydra's own command line): --help lists the config "
            "groups and --cfg job prints the composed configuration",
        ),
        (
            ["--cfg", "hydra"],
            "error: not supported: --cfg hydra: only --cfg job (the composed configuration)",
        ),
        (
            ["--quiet"],
            "error: not supported: --quiet: the arguments are key=value overrides; --help lists the "
            "config groups and --cfg job prints the composed configuration",
        ),
    ],
)
@pytest.mark.parametrize("script", sorted(HYDRA_COMMANDS))
def test_hydra_flags_we_do_not_support_say_so_in_one_line(script, flags, message, capsys):
    code, out, err = run_main(HYDRA_COMMANDS[script], ["sweep=smoke", *flags], capsys)
    assert (code, out, err) == (exit_codes.CONFIG, "", message + "\n")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["tracking=srv"], "error: tracking=srv is not allowed: choose one of local, server"),
        (
            ["sweep.dryrun=true"],
            "error: unknown key 'sweep.dryrun': allowed keys are name, dry_run, scheduler, asha, search, "
            "axes, baseline, seeds, fixed, subgrids, confirm, confirm_trials, confirm_hours",
        ),
        (["sweep.dry_run=maybe"], "error: sweep.dry_run='maybe' is not allowed: true or false"),
        (
            ["loss.tau=0.3"],
            "error: sweep 'paper', sub-grid 'tau': loss.tau on the command line would be overwritten: "
            "this sub-grid sweeps it (axis 'tau'); change the sweep instead (sweep.baseline, "
            "sweep.subgrids)",
        ),
        (
            ["seed=5"],
            "error: sweep 'paper', sweep.seeds: seed on the command line would be overwritten: each trial "
            "takes its seed from sweep.seeds; set sweep.seeds=[...] instead",
        ),
    ],
)
def test_sweep_rejections_name_the_key_and_what_is_allowed(overrides, message, capsys):
    code, out, err = run_main(sweep.main, ["sweep=paper", "sweep.dry_run=true", *overrides], capsys)
    assert (code, err) == (exit_codes.CONFIG, message + "\n")


def test_a_baseline_key_on_the_command_line_names_the_baseline(capsys):
    code, _, err = run_main(sweep.main, ["sweep=smoke", "sweep.dry_run=true", "optim.lr=0.1"], capsys)
    assert (code, err) == (
        exit_codes.CONFIG,
        "error: sweep 'smoke', sweep.baseline: optim.lr on the command line "
        "would be overwritten: every sub-grid holds it at the baseline lr=0.01; set "
        "sweep.baseline.lr=... instead\n",
    )
    assert (
        run_main(sweep.main, ["sweep=smoke", "sweep.dry_run=true", "sweep.baseline.lr=0.1"], capsys)[0] == 0
    )


@pytest.mark.parametrize(
    "main, words, joined",
    [
        (sweep.main, ["sweep", "=", "smoke", "sweep.dry_run=true"], "sweep=smoke"),
        (sweep.main, ["sweep=", "smoke", "sweep.dry_run=true"], "sweep=smoke"),
        (train.main, ["train.steps", "=3"], "train.steps=3"),
        (report.main, ["select.sweep", "=", "smoke"], "select.sweep=smoke"),
        (rerun.main, ["0123abcd", "tracking.uri", "=", "sqlite:///x.db"], "tracking.uri=sqlite:///x.db"),
    ],
)
def test_an_override_split_at_its_spaces_is_named_whole(main, words, joined, capsys):
    """The shell makes `sweep = smoke` three words: neither 'no sweep chosen' nor "'=' is not an
    override", but what was meant."""
    code, _, err = run_main(main, words, capsys)
    assert code == exit_codes.CONFIG and err.count("\n") == 1, err
    assert f"write {joined} (no spaces" in err and "at the spaces around its '='" in err, err


def test_a_value_with_an_equals_sign_is_shown_quoted(capsys):
    """A PostgreSQL address through a local socket (`?host=/tmp/...`) has an `=` the override grammar
    cannot read unquoted: the command shows the quoted form, not Hydra's "mismatched input '='"."""
    uri = "postgresql://postgres:@/mlflow?host=/tmp/pg"
    code, _, err = run_main(report.main, [f"tracking.uri={uri}"], capsys)
    assert code == exit_codes.CONFIG and err.count("\n") == 1, err
    assert f"quote it, tracking.uri='{uri}'" in err, err
    assert compose([f"tracking.uri='{uri}'"]).tracking.uri == uri


def test_a_list_given_as_one_value_is_shown_in_brackets(capsys):
    code, _, err = run_main(report.main, ["figures=convergence"], capsys)
    assert (code, err) == (
        exit_codes.CONFIG,
        "error: figures='convergence' is not allowed: a list, in brackets: figures=[convergence]\n",
    )


def test_sweep_keys_without_a_sweep_are_rejected():
    with pytest.raises(
        ConfigError,
        match=r"^sweep.dry_run is set but no sweep is chosen: add sweep=NAME "
        r"\(demo, lite, lite-plus, lite32, paper, points, smoke\)$",
    ):
        compose(["sweep.dry_run=true"])
    assert compose([]).sweep is None  # sweep=none: a single run


def test_tracking_defaults_come_from_mlflows_environment_variables(
    monkeypatch, tmp_path, capsys, _empty_store
):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/env.db")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    for group in ("local", "server"):
        tracking = compose([f"tracking={group}"]).tracking
        assert (tracking.uri, tracking.experiment) == (f"sqlite:///{tmp_path}/env.db", "from-env")
    assert (
        compose(["tracking.uri=http://host:5000"]).tracking.uri == "http://host:5000"
    )  # the command line wins
    _, out, _ = run_main(report.main, ["--cfg", "job"], capsys)
    tracking = yaml.safe_load(out)["tracking"]
    assert (tracking["uri"], tracking["experiment"]) == (f"sqlite:///{tmp_path}/env.db", "from-env")
    # rerun reads the same default: an unknown run is looked for in the environment's store.
    shutil.copyfile(_empty_store, tmp_path / "env.db")
    code, _, err = run_main(rerun.main, ["0123456789abcdef0123456789abcdef"], capsys)
    assert code == exit_codes.NO_SUCH_RUN and f"sqlite:///{tmp_path}/env.db" in err
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME")
    tracking = compose([]).tracking
    assert (tracking.uri, tracking.experiment) == ("sqlite:///mlflow.db", "leaner-clustering")


def test_rerun_takes_the_one_override_spelling(capsys):
    code, _, err = run_main(rerun.main, ["RUN", "--tracking-uri", "x"], capsys)
    assert code == exit_codes.CONFIG and "unrecognized arguments: --tracking-uri x" in err
    code, _, err = run_main(rerun.main, ["RUN", "tracking.experiment=x"], capsys)
    assert (code, err) == (
        exit_codes.CONFIG,
        "error: unknown argument 'tracking.experiment=x': the one override is tracking.uri=URI\n",
    )


def test_every_console_script_is_a_command_of_that_name():
    assert set(SCRIPTS) == {
        "leaner-train",
        "leaner-sweep",
        "leaner-rerun",
        "leaner-archive",
        "leaner-unpack",
        "leaner-report",
        "leaner-claims",
        "leaner-seeds",
        "leaner-bench",
        "leaner-scale-probe",
        "leaner-preflight",
        "leaner-mask-store",
    }
    for script, target in SCRIPTS.items():
        module, function = target.split(":")
        main = getattr(importlib.import_module(module), function)
        assert main.script == script, f"{target} is not wrapped by @command({script!r}) of cli/entry.py"


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_console_script_answers_help(script, capsys):
    """--help on every command prints its usage and exits 0 (leaner-mask-store's crashed: it named no
    options to list)."""
    module, function = SCRIPTS[script].split(":")
    code, out, _ = run_main(getattr(importlib.import_module(module), function), ["--help"], capsys)
    assert code == 0 and out.startswith(("usage:", f"usage: {script}")), out[:300]


@pytest.mark.slow  # interpreters importing Ray and MLflow
def test_a_folder_with_its_own_config_and_models_is_named_not_imported(tmp_path):
    """`python -m` puts the current folder first on the import path: a user's config.py and models/ there
    would be imported in place of the project's packages. The command names them in one line (exit 2),
    and the console script, which that folder does not shadow, runs."""
    (tmp_path / "config.py").write_text("x = 1\n")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "sweeper.sweep", "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == exit_codes.CONFIG and done.stdout == "", done.stderr[-3000:]
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: ") and "leaner-* commands" in line, line
    for shadow, package in ((tmp_path / "config.py", "config"), (f"{tmp_path / 'models'}/", "models")):
        assert f"{shadow} shadows the package {package} of {REPO}" in line, line
    script = shutil.which("leaner-sweep", path=str(Path(sys.executable).parent))
    assert subprocess.run([script, "--help"], cwd=tmp_path, env=env, capture_output=True).returncode == 0


def test_the_shadowing_check_knows_every_package_and_the_config_exit_code():
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert set(shadowing.PACKAGES) == {name.rstrip("*") for name in find["include"]} - {"conf"}
    assert shadowing.CONFIG_EXIT == exit_codes.CONFIG
