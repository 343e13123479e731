"""Packaging: every imported package declared, requirements.lock agreeing with pyproject.toml, and the wheel
with its declared dependencies in a fresh venv (no editable checkout, no system site-packages, no extras)
running every command from an empty folder."""

from __future__ import annotations

import ast
import email.parser
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from support.imports import circle, import_graph
from support.readme import page_blocks
from support.repo import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
LOCK = REPO / "requirements.lock"


def top_level_packages() -> list[str]:
    return sorted(p.name for p in REPO.iterdir() if (p / "__init__.py").exists() and p.name != "tests")


def imported_modules(folders: list[str]) -> set[str]:
    """Top-level names of every absolute import in the .py files under `folders`."""
    names = set()
    for path in (p for folder in folders for p in (REPO / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def undeclared(names: set[str], declared_names: set[str]) -> list[str]:
    """Modules among `names` that no declared distribution provides (stdlib and the project's own left
    out)."""
    tests = REPO / "tests"  # its modules (conftest, browser) and packages (support) import as top-level names
    ours = (
        set(top_level_packages())
        | {p.stem for p in tests.glob("*.py")}
        | {p.parent.name for p in tests.glob("*/__init__.py")}
    )
    providers = importlib.metadata.packages_distributions()
    out = []
    for name in sorted(names - set(sys.stdlib_module_names) - ours - {"__future__"}):
        assert name in providers, f"`import {name}`: no installed distribution provides it"
        if not {canonicalize_name(d) for d in providers[name]} & declared_names:
            out.append(f"{name} ({', '.join(providers[name])})")
    return out


def declared(requirements: list[str]) -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in map(Requirement, requirements)}


def locked() -> dict[str, str]:
    lines = [l.strip() for l in LOCK.read_text().splitlines() if l.strip() and not l.startswith("#")]
    pins = dict(l.split("==", 1) for l in lines)
    assert len(pins) == len(lines), "every line of requirements.lock is NAME==VERSION"
    return {canonicalize_name(name): version for name, version in pins.items()}


# Imports of helper scripts that the tests run under Debian's own Python, not the project's environment:
# the module, and the Debian package .ci/run installs for it.
DEBIAN_ONLY = {"fusepy": "python3-fusepy (tests/support/nolockfs.py, a FUSE mount that refuses locks)"}
# Imports of a hook that the tests' `mlflow server` loads into its own process: MLflow's server dependencies.
SERVER_SIDE = {
    "flask": "mlflow's (tests/support/token_auth.py, the server's token login)",
    "werkzeug": "flask's (tests/support/token_auth.py)",
}


def test_every_imported_package_is_declared():
    runtime = set(declared(PROJECT["dependencies"]))
    # An import the package guards (bench/scale.py: PostgreSQL when installed) is declared in an extra.
    optional = {
        r
        for name, extra in PROJECT["optional-dependencies"].items()
        if name != "dev"
        for r in declared(extra)
    }
    missing = undeclared(imported_modules(top_level_packages()), runtime | optional)
    assert not missing, f"imported by the package but not in pyproject.toml's dependencies: {missing}"
    dev = runtime | set(declared(PROJECT["optional-dependencies"]["dev"]))
    missing = undeclared(imported_modules(["tests"]) - set(DEBIAN_ONLY) - set(SERVER_SIDE), dev)
    assert not missing, f"imported by the tests but not in pyproject.toml's dev extra: {missing}"


def test_the_lock_pins_every_declared_package_inside_its_range():
    pins = locked()
    extras = [r for name in ("dev", "cluster") for r in PROJECT["optional-dependencies"][name]]
    for name, requirement in {**declared(extras), **declared(PROJECT["dependencies"])}.items():
        assert name in pins, f"{requirement} is not in requirements.lock (`make lock`)"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"lock {name}=={pins[name]}: {requirement}"
        )
    assert pins["torch"] == "2.13.0", "the CPU build these machines serve"
    (ray,) = [r for r in PROJECT["dependencies"] if r.startswith("ray")]
    assert f"ray=={pins['ray']}" in ray.replace("[tune]", ""), "pyproject.toml's Ray pin is the lock's"
    for name in ("ray", "mlflow", "torch"):  # the environment the tests run in is the lock's
        assert importlib.metadata.version(name).split("+")[0] == pins[name], name


