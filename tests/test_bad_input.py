"""Every command, fed bad input, answers in one line with a documented exit code.

The input is generated (hypothesis): unknown and misspelt keys, values of the wrong type or out of range,
garbled override syntax, stores that are random bytes, truncated, a folder, in a missing folder, missing or
read-only, and run ids that are in no store. Each command's entry function, what its console script calls,
takes most of them in-process; a sample runs as real subprocesses in both forms, `python -m MODULE` and the
console script. Each answer: one line on stderr (`error: ...`), the exit code of cli/exit_codes.py's
table that the situation documents, no traceback, and nothing written: every file under the sandbox
(stores included) is the same after the command as before, and nothing new is there. The bad values come
from docs/configuration.md's "allowed" column, written out here as an independent oracle.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import string
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from support.repo import subprocess_env

from analysis import report
from analysis.claims import __main__ as claims
from bench import __main__ as bench
from cli import exit_codes
from config.reference import schema_keys
from config.schema import AnalysisConfig, Config
from sweeper import rerun, sweep, train
from tracking import store

MAINS = {
    "train": train.main,
    "sweep": sweep.main,
    "rerun": rerun.main,
    "report": report.main,
    "claims": claims.main,
    "bench": bench.main,
}
MODULES = {"train": "sweeper.train", "sweep": "sweeper.sweep", "rerun": "sweeper.rerun"}
MODULES |= {"report": "analysis.report", "claims": "analysis.claims", "bench": "bench"}
SCRIPTS = {name: f"leaner-{name}" for name in MAINS}
ANSWER_S = 60
# What a command line starts with, so that a bad word is the only thing wrong: train at a size that would
# finish in seconds if a bug let the word through, the sweep as a dry run, bench's step probe.
PREFIX = {
    "train": ["train.steps=2", "train.eval_every=1", "train.val_batches=1", "train.batch=2"],
    "sweep": ["sweep=smoke", "sweep.dry_run=true"],
    "bench": ["step", "--repeats", "1"],
}
TRAINING_KEYS = {key: kind for key, kind, _ in schema_keys(Config)}
ANALYSIS_KEYS = {key: kind for key, kind, _ in schema_keys(AnalysisConfig)}
VALUED = {key for schema in (Config, AnalysisConfig) for key, kind, optional in schema_keys(schema)}
VALUED = {key for key in VALUED if key not in ("figures", "eval.lengths", "eval.inits")} - {
    key for schema in (Config, AnalysisConfig) for key, _, optional in schema_keys(schema) if optional
}
GROUPS = {"task", "model", "loss", "optim", "train", "tracking", "cluster", "sweep", "report", "seed"}
SETTINGS = settings(
    derandomize=True,  # the same inputs on every run: CI reproduces what it reports
    database=None,  # no .hypothesis folder in the checkout
    deadline=None,  # a slow answer is asserted below (ANSWER_S), not timed per example by hypothesis
    phases=[Phase.explicit, Phase.generate, Phase.shrink],  # no explain phase: minutes on a failure
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# --- bad values, from docs/configuration.md's "allowed" column -----------------------------------------
def below(low: int) -> st.SearchStrategy[str]:
    return st.integers(max_value=low - 1).map(str)


NOT_FINITE = st.sampled_from(["nan", "inf", "-inf"])
NOT_POSITIVE = st.one_of(st.floats(max_value=0, allow_nan=False).map(repr), NOT_FINITE)
OUTSIDE_UNIT = st.one_of(
    st.floats(max_value=0, exclude_max=True, allow_nan=False, allow_infinity=False),
    st.floats(min_value=1, allow_nan=False, allow_infinity=False),
).map(repr)
NAMES = st.text(string.ascii_lowercase + "_", min_size=1, max_size=12)


def none_of(*allowed: str) -> st.SearchStrategy[str]:
    return NAMES.filter(lambda name: name not in allowed and name not in ("null", "true", "false"))


OUT_OF_RANGE = {
    "task.family": none_of("normal", "cauchy", "gumbel", "laplace", "lognormal"),
    "task.n": below(6),  # >= k, 6 by default
    "task.d": below(1),
    "task.k": below(2),
    "task.scale": NOT_POSITIVE,
    "task.init": none_of("random", "gonzalez"),  # kmeans++ has no lowercase letters only
    "model.embedding": none_of("onehot", "binary", "none"),
    "model.gamma": st.floats(max_value=0, allow_nan=False, allow_infinity=False).map(repr),
    "model.dropout": st.one_of(OUTSIDE_UNIT, st.just("nan")),
    "model.qkv_mult": below(1),
    "loss.regularizer": none_of("l2", "ne"),
    "loss.tau": NOT_POSITIVE,
    "optim.lr": NOT_POSITIVE,
    "optim.lr_factor": st.one_of(OUTSIDE_UNIT, st.just("nan")),
    "optim.lr_patience": below(0),
    **{
        f"train.{k}": below(1)
        for k in ("steps", "batch", "eval_every", "val_batches", "log_every", "threads")
    },
    "train.compile": none_of("off", "inductor", "cudagraphs", "aot_eager"),
    "train.resume": none_of("auto", "never", "must"),
    "train.device": none_of("auto", "cpu", "cuda", "mps"),
    "tracking.outage_s": NOT_POSITIVE,
    "cluster.cpus_per_trial": NOT_POSITIVE,
    "cluster.gpus_per_trial": st.one_of(
        st.floats(max_value=0, exclude_max=True, allow_nan=False, allow_infinity=False),
        st.floats(min_value=1, max_value=1e6, exclude_min=True),
    ).map(repr),
    "cluster.max_concurrent": below(1),
    "cluster.max_failures": below(-1),
    "cluster.pack": none_of("none", "seeds", "shapes"),
    "cluster.pack_size": below(1),
    "cluster.report_every": below(1),
    "cluster.drain_s": NOT_POSITIVE,  # and any value without cluster.time_budget_s (null by default)
    "seed": st.one_of(below(0), st.integers(min_value=2**63).map(str)),
}
ANALYSIS_OUT_OF_RANGE = {
    **{f"eval.{k}": below(1) for k in ("batches", "batch", "steps", "dissimilarity_tasks", "threads")},
    "eval.max_elements": below(1),
    "eval.surface_points": below(2),
    "eval.surface_span": NOT_POSITIVE,
    "eval.checkpoint": none_of("last", "best"),
    "eval.d32_n": below(1),
    "experiments": st.sampled_from(["[]", "[a,a]", "['']", "[a,'',b]"]),
    "eval.device": none_of("auto", "cpu", "cuda", "mps"),
    "figures": st.lists(none_of(), min_size=1, max_size=3).map(lambda names: f"[{','.join(names)}]"),
    "tracking.outage_s": NOT_POSITIVE,
}
# A value no key of the type takes (a list or a mapping takes no scalar, a scalar no list).
WRONG_TYPE = {
    int: st.sampled_from(["abc", "1.5", "[1]", "{a: 1}", "true", "1e3"]),
    float: st.sampled_from(["abc", "[1.0]", "{a: 1}", "true"]),
    bool: st.sampled_from(["maybe", "2", "0", "yes", "on", "[true]", "1.0"]),
    str: st.sampled_from(["[a, b]", "{a: 1}"]),
}


def wrong_type(keys: dict[str, type]) -> st.SearchStrategy[str]:
    typed = sorted(key for key, kind in keys.items() if kind in WRONG_TYPE)
    return st.sampled_from(typed).flatmap(lambda key: WRONG_TYPE[keys[key]].map(lambda v: f"{key}={v}"))


def out_of_range(table: dict[str, st.SearchStrategy[str]]) -> st.SearchStrategy[str]:
    return st.sampled_from(sorted(table)).flatmap(lambda key: table[key].map(lambda v: f"{key}={v}"))


@st.composite
def misspelt(draw, keys: dict[str, type]) -> str:
    """A key one typo away from a real one (a letter dropped, added, doubled, swapped or changed)."""
    key = draw(st.sampled_from(sorted(keys)))
    i = draw(st.integers(0, len(key) - 1))
    letter = draw(st.sampled_from(string.ascii_lowercase + "_"))
    typo = draw(
        st.sampled_from(
            [
                key[:i] + key[i + 1 :],
                key[:i] + letter + key[i:],
                key[:i] + key[i] + key[i:],
                key[:i] + key[i + 1 : i + 2] + key[i : i + 1] + key[i + 2 :],
                key[:i] + letter + key[i + 1 :],
            ]
        )
    )
    taken = set(keys) | GROUPS | {k.split(".")[0] for k in keys}
    assume_new = typo not in taken and typo.strip(".") and ".." not in typo and not typo.startswith("sweep.")
    if not assume_new:
        typo = f"{key}_x"  # a typo that happens to spell a real key (or nothing): the key plus a suffix
    return f"{typo}=1"


def unknown_key(keys: dict[str, type]) -> st.SearchStrategy[str]:
    """A name under a real group, or at the top, that is no key (also added with Hydra's + and ++)."""
    parents = sorted({key.rsplit(".", 1)[0] for key in keys if "." in key} - {"sweep"}) + [""]
    taken = set(keys) | GROUPS
    return (
        st.tuples(st.sampled_from(["", "+", "++"]), st.sampled_from(parents), NAMES)
        .filter(lambda t: f"{t[1]}.{t[2]}".strip(".") not in taken)
        .map(lambda t: f"{t[0]}{t[1]}.{t[2]}".replace("+.", "+").lstrip(".") + "=1")
    )


def garbled(keys: dict[str, type]) -> st.SearchStrategy[str]:
    """Words the override grammar cannot read: an unclosed bracket or quote, a stray closer, no key, no
    `=`, Hydra's own settings, or a key Hydra's + would add to a group it is already in."""
    key = st.sampled_from(sorted(keys))
    junk = st.text(string.ascii_letters + string.digits + " ,:.", max_size=8)
    return st.one_of(
        st.tuples(key, st.sampled_from(["[", "{", "'", '"', "("]), junk).map(
            lambda t: f"{t[0]}={t[1]}{t[2]}"
        ),
        st.tuples(key, junk, st.sampled_from(["]", "}", ")"])).map(lambda t: f"{t[0]}={t[1]}{t[2]}"),
        junk.map(lambda j: f"={j}"),
        NAMES.map(lambda name: name),  # no `=`
        # + on a key that holds a value (Hydra's + sets a key that holds null or [])
        st.tuples(st.sampled_from(sorted(k for k in keys if k in VALUED)), NAMES).map(
            lambda t: f"+{t[0]}={t[1]}"
        ),
        NAMES.map(lambda name: f"hydra.{name}=1"),
    )


def bad_words(keys: dict[str, type], ranges: dict[str, st.SearchStrategy[str]]) -> st.SearchStrategy[str]:
    return st.one_of(unknown_key(keys), misspelt(keys), wrong_type(keys), out_of_range(ranges), garbled(keys))


BAD_OPTIONS = st.one_of(  # bench's own options and probes
    st.just([]),
    NAMES.filter(lambda n: n not in bench.COMMANDS).map(lambda n: [n]),
    st.sampled_from(["step", "pack", "sweep", "speed_memory", "step_seconds", "gpu"]).flatmap(
        lambda command: st.sampled_from(
            [["--repeats", "0"], ["--repeats", "x"], ["--bogus"], ["--threads", "-1"], ["--out"]]
        ).map(lambda option: [command, *option])
    ),
    st.sampled_from(
        [["pack", "--packs", "0"], ["pack", "--sizes", "huge"], ["pack", "--regularizers", "l3"]]
    ),
)


# --- the sandbox and one command's answer ---------------------------------------------------------------
# Commands that write a store take tracking.store.connect's lock beside it (FILE.db.lock, empty) before they
# check it: for a damaged store too.
WRITERS = {"train", "sweep", "rerun"}
LOCKS: set[str] = set()  # the lock file of each store the tests made, relative to the sandbox


@dataclass
class Sandbox:
    root: Path
    healthy: str  # an MLflow store without runs

    def files(self) -> dict[str, str]:
        """Every path under the sandbox -> its content's hash ('dir' for a folder)."""
        return {
            str(p.relative_to(self.root)): "dir" if p.is_dir() else hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(self.root.rglob("*"))
        }


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Sandbox:
    root = tmp_path_factory.mktemp("bad-input")
    healthy = root / "stores" / "healthy.db"
    healthy.parent.mkdir()
    uri = f"sqlite:///{healthy}"
    store.connect(uri)  # MLflow creates its tables: a real store
    (root / "cwd").mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root / "cwd")
        # The default store, where a command would write if it took a bad word: it must stay absent.
        patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'cwd' / 'default.db'}")
        patch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
        yield Sandbox(root, uri)


