"""README.md and the docs/*.md pages: their commands exist with the flags they show, their runnable
blocks run, their links lead somewhere, the exit code table is cli/exit_codes.py's and the
configuration reference the one config/reference.py generates. docs/architecture.md: the files,
modules and make targets it names exist.

A ```bash block right after a line `<!-- runnable -->` is run by test_runnable_blocks, all of
them in one shell, page by page in the order README links the pages (support/readme.py: pages), as a
newcomer would type them after `make demo` on a fresh clone:
in a directory holding what the Makefile's demo sweep writes (its command, at a few steps). A marked
```python block is a notebook's cell: it runs in Python after the page's earlier marked cells.
`<!-- runnable smoke="k=v ..." -->` appends those overrides to the block's
`python -m sweeper.train` lines, so a 10,000-step command runs at smoke scale.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pandas as pd
import pytest
from support.configs import NO_DASHBOARD
from support.readme import blocks, commands, page_holding, pages, runnable_blocks
from support.repo import README, REPO

from cli import exit_codes
from config import reference as config_reference
from config.compose import compose
from sweeper import sweep as sweep_cli
from sweeper.driver.timeline import drive

ARCHITECTURE = REPO / "docs" / "architecture.md"


def python_module_commands(module: str) -> list[list[str]]:
    """Arguments of every distinct `python -m MODULE ...` of the pages: in bash blocks and inline code.
    Not docs/architecture.md's, which name placeholders (`sweep=NAME`) and have their own test."""
    users = [page for page in pages() if page != ARCHITECTURE]
    text = " ".join(line for page in users for line in page.read_text().splitlines())
    inline = re.findall(r"`(python -m [^`]+)`", text)
    found = []
    shown = [w for b in blocks() if b.page in users for w in commands(b.text)]
    for words in shown + [shlex.split(c) for c in inline]:
        if words[:3] == ["python", "-m", module] and words[3:] not in found:
            found.append(words[3:])
    return found


def test_readme_opens_with_make_demo_then_make_test():
    text = README.read_text()
    assert len(text.splitlines()) < 200, "README holds what a newcomer reads first; the rest is in docs/"
    first = blocks()[0]
    assert [" ".join(c) for c in commands(first.text)] == ["make demo", "make test"]
    assert text.index("```bash") < text.index("\n## "), "the two commands come before any section"


@pytest.fixture(scope="module")
def generated() -> str:
    return config_reference.generate()


def test_config_reference_is_in_sync_with_the_config_tree(generated):
    page = page_holding(config_reference.START)
    assert page == config_reference.PAGE, "`python -m config.reference --write` writes where the reference is"
    body = page.read_text().split(config_reference.START, 1)[1].split(config_reference.END, 1)[0]
    assert body.strip() == generated.strip(), (
        f"{page.name}'s configuration reference is stale: run `python -m config.reference --write`"
    )


