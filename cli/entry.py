"""What every command line shares: train, sweep, rerun, report, claims and bench.

`@command("leaner-train")` wraps a command's `main(argv) -> int`, so that each command answers alike:

- `--help` (or `-h`) anywhere on the line prints the usage and exits 0;
- `--cfg job` prints the composed configuration, resolved, and exits 0;
- `--verbose` prints everything Ray, Tune and MLflow print (cli.console; quiet by default);
- `--config-dir DIR` (or `-cd DIR`, repeatable) adds a user config directory, searched before conf/: for
  the command's life it is put first in $LEANER_CONFIG_DIR (config.compose.user_config_dirs), which the
  workers of a local Ray instance inherit and a sweep's trials get as an override;
- Hydra's other flags (`-m`, `--info`, `--cfg hydra`, ...) answer "not supported: ..." with exit code 2:
  the commands compose conf/ themselves (config.compose.compose), so Hydra's own parser never sees them;
- a CommandError (cli.exit_codes) raised by main ends the command with `error: ...` on stderr and the
  exit code of its class; so does another library's error that carries one (cli.exit_codes.explained: a
  SQLite error of a store carries the TrackingError naming that store, exit code 4, not a traceback).

Commands with options of their own (bench, rerun) parse them with argparse (`own_options=True`), through
`ArgumentParser` below, whose usage errors are one line too: argparse prints their `--help`; Hydra's flags
are still answered here.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from pathlib import Path
from typing import Callable, Iterator

from cli import console, exit_codes
from cli.credentials import mask

Main = Callable[[list[str]], int]

# Hydra's command-line flags (`python app.py --help` of any Hydra app) -> why this project has no use for
# them.
_SEE_HELP = "--help lists the config groups and --cfg job prints the composed configuration"
HYDRA_FLAGS = {
    "-m": "sweeps are `leaner-sweep sweep=NAME` (conf/sweep/), not Hydra's multirun",
    "--multirun": "sweeps are `leaner-sweep sweep=NAME` (conf/sweep/), not Hydra's multirun",
    "-i": _SEE_HELP,
    "--info": _SEE_HELP,
    "--hydra-help": _SEE_HELP,
    "--version": _SEE_HELP,
    "--resolve": "--cfg job prints the config resolved",
    "-p": "only --cfg job",
    "--package": "only --cfg job",
    "-r": "no Hydra reruns",
    "--run": "no Hydra run mode",
    "--experimental-rerun": "no Hydra reruns; `leaner-rerun RUN_ID` re-runs an MLflow run",
    "-cp": "the config tree is conf/, shipped with the package; add a directory with --config-dir DIR",
    "--config-path": "the config tree is conf/; add a directory with --config-dir DIR",
    "-cn": "the config is conf/config.yaml",
    "--config-name": "the config is conf/config.yaml",
    "-sc": "no shell completion",
    "--shell-completion": "no shell completion",
}
HELP_FLAGS = ("-h", "--help")


class Answered(Exception):
    """The command line was answered before main ran (help, --cfg job): print `text`, exit with `code`."""

    def __init__(self, text: str, code: int) -> None:
        super().__init__(text)
        self.text, self.code = text, code


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, answering a usage error as every command answers an error: `error: ...` in one
    line and exit code 2 (argparse prints its usage block first, which buries the line that matters)."""

    def error(self, message: str):  # type: ignore[override]
        raise Answered(f"error: {message} (`{self.prog} --help` shows the usage)", exit_codes.CONFIG)


_running: list[str] = []  # the commands running in this process, outermost first


def command(
    script: str,
    *,
    show_config: Callable[[list[str]], str],
    options: Callable[[], str] | None = None,
    own_options: bool = False,
    flags: tuple[str, ...] = (),
) -> Callable[[Main], Callable[[list[str] | None], int]]:
    """Decorate a command's main; `script` is its console-script name (pyproject.toml's [project.scripts]).

    `show_config(words)` gives `--cfg job`'s text from the line's other words (the training config's:
    config.help.composed_config). `options()` gives --help's list of the command's keys (the training
    config's groups: config.help.config_groups); a command with own_options has argparse's --help instead.
    `flags`: flags of the command's own that main gets among the words (the sweep's --yes).
    """

    def wrap(main: Main) -> Callable[[list[str] | None], int]:
        @functools.wraps(main)
        def run(argv: list[str] | None = None) -> int:
            try:
                code = answer(argv)
                sys.stdout.flush()  # a reader that left (`| head`) shows here, not in Python's exit
                return code
            except BrokenPipeError:  # quiet, as a shell's SIGPIPE: the reader has what it wanted
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush is too
                return exit_codes.SIGPIPE_STOP

        def answer(argv: list[str] | None) -> int:
            words = list(sys.argv[1:] if argv is None else argv)
            if not _running or console.FLAG in words:  # a command run by another's main (bench's) keeps its
                console.configure(console.FLAG in words)  # console: the outer line had the --verbose
            words = [w for w in words if w != console.FLAG]
            _running.append(script)
            try:
                words, dirs = _config_dirs(words)
                with _searched_first(dirs):
                    words = _answer_flags(words, main, script, own_options, show_config, options, flags)
                    return main(words)
            except Answered as answer:
                print(answer.text, file=sys.stdout if answer.code == 0 else sys.stderr)
                return answer.code
            except (
                SystemExit
            ) as exit_:  # argparse's --help and usage errors (bench, rerun): a code, as main's
                if exit_.code is None or isinstance(exit_.code, int):
                    return exit_.code or 0
                raise
            except Exception as err:  # noqa: BLE001 - only CommandErrors are answered, the rest re-raised
                error = exit_codes.explained(err)
                if error is None:
                    raise
                print(f"error: {mask(one_line(error))}", file=sys.stderr)
                return error.exit_code
            finally:
                _running.pop()

        run.script = script  # type: ignore[attr-defined]
        return run

    return wrap