def answer(command: str, argv: list[str], sandbox: Sandbox, capfd) -> tuple[int, str]:
    """Run the command's entry function; (exit code, stderr); asserts it wrote nothing and took < 60 s."""
    before = sandbox.files()
    capfd.readouterr()
    start = time.monotonic()
    code = MAINS[command](argv)
    took = time.monotonic() - start
    printed = capfd.readouterr().err
    assert took < ANSWER_S, f"{command} {argv}: {took:.0f} s"
    after = sandbox.files()
    if command in WRITERS:  # the one file a command that writes makes beside a SQLite store it opens
        after = {path: digest for path, digest in after.items() if path not in LOCKS or path in before}
    assert after == before, f"{command} {argv} wrote in the sandbox"
    return code, printed


def check(command: str, argv: list[str], expected: int, sandbox: Sandbox, capfd) -> str:
    code, printed = answer(command, argv, sandbox, capfd)
    assert code == expected, f"{command} {argv}: exit code {code}, not {expected}; stderr: {printed[-2000:]}"
    assert printed.startswith("error: ") and printed.count("\n") == 1, f"{command} {argv}: {printed!r}"
    return printed


# --- the in-process properties --------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["train", "sweep", "bench"])
@settings(SETTINGS, max_examples=6)
@given(data=st.data())
def test_bad_training_config_words(command, data, sandbox, capfd):
    word = data.draw(bad_words(TRAINING_KEYS, OUT_OF_RANGE), label="word")
    check(command, [*PREFIX[command], word], exit_codes.CONFIG, sandbox, capfd)


