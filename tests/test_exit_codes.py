"""The exit-code table (cli/exit_codes.py) and the error path every command shares (cli/entry.py).

An error of the table ends a command with one line and its code, whichever form started it: the console
script or `python -m`. Errors whose chain of causes loops (`raise e from e`, as Ray raises a missing
dashboard) end the same way, within seconds: a walk of the chain that does not stop on a cycle hung a
sweep at 100% CPU.
"""

from __future__ import annotations

import ast
import importlib
import shutil
import sqlite3
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support.repo import REPO, subprocess_env

from cli import exit_codes
from config.schema import ConfigError
from tracking.store import TrackingError

SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
# Each command's main and a function it calls first: the test makes that function raise.
FIRST_CALL = {
    "leaner-train": ("sweeper.train", "compose_one"),
    "leaner-sweep": ("sweeper.sweep", "load"),
    "leaner-rerun": ("sweeper.rerun", "rerun"),
    "leaner-report": ("analysis.report", "settings_of"),
    "leaner-claims": ("analysis.claims.__main__", "settings_of"),
    "leaner-seeds": ("analysis.seeds", "settings_of"),
    "leaner-bench": ("bench.__main__", "parse"),
}
ARGV = {"leaner-rerun": ["0123abcd"]}  # the one command with a required argument


def test_every_error_of_the_table_exists_and_maps_to_its_code():
    codes = [row.code for row in exit_codes.TABLE]
    assert codes == sorted(set(codes)) and codes[:4] == [0, 1, 2, 3]
    for row in (r for r in exit_codes.TABLE if r.raised_as):
        module, name = row.raised_as.rsplit(".", 1)
        kind = getattr(importlib.import_module(module), name)
        assert issubclass(kind, Exception)
        subclass = type("Sub", (kind,), {})
        assert exit_codes.code_for(kind("x")) == exit_codes.code_for(subclass("x")) == row.code
    assert exit_codes.code_for(KeyError("x")) is None  # anything else is a bug: re-raised with its traceback


def test_every_command_error_of_the_project_is_in_the_table():
    """Each class declares its own exit code (cli.exit_codes.CommandError): the table names every one, so
    docs/commands.md lists them all (the test above checks each named class answers its row's code)."""
    packages = [p for p in REPO.iterdir() if (p / "__init__.py").exists() and p.name != "tests"]
    declared = set()
    for path in (source for package in packages for source in package.rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                ast.unparse(b).endswith("CommandError") for b in node.bases
            ):
                declared.add(f"{module}.{node.name}")
    assert declared == {row.raised_as for row in exit_codes.TABLE if row.raised_as}


def test_a_class_of_the_same_name_is_not_the_tables():
    """Matched by class: `__main__.ClusterError` (the class `python -m sweeper.sweep` defined when it lived
    there) or any other class named alike is not the table's."""
    for row in (r for r in exit_codes.TABLE if r.raised_as):
        module, name = row.raised_as.rsplit(".", 1)
        importlib.import_module(module)
        impostor = type(name, (Exception,), {"__module__": module})
        assert exit_codes.code_for(impostor("x")) is None, row.raised_as


def test_no_error_of_the_table_lives_in_a_module_run_as_main():
    """A module run with `python -m` is `__main__`: a class it defines is another class than the one its
    importers see, and its error would escape the table (a traceback and exit code 1)."""
    run_as_main = {target.split(":")[0] for target in SCRIPTS.values()}
    for row in (r for r in exit_codes.TABLE if r.raised_as):
        module = row.raised_as.rsplit(".", 1)[0]
        source = Path(importlib.import_module(module).__file__)
        assert module not in run_as_main and source.name != "__main__.py", row.raised_as
        assert 'if __name__ == "__main__"' not in source.read_text(), row.raised_as


def test_the_old_path_of_sweep_locked_works_for_one_release_with_a_warning(monkeypatch):
    """sweeper.lock.SweepLocked, the table's class for code 8 until the driver moved into sweeper/driver/,
    is the same class for one more release, and importing it says where it is now."""
    from sweeper.errors import SweepLocked

    monkeypatch.delitem(sys.modules, "sweeper.lock", raising=False)  # imported afresh: its warning comes
    with pytest.warns(DeprecationWarning, match="import SweepLocked from sweeper.errors"):
        old = importlib.import_module("sweeper.lock")
    assert old.SweepLocked is SweepLocked and exit_codes.code_for(old.SweepLocked("x")) == exit_codes.LOCKED


def looping(kind: type[Exception]) -> list[BaseException]:
    """Errors of `kind` whose chain of causes loops: its own cause, a two-error cycle, its own context."""
    alone = kind("its own cause")
    alone.__cause__ = alone
    first, second = kind("first of two"), ValueError("second of two")
    first.__cause__, second.__cause__ = second, first
    context = kind("context of itself")
    context.__context__ = context
    return [alone, first, context]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("script", sorted(FIRST_CALL))