def one_line(err: BaseException) -> str:
    """An error's message on one line (a message quoting a multi-line error of MLflow or SQLite has more)."""
    return " ".join(line.strip() for line in str(err).splitlines() if line.strip())


CONFIG_DIR_FLAGS = ("-cd", "--config-dir")
# Where --config-dir puts its directories, joined by os.pathsep, first searched first: config.compose reads
# them (user_config_dirs), and so do the workers of a local Ray instance, which inherit it. A user may set it.
CONFIG_DIR_ENV = "LEANER_CONFIG_DIR"


def as_typed(words: list[str], module: str) -> list[str]:
    """The command line that runs `words` again from any folder, as the user typed it: the console script
    this process is (leaner-sweep) or `python -m MODULE`, the config directories the command searches (its
    --config-dir flags, absolute, and those of $LEANER_CONFIG_DIR), then `words`."""
    program = Path(sys.argv[0]).name
    head = [program] if program.startswith("leaner-") else ["python", "-m", module]
    dirs = [d for d in os.environ.get(CONFIG_DIR_ENV, "").split(os.pathsep) if d]
    return [*head, *(word for d in dict.fromkeys(dirs) for word in ("--config-dir", d)), *words]


def _config_dirs(words: list[str]) -> tuple[list[str], list[Path]]:
    """The line without its `--config-dir DIR` flags, and their directories, absolute, in order."""
    rest, dirs, i = [], [], 0
    while i < len(words):
        flag, eq, inline = words[i].partition("=")
        if flag not in CONFIG_DIR_FLAGS:
            rest.append(words[i])
            i += 1
            continue
        value = inline if eq else (words[i + 1] if i + 1 < len(words) else "")
        i += 1 if eq else 2
        path = Path(value).expanduser().resolve()
        if not value or not path.is_dir():
            raise Answered(
                f"error: {flag} {value!r} is not a directory: give a config directory laid out like conf/ "
                "(sweep/NAME.yaml, model/NAME.yaml, ...)",
                exit_codes.CONFIG,
            )
        dirs.append(path)
    return rest, dirs


@contextlib.contextmanager
def _searched_first(dirs: list[Path]) -> Iterator[None]:
    """$LEANER_CONFIG_DIR with `dirs` first while the command runs (as it was afterwards: a test or a
    notebook calling main in-process keeps its own)."""
    if not dirs:
        yield
        return
    before = os.environ.get(CONFIG_DIR_ENV)
    os.environ[CONFIG_DIR_ENV] = os.pathsep.join([*map(str, dirs), *filter(None, [before])])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(CONFIG_DIR_ENV)
        else:
            os.environ[CONFIG_DIR_ENV] = before


def _answer_flags(
    words: list[str],
    main: Main,
    script: str,
    own_options: bool,
    show_config: Callable[[list[str]], str],
    options: Callable[[], str] | None,
    flags: tuple[str, ...] = (),
) -> list[str]:
    """The words main gets (`flags` among them); raises Answered for --help, --cfg job and unsupported
    flags."""
    if not own_options and any(w in HELP_FLAGS for w in words):
        raise Answered(usage(main, script, options, flags), 0)
    rest, show, i = [], False, 0
    while i < len(words):
        word = words[i]
        flag, _, inline = word.partition("=")
        if flag in ("--cfg", "-c"):
            value = inline or (words[i + 1] if i + 1 < len(words) else "")
            i += 1 if inline else 2
            if value != "job":
                raise Answered(
                    f"error: not supported: {flag} {value}".rstrip() + ": only --cfg job "
                    "(the composed configuration)",
                    exit_codes.CONFIG,
                )
            show = True
            continue
        if flag in HYDRA_FLAGS:
            raise Answered(
                f"error: not supported: {flag} (a flag of Hydra's own command line): {HYDRA_FLAGS[flag]}",
                exit_codes.CONFIG,
            )
        if word.startswith("-") and not own_options and word not in flags:
            raise Answered(
                f"error: not supported: {word}: the arguments are key=value overrides; {_SEE_HELP}",
                exit_codes.CONFIG,
            )
        rest.append(word)
        i += 1
    if show:
        raise Answered(show_config(rest), 0)
    return rest


def usage(main: Main, script: str, options: Callable[[], str], flags: tuple[str, ...] = ()) -> str:
    """--help: how to call the command, what it does (its module's docstring), its options, the exit codes."""
    module = sys.modules[main.__module__]
    name = getattr(module.__spec__, "name", main.__module__).removesuffix(".__main__")  # python -m PACKAGE
    own = "".join(f" [{flag}]" for flag in flags)
    lines = [
        f"usage: {script} [key=value ...] [--cfg job]{own}   (or: python -m {name} ...)",
        "",
        about(module.__doc__),
        "",
        options(),
        "",
        "--cfg job prints the composed configuration, resolved; --verbose prints all that Ray, Tune and "
        "MLflow print (quiet by default).",
        "",
        exit_code_lines(),
    ]
    return "\n".join(lines)


def about(doc: str | None) -> str:
    """A module docstring for --help: its paragraphs but the one on exit codes (--help lists them all)."""
    paragraphs = (doc or "").strip().split("\n\n")
    return "\n\n".join(p for p in paragraphs if not p.startswith("Exit codes"))


def exit_code_lines() -> str:
    """The exit-code table as --help prints it (argparse commands put it in their epilog)."""
    return "\n".join(["Exit codes:", *(f"  {row.code}  {row.meaning}" for row in exit_codes.TABLE)])