@pytest.mark.parametrize("command", ["report", "claims"])
@settings(SETTINGS, max_examples=6)
@given(data=st.data())
def test_bad_analysis_config_words(command, data, sandbox, capfd):
    word = data.draw(bad_words(ANALYSIS_KEYS, ANALYSIS_OUT_OF_RANGE), label="word")
    check(command, [word], exit_codes.CONFIG, sandbox, capfd)


@pytest.mark.parametrize("command", sorted(MAINS))
@settings(SETTINGS, max_examples=15)
@given(data=st.data())
def test_garbled_words(command, data, sandbox, capfd):
    """The cheap half of the words above, drawn more often: the override grammar rejects them at once."""
    keys = ANALYSIS_KEYS if command in ("report", "claims") else TRAINING_KEYS
    word = data.draw(garbled(keys), label="word")
    argv = [*PREFIX.get(command, []), word] if command != "rerun" else ["0123abcd", word]
    check(command, argv, exit_codes.CONFIG, sandbox, capfd)


@settings(SETTINGS, max_examples=60)
@given(argv=BAD_OPTIONS)
def test_bad_bench_options(argv, sandbox, capfd):
    check("bench", argv, exit_codes.CONFIG, sandbox, capfd)


@settings(SETTINGS, max_examples=50)
@given(
    argv=st.one_of(
        st.just([]),
        st.lists(NAMES, min_size=3, max_size=4),  # more arguments than a run id and the store
        st.tuples(NAMES, NAMES.map(lambda n: f"tracking.{n}=x")).map(list),
        st.tuples(NAMES, st.sampled_from(["--bogus", "-x", "--cfg=hydra", "-m"])).map(list),
    )
)
def test_bad_rerun_lines(argv, sandbox, capfd):
    check("rerun", argv, exit_codes.CONFIG, sandbox, capfd)