def test_config_reference_lists_every_key_and_its_choices_are_accepted(generated):
    from omegaconf import OmegaConf

    key_table = generated.split("\n\n")[1]  # the first table: one row per key
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]*)`[^|]* \| (.*?) \|", key_table, flags=re.M)
    composed = OmegaConf.to_container(compose([]))
    composed.pop("sweep")  # the sweep group has its own table
    leaves = pd.json_normalize(composed, sep=".").columns
    assert {key for key, _, _ in rows} == set(leaves), "every configuration key, and only those"
    for key, _, allowed in rows:
        choices = re.match(r"choose one of (.*)", allowed)
        for value in choices.group(1).split(", ") if choices else []:
            compose([f"{key}={value}"])  # every documented choice is accepted


@pytest.mark.slow  # every README command composed: 12 s
def test_readme_commands_use_options_the_code_accepts(capsys):
    trains = python_module_commands("sweeper.train")
    assert ["--cfg", "job"] in trains
    for args in trains:
        if args != ["--cfg", "job"]:
            compose(args)
    sweeps = [a for a in python_module_commands("sweeper.sweep") if a]  # a bare mention names the module
    assert len(sweeps) >= 3, "the pages show how to run a sweep"
    for args in [a for a in sweeps if not {"--config-dir", "-cd"} & set(a)]:  # run where their dir is made
        rc = sweep_cli.main([a for a in args if not a.startswith("sweep.dry_run")] + ["sweep.dry_run=true"])
        assert rc == 0, f"python -m sweeper.sweep {shlex.join(args)}: {capsys.readouterr().err}"
    from analysis import cli
    from bench import __main__ as bench_command
    from bench import gpu, pack, speed_memory, step, step_seconds, sweep
    from sweeper import scale_probe

    for args in python_module_commands("analysis.report") + python_module_commands("analysis.claims"):
        cli.parse(args)
    benchmarks = {"gpu": gpu, "pack": pack, "speed_memory": speed_memory, "step": step}
    benchmarks |= {"step_seconds": step_seconds, "sweep": sweep}
    lines = [a for a in python_module_commands("bench") if a]  # a bare mention names the module
    lines += [[name, *a] for name in benchmarks for a in python_module_commands(f"bench.{name}")]
    for args in lines:
        settings = benchmarks[bench_command.parse(args)].parse(args[1:])  # the options, overrides composed
        if hasattr(settings, "overrides"):  # step_seconds and sweep compose them with their grid's, later
            compose(settings.overrides)
    probes = [a for a in python_module_commands("sweeper.scale_probe") if a]
    assert probes, "docs/cluster.md shows the driver's scale probe"
    for args in probes:
        _, overrides = scale_probe.parse(args)
        compose(overrides)
    preflights = [a for a in python_module_commands("sweeper.preflight") if a]
    assert preflights, "docs/commands.md shows the preflight"
    for args in preflights:
        sweep_cli.load(args)  # the sweep's own overrides: composed, expanded and validated
    reruns = [a for a in python_module_commands("sweeper.rerun") if a]
    assert reruns and all(
        len(a) == 1 or (len(a) == 2 and a[1].startswith("tracking.uri=")) for a in reruns
    ), reruns
    assert ["RUN_ID", "tracking.uri=http://127.0.0.1:5000"] in reruns
    rerun_help = subprocess.run(
        [sys.executable, "-m", "sweeper.rerun", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert rerun_help.returncode == 0 and "tracking.uri=URI" in rerun_help.stdout
    importlib.import_module("analysis.claims")


def test_docs_list_the_exit_code_table_and_every_command():
    page = page_holding("<!-- exit-codes:start")
    text = page.read_text()
    body = text.split("<!-- exit-codes:start", 1)[1].split("-->", 1)[1].split("<!-- exit-codes:end -->", 1)[0]
    assert body.strip() == exit_codes.markdown(), (
        f"{page.name}'s exit codes differ from cli/exit_codes.py's table"
    )
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    listed = re.findall(r"^\| `(leaner-[\w-]+)` \| `python -m ([\w.]+)` \|", text, flags=re.M)
    # `python -m PACKAGE` runs PACKAGE/__main__.py: its console script names PACKAGE.__main__:main.
    assert {name: f"{module}:main" for name, module in listed} == {
        name: target.replace(".__main__:", ":") for name, target in scripts.items()
    }


def test_pages_name_files_that_exist():
    text = "\n".join(page.read_text() for page in pages())
    for path in sorted(
        set(re.findall(r"(?<![\w/])(docker/[\w.-]+|conf/[\w./-]+\.yaml|docs/[\w./-]+\.(?:png|md))", text))
    ):
        if path != "docker/mlflow/.env":  # the user makes it from docker/mlflow/.env.example
            assert (REPO / path).exists(), path


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation but - and _ dropped, spaces to -."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_links_between_pages_lead_to_a_file_and_heading():
    """Every relative link and image of every page: its file exists, and its #anchor is a heading there."""
    prose = {page: re.sub(r"```.*?```|`[^`]*`", "", page.read_text(), flags=re.S) for page in pages()}
    links = [
        (page, target) for page, text in prose.items() for target in re.findall(r"\]\(([^)\s]+)\)", text)
    ]
    assert len(links) > 20
    for page, target in links:
        if re.match(r"\w+://", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: link to {target}: no such file"
        if anchor:
            assert anchor in anchors(linked), f"{page.name}: link to {target}: no such heading"


# Every package of the tree (a new one included without an edit here), and the other folders a document names.
PACKAGES = sorted(p.name for p in REPO.iterdir() if (p / "__init__.py").exists())
DIRECTORIES = sorted({*PACKAGES, "conf", "docker", "tests", "docs"})


def test_architecture_names_files_modules_and_targets_that_exist():
    text = ARCHITECTURE.read_text()
    found = re.findall(r"(?<![\w/.-])((?:" + "|".join(DIRECTORIES) + r")/[\w./-]*)", text)
    paths = {path.rstrip(".") for path in found}  # a sentence may end right after a path
    assert len(paths) > 20
    for path in sorted(paths):
        assert (REPO / path).exists(), f"docs/architecture.md names {path}: no such file or folder"
    modules = set(re.findall(r"python -m ([\w.]+)", text))
    assert len(modules) >= 6
    for module in sorted(modules):
        importlib.import_module(module)
    targets = set(re.findall(r"`make ([\w-]+)`", text))
    assert targets >= {"test", "test-fast"}
    makefile = (REPO / "Makefile").read_text()
    assert all(re.search(rf"^{re.escape(t)}:", makefile, flags=re.M) for t in targets), targets


def test_architecture_lists_the_sweeps_timeline_as_drive_calls_it():
    """Section 4's numbered steps name, in order, the calls `drive` makes: its timeline as the code runs."""
    steps = re.findall(r"^   \d+\. \*[^*]+\*: `(\w+)`", ARCHITECTURE.read_text(), flags=re.M)
    assert len(steps) >= 5, steps
    calls = sorted(
        (node.lineno, node.col_offset, getattr(node.func, "attr", getattr(node.func, "id", "")))
        for node in ast.walk(ast.parse(inspect.getsource(drive)))
        if isinstance(node, ast.Call)
    )
    assert [name for _, _, name in calls if name in steps] == steps, (
        f"docs/architecture.md lists the steps {steps}; drive calls them otherwise"
    )


# The demo sweep at smoke scale: the store `make demo` leaves, in a fraction of its time. One CPU a trial (the
# default), two at a time: half-CPU slots start twice the Ray workers, which on 2 cores cost more than the
# tiny trials (measured on the smoke store's sweep: 21 s and 27 CPU-s, against 28 s and 40 at 0.5).
# No dashboard here: docs/cluster.md's own smoke sweep keeps one, whose link the test checks.
DEMO_STEPS = f"train.steps=20 train.eval_every=10 train.val_batches=2 {NO_DASHBOARD}"


def demo_sweep() -> str:
    """The Makefile's demo sweep command (its first recipe line), at DEMO_STEPS."""
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    (sweep,) = [line.strip() for line in recipe if "-m sweeper.sweep " in line]
    return f"{sweep.replace('$(PY)', 'python')} {DEMO_STEPS}"


def runnable_script() -> str:
    parts = ["set -euo pipefail", 'echo "### make demo\'s sweep"', demo_sweep()]
    for block in runnable_blocks():
        text = block.text
        if block.lang == "python":  # a notebook's cells so far, in one interpreter
            cells = [b for b in runnable_blocks() if (b.page, b.lang) == (block.page, "python")]
            so_far = [b.text for b in cells if b.line <= block.line]
            text = "python - <<'EOF'\n" + "\n".join(so_far) + "\nEOF"
        if block.smoke:
            smoke = " ".join(block.smoke)
            text = re.sub(
                r"^(python -m sweeper\.train .*)$", lambda m, s=smoke: f"{m.group(1)} {s}", text, flags=re.M
            )
        parts += [f'echo "### block of {block.where} (started at ${{SECONDS}}s)"', text]
    return "\n".join(parts) + "\n"


def test_runnable_blocks_are_marked():
    assert len(runnable_blocks()) >= 5
    # A marker must sit right above a bash or python fence, or it would silently mark nothing.
    for page in pages():
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith("<!-- runnable"):
                assert lines[i + 1].strip() in ("```bash", "```python"), f"{page.name} line {i + 1}: no block"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_runnable_blocks(tmp_path):
    """Every runnable block, in pages() order, in one shell, in a directory where `make demo`'s sweep ran."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
        PYTHONPATH=str(REPO),
        MPLBACKEND="Agg",
        RAY_DEDUP_LOGS="0",
    )
    start = time.monotonic()
    result = subprocess.run(
        ["bash", "-c", runnable_script()], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=880
    )
    seconds = time.monotonic() - start
    ran = re.findall(r"### block of (.*) \(started", result.stdout)
    print("\n".join(re.findall(r"### block .*", result.stdout)) + f"\nall done in {seconds:.0f}s")
    assert result.returncode == 0, (
        f"the block of {ran[-1] if ran else '?'} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    assert len(ran) == len(runnable_blocks())
    out = result.stdout
    assert "300 configurations x 10 seeds = 3000 trials" in out
    assert "BN-L2 tau0.1 d4 k6 n128" in out, "the median across seeds reads the demo's runs"
    assert "varying: ['model.embedding']" in out, "docs/notebook.md's cells read the demo's runs"
    assert re.search(r"finished 20 steps: val_rel_lloyd", out)
    assert "torch.Size([4, 6, 4])" not in out  # the trained configuration is d 32, k 10
    assert "torch.Size([4, 10, 32])" in out
    assert "View the dashboard at" in out + result.stderr  # a local sweep serves Ray's dashboard by default
    assert (tmp_path / "reports").is_dir() and any((tmp_path / "reports").rglob("index.md"))


def test_every_torch_load_is_weights_only():
    """The security notes promise it: no checkpoint unpickles code when loaded."""
    sources = [p for d in (*PACKAGES, "tests") for p in (REPO / d).rglob("*.py")]
    calls = [
        (p, m)
        for p in sources
        for m in re.finditer(r"torch\.load\(([^()]*(?:\([^()]*\)[^()]*)*)\)", p.read_text())
    ]
    assert calls, "the project loads checkpoints somewhere"
    for path, call in calls:
        assert "weights_only=True" in call.group(1), f"{path.relative_to(REPO)}: {call.group(0)}"
    readme_calls = [c for p in pages() for c in re.findall(r"torch\.load\(([^)]*)\)", p.read_text())]
    assert readme_calls and all("weights_only=True" in c for c in readme_calls)


SCIENCE = REPO / "docs" / "science.md"


def test_every_claim_is_written_up_in_docs_science():
    from analysis.claims.records import CLAIMS

    text = SCIENCE.read_text()
    missing = [record.name for record in CLAIMS if f"`{record.name}`" not in text]
    assert not missing, f"docs/science.md section 7.1 lacks {missing}"
    assert "### 7.1 The paper's claims" in text
    headings = re.findall(r"^## (\d+)\. ", text, flags=re.M)
    assert headings == [str(n) for n in range(1, 9)]  # the section numbers the code cites


def test_no_reference_points_outside_the_repository():
    """Code, configs, the Makefile and the docs cite docs/science.md, never a spec outside the clone.
    docs/results/ is one run's committed output and is rewritten by the next run."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    files = [
        REPO / name
        for name in tracked.stdout.split()
        if (name.endswith((".py", ".yaml", ".md", ".toml")) or name == "Makefile")
        and not name.startswith("docs/results/")
        and REPO / name != Path(__file__)  # this test spells the patterns out
    ]
    assert README in files and SCIENCE in files or not SCIENCE.exists()
    outside = re.compile(r"\bSPEC\b|SPEC\.md|/work/|paper_grid\.csv beside|shared/paper")
    found = [
        f"{p.relative_to(REPO)}:{i}"
        for p in files
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if outside.search(line)
    ]
    assert not found, found
    cited = {int(n) for p in files for n in re.findall(r"docs/science\.md,? sections? (\d+)", p.read_text())}
    assert cited <= set(range(1, 9)), cited


def test_the_pip_section_shows_make_demo_as_the_makefile_runs_it():
    """docs/commands.md spells `make demo` out for an install, in the leaner-* commands: the Makefile's
    recipe, each `$(PY) -m MODULE` as its console script (the page's own table pairs them)."""
    page = REPO / "docs" / "commands.md"
    scripts = dict(
        (m, s) for s, m in re.findall(r"\| `(leaner-\w+)` \| `python -m ([\w.]+)` \|", page.read_text())
    )
    recipe = (REPO / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    expected = [
        re.sub(r"^\$\(PY\) -m ([\w.]+)", lambda m: scripts[m.group(1)], line.strip()) for line in recipe
    ]
    shown = [b for b in blocks() if b.page == page and b.text.startswith("leaner-sweep sweep=demo")]
    assert [b.text.splitlines() for b in shown] == [expected]