@pytest.mark.parametrize(
    "kind,code", [(ConfigError, exit_codes.CONFIG), (TrackingError, exit_codes.TRACKING)]
)
def test_an_error_whose_causes_loop_ends_the_command_in_one_line(script, kind, code, monkeypatch, capsys):
    module, first = FIRST_CALL[script]
    main = importlib.import_module(module).main
    for err in looping(kind):

        def fail(*_args, err=err, **_kwargs):
            raise err

        monkeypatch.setattr(f"{module}.{first}", fail)
        assert main(ARGV.get(script, [])) == code
        out, printed = capsys.readouterr()
        assert printed == f"error: {err}\n" and out == ""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("script", sorted(FIRST_CALL))
def test_an_unknown_error_whose_causes_loop_is_raised_not_walked_forever(script, monkeypatch):
    """Ray's `raise e from e` of a missing dashboard: not an error of the table, so a bug's traceback, but
    at once (the walk looking for an explanation attached to one of its causes stops on the cycle)."""
    module, first = FIRST_CALL[script]
    main = importlib.import_module(module).main
    for err in looping(Exception):

        def fail(*_args, err=err, **_kwargs):
            raise err

        monkeypatch.setattr(f"{module}.{first}", fail)
        with pytest.raises(Exception) as raised:
            main(ARGV.get(script, []))
        assert raised.value is err


@pytest.mark.timeout(60)
def test_an_explanation_in_a_loop_of_causes_is_found():
    """A library's error (here SQLite's) carrying the CommandError that explains it, deep in a chain of
    causes that loops: found, and the walk ends; an error without one is not explained."""
    damaged = sqlite3.DatabaseError("database disk image is malformed")
    explanation = TrackingError(
        "tracking store sqlite:///x.db: SQLite says 'database disk image is malformed'"
    )
    exit_codes.attach(damaged, explanation)
    wrapper = RuntimeError("while logging")
    wrapper.__cause__, damaged.__context__ = damaged, wrapper
    assert exit_codes.explained(wrapper) is explanation
    assert exit_codes.explained(looping(Exception)[1]) is None
    assert exit_codes.explained(explanation) is explanation  # a CommandError explains itself


def forms(command: str) -> list[list[str]]:
    """The two documented ways to start a command: `python -m MODULE` and its console script."""
    script = next(s for s, target in SCRIPTS.items() if target.split(":")[0] == command)
    installed = shutil.which(script, path=str(Path(sys.executable).parent))
    assert installed, f"{script} is not installed next to {sys.executable}: pip install -e ."
    return [[sys.executable, "-m", command], [installed]]


@pytest.mark.slow  # four interpreters importing MLflow (and torch): about a minute on two cores
@pytest.mark.parametrize(
    "command,args,code,message",
    [
        ("sweeper.rerun", ["0123456789abcdef"], exit_codes.NO_SUCH_RUN, "error: run 0123456789abcdef is not"),
        (
            "sweeper.sweep",
            ["sweep=smoke", "cluster.address=127.0.0.1:1"],
            exit_codes.CLUSTER,
            "error: Ray cluster cluster.address=127.0.0.1:1 is unreachable",
        ),
    ],
)
def test_documented_errors_answer_alike_from_both_forms(command, args, code, message, tmp_path, _empty_store):
    """`python -m sweeper.rerun BAD_ID` printed a 15-line traceback and exit code 1 where `leaner-rerun`
    printed one line and exit code 9: the class was matched by its module's name, `__main__` there."""
    shutil.copyfile(_empty_store, tmp_path / "mlflow.db")  # rerun looks for its run in a store, creating none
    env = {**subprocess_env(), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    for form in forms(command):
        done = subprocess.run(
            [*form, *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
        )
        assert done.returncode == code, done.stderr[-3000:]
        assert done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr[-3000:]
        assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.slow  # an interpreter importing the sweep's command line: about 3 s
def test_a_reader_that_leaves_early_ends_the_command_quietly(tmp_path):
    """`leaner-sweep --cfg job | head -1`: the pipe closes before the command writes; it was a 60-line
    BrokenPipeError traceback, exit 1."""
    command = subprocess.Popen(
        [sys.executable, "-m", "sweeper.sweep", "--cfg", "job"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=subprocess_env(),
    )
    command.stdout.close()  # the reader leaves before the interpreter has started
    _, err = command.communicate(timeout=120)
    assert (command.returncode, err.decode()) == (exit_codes.SIGPIPE_STOP, "")