@settings(SETTINGS, max_examples=4)
@given(run_id=st.one_of(st.text(string.hexdigits.lower(), min_size=1, max_size=32), NAMES))
def test_a_run_id_in_no_store(run_id, sandbox, capfd):
    check("rerun", [run_id, f"tracking.uri={sandbox.healthy}"], exit_codes.NO_SUCH_RUN, sandbox, capfd)


STORE_KINDS = ["random bytes", "truncated", "a folder", "in a missing folder", "unreachable server"]
READ_ONLY_SKIPPED = os.geteuid() == 0  # root writes a file whatever its mode: no read-only store to test


@st.composite
def bad_store(draw, sandbox: Sandbox, kinds: list[str]) -> str:
    """The URI of a store of a drawn kind, made in the sandbox (before the command looks)."""
    kind = draw(st.sampled_from(kinds), label="store")
    folder = sandbox.root / "stores"
    path = folder / f"{hashlib.sha1(repr(kind).encode()).hexdigest()[:8]}-{draw(NAMES)}.db"
    shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    if kind == "random bytes":
        path.write_bytes(draw(st.binary(min_size=1, max_size=4096), label="bytes"))
    elif kind == "truncated":
        whole = Path(sandbox.healthy.removeprefix("sqlite:///")).read_bytes()
        path.write_bytes(whole[: draw(st.integers(1, len(whole) - 1), label="kept bytes")])
    elif kind == "a folder":
        path.mkdir()
    elif kind == "in a missing folder":
        path = folder / "missing" / path.name
    elif kind == "unreachable server":
        return "http://127.0.0.1:1"
    elif kind == "read-only":
        shutil.copy(sandbox.healthy.removeprefix("sqlite:///"), path)
        path.chmod(0o444)
    LOCKS.add(str(path.relative_to(sandbox.root)) + ".lock")
    return f"sqlite:///{path}"