def test_make_installs_from_the_lock():
    makefile = (REPO / "Makefile").read_text()
    installs = [l.strip() for l in makefile.splitlines() if "pip install" in l and "--upgrade pip" not in l]
    assert installs and all("-c requirements.lock" in l for l in installs), installs


def test_the_wheel_holds_every_package_and_the_config_tree():
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    for package in [*top_level_packages(), "conf"]:
        assert f"{package}*" in include, f"{package}/ is not in the wheel"
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["conf"]
    configs = {p.relative_to(REPO / "conf") for p in (REPO / "conf").rglob("*") if p.is_file()}
    assert all(
        any(c.match(pattern) and len(c.parts) == len(Path(pattern).parts) for pattern in patterns)
        for c in configs
    ), "a file of conf/ that package-data leaves out"


def sources() -> list[str]:
    """What a build reads: the packages, conf/, pyproject.toml and the README it names."""
    return [*top_level_packages(), "conf", "pyproject.toml", "README.md"]


def build_wheel(tmp_path: Path) -> Path:
    """The project's wheel, built from a copy (the build writes nothing into the checkout); its METADATA
    declares pyproject.toml's dependencies."""
    source = tmp_path / "source"
    for name in sources():
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy
        copy(
            REPO / name,
            source / name,
            **({"ignore": shutil.ignore_patterns("__pycache__")} if (REPO / name).is_dir() else {}),
        )
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*build, "-w", tmp_path / "dist", source], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("leaner_clustering-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        requires = email.parser.Parser().parsestr(archive.read(metadata).decode()).get_all("Requires-Dist")
    runtime = {str(Requirement(r)) for r in requires if "extra ==" not in r}
    assert runtime == {str(Requirement(r)) for r in PROJECT["dependencies"]}, runtime
    return wheel


@pytest.mark.slow  # pip builds the wheel
def test_what_a_build_leaves_in_a_checkout_git_ignores(tmp_path):
    """`pip install .` (or `pip wheel .`) writes its build folders beside the sources: in a clone, git
    must not show them as untracked files."""
    build_wheel(tmp_path)
    left = [p for p in (tmp_path / "source").iterdir() if p.name not in sources()]
    assert left, "the build left nothing beside the sources: this test checks nothing"
    for path in left:
        name = f"{path.name}/" if path.is_dir() else path.name
        ignored = subprocess.run(["git", "-C", REPO, "check-ignore", "-q", "--no-index", name])
        assert ignored.returncode == 0, f"{name}: a build leaves it, and .gitignore does not ignore it"


def pip_section() -> list[list[str]]:
    """docs/commands.md's "Installing with pip" for a CPU machine, as written: PyTorch's CPU build first,
    then the wheel; the section's `-c requirements.lock` (for a clone) is added to both by the caller."""
    text = (REPO / "docs" / "commands.md").read_text().split("## Installing with pip", 1)[1].split("\n## ")[0]
    torch = re.search(r"CPU only: `(pip install torch [^`]*)`", text)
    wheel = re.search(r"`(pip install leaner_clustering-[^`]*\.whl)`", text)
    assert torch and wheel and "add `-c requirements.lock` to both steps" in text, "the pip section moved"
    return [torch.group(1).split(), wheel.group(1).split()]


def install_with_dependencies(wheel: Path, venv_dir: Path) -> Path:
    """A fresh venv (no system site-packages) installed by the pip section's steps in their order (torch's
    CPU build, then the wheel with its declared dependencies, no extras), at the lock's versions; returns
    its bin/. uv runs the steps (its cache makes a second run seconds), and one word is the machine's:
    PyTorch's CPU index is beyond its network, so its pip find-links (where `make install` finds the CPU
    build) stand in."""
    venv.create(venv_dir)
    links = [f"--find-links={link}" for link in os.environ.get("PIP_FIND_LINKS", "").split()]
    install = [sys.executable, "-m", "uv", "pip", "install", "-q", "--python", venv_dir / "bin" / "python"]
    for words in pip_section():
        assert words[:2] == ["pip", "install"], words
        args = words[2:]
        if "--index-url" in args:
            at = args.index("--index-url")
            args = args[:at] + links + args[at + 2 :]
        for i, arg in enumerate(args):
            if arg.endswith(".whl"):
                assert arg == wheel.name, f"the pip section names {arg}; the build makes {wheel.name}"
                args[i] = str(wheel)
        done = subprocess.run(
            [*install, *links, "-c", LOCK, *args], capture_output=True, text=True, timeout=1200
        )
        assert done.returncode == 0, f"{' '.join(words)}: {done.stderr[-3000:]}"
    return venv_dir / "bin"


USER_SWEEP = """# @package sweep
defaults: [smoke, _self_]
name: mine
seeds: [7]
subgrids:
  - {name: smoke, embedding: [onehot]}
"""
USER_MODEL = """defaults: [paper, _self_]
qkv_mult: 2
"""


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_wheel_with_its_dependencies_runs_every_command_from_an_empty_folder(tmp_path):
    """issue 39: a pip user's path. The built wheel with its declared dependencies (no extras: no Ray
    dashboard) in a fresh venv, every command run from an empty folder as the docs show it: the plan, the
    smoke sweep (console script), a second store (python -m), the report, the claims, a rerun, and a sweep
    of a user config directory with an option of its own."""
    from support.sweeps import children  # MLflow: only this test reads a store

    bin_dir = install_with_dependencies(build_wheel(tmp_path), tmp_path / "venv")
    python = bin_dir / "python"
    versions = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('torch'), m.version('ray'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert versions.stdout.split() == [importlib.metadata.version("torch"), locked()["ray"]], versions.stdout
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith(("MLFLOW_", "LEANER_"))
    }
    env["HOME"] = str(
        tmp_path / "home"
    )  # Ray Tune's ~/ray_results and Ray's ~/.ray stay in the test's folder
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def run(*words: str | Path, code: int = 0, cwd: Path = elsewhere) -> str:
        done = subprocess.run(
            [str(w) for w in words], capture_output=True, text=True, cwd=cwd, env=env, timeout=900
        )
        assert done.returncode == code, (
            f"{words}: {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
        )
        return done.stdout

    where = run(python, "-c", "import config.schema as c, sweeper; print(c.CONF_DIR, sweeper.__file__)")
    site = next((tmp_path / "venv" / "lib").glob("python3*/site-packages"))
    assert all(Path(p).is_relative_to(site) for p in where.split()), where  # not the checkout
    plan = run(bin_dir / "leaner-sweep", "sweep=paper", "sweep.dry_run=true")
    assert plan.splitlines()[-1] == "300 configurations x 10 seeds = 3000 trials"
    assert re.search(r"^  d: 32$", run(bin_dir / "leaner-train", "task.d=32", "--cfg", "job"), flags=re.M)
    assert sorted(elsewhere.iterdir()) == []  # a dry run writes nothing

    # The default configuration on the default install: without the dashboard's packages, one line says so.
    smoke = run(bin_dir / "leaner-sweep", "sweep=smoke")
    assert "Ray's dashboard is off: its packages are missing" in smoke
    assert "sweep smoke: 6 of 6 trials ended {'finished': 6}" in smoke, smoke[-2000:]
    second = run(python, "-m", "sweeper.sweep", "sweep=smoke", "tracking.uri=sqlite:///second.db")
    assert "sweep smoke: 6 of 6 trials ended {'finished': 6}" in second, second[-2000:]
    assert len(children(f"sqlite:///{elsewhere}/second.db", "smoke")) == 6

    # A user config directory: a sweep and a model option of its own, searched before the packaged conf/.
    user = tmp_path / "my-conf"
    (user / "sweep").mkdir(parents=True)
    (user / "model").mkdir()
    (user / "sweep" / "mine.yaml").write_text(USER_SWEEP)
    (user / "model" / "wide.yaml").write_text(USER_MODEL)
    mine = ["sweep=mine", "model=wide", "tracking.uri=sqlite:///mine.db"]
    shown = run(bin_dir / "leaner-sweep", "--config-dir", user, *mine, "--cfg", "job")
    assert re.search(r"^  qkv_mult: 2$", shown, flags=re.M) and re.search(
        r"^  name: mine$", shown, flags=re.M
    )
    assert run(bin_dir / "leaner-sweep", "-cd", user, *mine).count("1 of 1 trials ended {'finished': 1}") == 1
    (trained,) = children(f"sqlite:///{elsewhere}/mine.db", "mine")
    assert trained.data.params["model.qkv_mult"] == "2"  # the trial composed the user's model option

    # The report and the claims of the first store, as docs/figures-and-claims.md shows them.
    run(python, "-m", "analysis.report")
    assert (elsewhere / "reports" / "leaner-clustering" / "index.md").is_file()
    run(python, "-m", "analysis.claims")
    assert (elsewhere / "reports" / "leaner-clustering" / "claims.csv").is_file()
    original = children(f"sqlite:///{elsewhere}/mlflow.db", "smoke")[0].info.run_id
    rerun = run(bin_dir / "leaner-rerun", original)
    assert rerun.splitlines()[-1] == "equal", rerun  # docs/rerun.md: both final values, equal on CPU

    # docs/notebook.md's cells as written, in order, in the folder of a demo sweep (at smoke scale) made by
    # the console script the page names: the wheel's python, no checkout on its path.
    demo = tmp_path / "demo"
    demo.mkdir()
    run(bin_dir / "leaner-sweep", "sweep=demo", *DEMO_AT_SMOKE_SCALE, cwd=demo)
    cells = [b.text for b in page_blocks(REPO / "docs" / "notebook.md", "python") if b.runnable]
    assert len(cells) >= 3, cells
    notebook = run(python, "-c", "import matplotlib; matplotlib.use('Agg')\n" + "\n".join(cells), cwd=demo)
    assert "varying: ['model.embedding']" in notebook, notebook[-2000:]


# The demo sweep in seconds (docs/notebook.md's cells read its store): test_docs' DEMO_STEPS.
DEMO_AT_SMOKE_SCALE = [
    "train.steps=20",
    "train.eval_every=10",
    "train.val_batches=2",
    "cluster.dashboard_host=null",
]


def imports_of(folder: str) -> set[str]:
    """Full module names of every absolute first-party import under `folder` ("config.schema", ...)."""
    ours = tuple(top_level_packages())
    names = set()
    for path in (REPO / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = (
                    [node.module] if "." in node.module else [f"{node.module}.{a.name}" for a in node.names]
                )
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            names.update(m for m in modules if m.split(".")[0] in ours)
    return names


# Packages depend one way: each imports only itself and the packages before it in this order, but bench/ and
# analysis/ nothing of sweeper/: they measure and read what a sweep leaves, not the driver's internals (the
# driver at scale is measured by sweeper/scale/, the scale probe's package).
LAYERS = ("cli", "tasks", "models", "config", "tracking", "training", "sweeper", "bench", "analysis")
NOT_SWEEPER = ("bench", "analysis")
MAY_IMPORT = {
    package: set(LAYERS[: i + 1]) - ({"sweeper"} if package in NOT_SWEEPER else set())
    for i, package in enumerate(LAYERS)
}


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_imports_flow_one_way(package):
    allowed = MAY_IMPORT[package]
    wrong = sorted(m for m in imports_of(package) if m not in allowed and m.split(".")[0] not in allowed)
    assert not wrong, f"{package}/ imports {wrong}; it may import only {sorted(allowed)}"


def test_the_sweep_driver_imports_nothing_of_the_scale_probe():
    """sweeper/'s two jobs, a subpackage each: the driver (sweeper/driver/) runs a sweep, the scale probe
    (sweeper/scale/, its command sweeper/scale_probe.py) drives it to measure it, never the other way."""
    wrong = sorted(m for m in imports_of("sweeper/driver") if m.startswith("sweeper.scale"))
    assert not wrong, f"sweeper/driver/ imports {wrong}"


def test_bench_names_no_sweeper_module_in_a_string():
    """No tie the imports cannot see: a module run by its name (`python -m sweeper.x` in a subprocess) or
    imported by a name built at run time. (analysis/ names the commands that fill a store in its advice.)"""
    for path in (REPO / "bench").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                named = re.findall(r"\bsweeper\.\w+", node.value)
                assert not named, f"{path.relative_to(REPO)} names {named}"


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_no_import_circle_inside_a_package(package):
    """A module's imports inside its package lead never back to it, counting the package __init__s an import
    runs (`from pkg import name` runs pkg's __init__): each idea stands on the ones below it."""
    assert circle(import_graph((package,))) == []


def test_the_circle_check_finds_an_import_back_through_a_package_init():
    """records importing `judges` through its package, whose __init__ imports what imports records, is a
    circle: the import the claims once had."""
    graph = import_graph(("analysis",))
    graph["analysis.claims.records"].add("analysis.claims")
    graph["analysis.claims"].add("analysis.claims.verdicts")
    assert circle(graph)[0] in {"analysis.claims", "analysis.claims.records", "analysis.claims.verdicts"}


def lookups_by_name(folder: str) -> set[str]:
    """First-party modules the code under `folder` reaches by a name in a string: `sys.modules[NAME]`,
    `sys.modules.get(NAME)`, `importlib.import_module(NAME)`, `__import__(NAME)` (no import to show it)."""
    ours = tuple(top_level_packages())
    found = set()
    for path in (REPO / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "sys.modules":
                names = [node.slice]
            elif isinstance(node, ast.Call) and ast.unparse(node.func) in (
                "sys.modules.get",
                "importlib.import_module",
                "__import__",
            ):
                names = node.args[:1]
            else:
                continue
            constants = (n.value for n in names if isinstance(n, ast.Constant) and isinstance(n.value, str))
            found.update(name for name in constants if name.split(".")[0] in ours)
    return found


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_no_package_reaches_above_itself_by_name(package):
    """A lookup by name is an import the import graph cannot see: cli/ once reached tracking.store through
    sys.modules. The error that needs tracking's explanation now carries it (cli.exit_codes.attach)."""
    allowed = MAY_IMPORT[package]
    wrong = sorted(m for m in lookups_by_name(package) if m.split(".")[0] not in allowed)
    assert not wrong, f"{package}/ reaches {wrong} by name; it may use only {sorted(allowed)}"


TRAIN_TINY = (
    "from config.compose import compose; from tracking.recorder import MemoryRecorder; "
    "from training.loop import train; import tempfile; "
    "train(compose(['task.n=16', 'train.steps=4', 'train.eval_every=2', 'train.val_batches=1', "
    "'train.batch=2']), MemoryRecorder(), tempfile.mkdtemp())"
)
# The driver packs by shape with config.schema.SHARED_KEYS, not through training.packed (torch).
DRIVER = (
    "import sweeper.sweep; from sweeper.driver import cluster, ledger, session, trial, tune, work, writer; "
    "work.packs_of([], set(), 'shapes', 2)"
)
DRY_RUN = (
    "import runpy; sys.argv = ['sweeper.sweep', 'sweep=paper', 'sweep.dry_run=true']; "
    'exec(\'try: runpy.run_module("sweeper.sweep", run_name="__main__")\\nexcept SystemExit: pass\')'
)


@pytest.mark.parametrize(
    "module, unwanted",
    [
        ("sweeper.driver.trial", ["mlflow", "torch"]),
        (DRIVER, ["torch"]),
        (DRY_RUN, ["torch", "ray"]),
        ("analysis.report", ["torch._dynamo"]),
        (TRAIN_TINY, ["torch._dynamo", "torch._inductor", "sympy"]),
    ],
    ids=["trial", "driver", "dry-run", "report", "training"],
)
def test_imports_leave_out_what_the_process_does_not_use(module, unwanted):
    """What each kind of process would import for nothing, about 1.5 s of CPU each: a sweep's Ray worker
    imports sweeper.driver.trial (MLflow: the driver writes every run; torch: only once it trains); the driver
    (every module a sweep runs) trains nothing, and a dry run or a bad override is answered without torch
    or Ray (config checks its choices without importing the models); torch._dynamo (only train.compile
    needs it) is left out of the report, and of training, which keeps its Adam state without a torch
    Optimizer (training.adam), whose construction imports it, and sets deterministic mode without
    torch.use_deterministic_algorithms, which imports inductor and sympy (training.determinism)."""
    statement = module if " " in module else f"import {module}"
    probe = f"import sys; {statement}; print(sorted(set({unwanted!r}) & set(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1:] == ["[]"], (
        done.stdout + done.stderr[-2000:]
    )