@pytest.mark.parametrize("command", ["train", "sweep", "rerun", "report", "claims"])
@settings(SETTINGS, max_examples=4)
@given(data=st.data())
def test_bad_stores(command, data, sandbox, capfd):
    """A store a command cannot use: exit code 4, naming it. A missing store too for the commands that
    only read one (report, claims; rerun: its run cannot be in a new store); train and sweep create it."""
    kinds = STORE_KINDS + (["missing"] if command in ("rerun", "report", "claims") else [])
    kinds += [] if READ_ONLY_SKIPPED or command in ("report", "claims") else ["read-only"]
    uri = data.draw(bad_store(sandbox, kinds))
    if command == "sweep":  # a sweep that took the store would stop at the cluster (6), never start Ray
        argv = ["sweep=smoke", f"tracking.uri={uri}", "cluster.address=127.0.0.1:1"]
    else:
        argv = [
            *PREFIX.get(command, []),
            *(["0123abcd"] if command == "rerun" else []),
            f"tracking.uri={uri}",
        ]
    check(command, argv, exit_codes.TRACKING, sandbox, capfd)


@pytest.mark.parametrize("command", ["train", "sweep", "rerun", "report"])
def test_an_unreachable_database(command, sandbox, capfd):
    """Nothing answers at a PostgreSQL address: exit code 4 in seconds (MLflow retries for minutes)."""
    uri = "postgresql://leaner:secret@127.0.0.1:1/mlflow"
    first = {"sweep": ["sweep=smoke", "cluster.address=127.0.0.1:1"], "rerun": ["0123abcd"]}  # not a dry run
    argv = [*first.get(command, PREFIX.get(command, [])), f"tracking.uri={uri}"]
    start = time.monotonic()
    printed = check(command, argv, exit_codes.TRACKING, sandbox, capfd)
    assert time.monotonic() - start < 15 and "unreachable" in printed and "secret" not in printed, printed


# Store addresses as people type them (MLflow's docs allow a bare path for its file store, which its
# current versions refuse): relative paths only, for sqlite:// + an absolute path is a sound address.
PATHS = st.one_of(NAMES.map(lambda name: f"{name}.db"), st.sampled_from(["./mlruns", "mlruns", "db/x.db"]))
SCHEMES = ("sqlite", "http", "https", "postgresql")


@st.composite
def misspelt_scheme(draw) -> str:
    scheme = draw(st.sampled_from(SCHEMES))
    i = draw(st.integers(0, len(scheme) - 1))
    typo = draw(st.sampled_from([scheme[:i] + scheme[i + 1 :], scheme[:i] + "x" + scheme[i:]]))
    return typo if typo not in SCHEMES else f"{scheme}x"


MALFORMED_URIS = st.one_of(
    PATHS,
    PATHS.map(lambda path: f"file:{path}"),
    PATHS.map(lambda path: f"sqlite://{path}"),  # two slashes
    PATHS.map(lambda path: f"sqlite:/{path}"),
    st.tuples(misspelt_scheme(), PATHS).map(lambda t: f"{t[0]}:///{t[1]}"),
    st.sampled_from(["sqlite://", "sqlite:///:memory:", "http://", "http:/127.0.0.1:5000", "postgresql:/db"]),
)


@pytest.mark.parametrize("given_as", ["tracking.uri", "$MLFLOW_TRACKING_URI"])
@pytest.mark.parametrize("command", ["train", "sweep", "rerun", "report", "claims"])
@settings(SETTINGS, max_examples=4)
@given(data=st.data())
def test_an_address_of_no_store_form(command, given_as, data, sandbox, capfd):
    """Rejected with the configuration (exit code 2) in one line that names the forms a store takes."""
    uri = data.draw(MALFORMED_URIS, label="uri")
    argv = [*PREFIX.get(command, []), *(["0123abcd"] if command == "rerun" else [])]
    with pytest.MonkeyPatch.context() as patch:
        if given_as == "tracking.uri":
            argv.append(f"tracking.uri='{uri}'")
        else:
            patch.setenv("MLFLOW_TRACKING_URI", uri)
        printed = check(command, argv, exit_codes.CONFIG, sandbox, capfd)
    assert "sqlite:///" in printed, printed


@pytest.mark.parametrize("command", ["report", "claims"])
def test_an_empty_store_has_nothing_to_analyse(command, sandbox, capfd):
    check(command, [f"tracking.uri={sandbox.healthy}"], exit_codes.NO_RUNS, sandbox, capfd)


# --- a sample through real subprocesses, both forms -----------------------------------------------------
def form(command: str, kind: str) -> list[str]:
    if kind == "python -m":
        return [sys.executable, "-m", MODULES[command]]
    installed = shutil.which(SCRIPTS[command], path=str(Path(sys.executable).parent))
    assert installed, f"{SCRIPTS[command]} is not installed next to {sys.executable}: pip install -e ."
    return [installed]


SUBPROCESS_WORDS = {  # one drawn word per command, the same on every run (derandomized)
    "train": (TRAINING_KEYS, OUT_OF_RANGE),
    "sweep": (TRAINING_KEYS, OUT_OF_RANGE),
    "bench": (TRAINING_KEYS, OUT_OF_RANGE),
    "report": (ANALYSIS_KEYS, ANALYSIS_OUT_OF_RANGE),
    "claims": (ANALYSIS_KEYS, ANALYSIS_OUT_OF_RANGE),
}


@pytest.mark.slow  # twelve interpreters importing torch and MLflow
@pytest.mark.parametrize("kind", ["python -m", "console script"])
@pytest.mark.parametrize("command", sorted(MAINS))
@settings(SETTINGS, max_examples=1)
@given(data=st.data())
def test_bad_input_through_both_forms(command, kind, data, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("cwd")
    if command == "rerun":
        argv, expected = [data.draw(NAMES, label="run id"), "tracking.uri=sqlite:///missing/x.db"], 4
    else:
        keys, ranges = SUBPROCESS_WORDS[command]
        argv = [*PREFIX.get(command, []), data.draw(bad_words(keys, ranges), label="word")]
        expected = exit_codes.CONFIG
    env = {**subprocess_env(), "MLFLOW_TRACKING_URI": f"sqlite:///{cwd / 'default.db'}"}
    start = time.monotonic()
    done = subprocess.run(
        [*form(command, kind), *argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )
    assert time.monotonic() - start < 120  # an interpreter's start (torch, MLflow) included: 60 s + that
    assert done.returncode == expected, f"{argv}: {done.returncode}: {done.stderr[-3000:]}"
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr[-3000:]
    assert list(cwd.iterdir()) == [], f"{argv} wrote {list(cwd.iterdir())}"
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.slow  # an interpreter importing torch and MLflow
def test_a_bad_default_address_is_answered_not_met_on_import(tmp_path):
    """The claims read conf/'s sweeps when imported (analysis.claims.records): a bad $MLFLOW_TRACKING_URI
    must wait for the command, which answers it in one line."""
    env = {**subprocess_env(), "MLFLOW_TRACKING_URI": "mlflow.db"}
    done = subprocess.run(
        [sys.executable, "-m", "analysis.report"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert done.returncode == exit_codes.CONFIG, done.stderr[-3000:]
    assert done.stderr.count("\n") == 1 and "$MLFLOW_TRACKING_URI" in done.stderr, done.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []
