"""`python -m analysis.report [figures=[...]] [tracking.*] [select.*] [eval.*]`: every figure and table.

Writes under reports/<experiment>/: each figure as PNG and PDF, its plotted
data as CSV, its tables as CSV and Markdown, and index.md showing every
figure with the runs it used. A report on one sweep's runs is also stored in that sweep's
parent MLflow run (artifacts report/). A figure whose inputs are not in the store is
named in the index with what it needs, and the others are still drawn.
Evaluations are cached (see analysis.checkpoint_eval), so a second report is fast.
Prints `report: PATH` of index.md last.
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from analysis.claims import check, claims_table, write_csv
from analysis.cli import job_config, open_context, options_help
from analysis.context import Context
from analysis.figures import FIGURES
from analysis.plot import Figure, MissingInput
from analysis.runs import config_keys
from sweeper import console
from sweeper.entry import command
from sweeper.parent_run import attach_report, find_parent
from tracking import store, ui
from tracking.names import REPORT_DIR, SWEEP


def markdown(table: pd.DataFrame, digits: int = 4) -> str:
    """A DataFrame as a GitHub Markdown table."""

    def cell(v: object) -> str:
        return f"{v:.{digits}g}" if isinstance(v, float) else str(v)

    head = "| " + " | ".join(map(str, table.columns)) + " |"
    rule = "|" + "---|" * len(table.columns)
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def write_outputs(figure: Figure, out_dir: Path) -> None:
    figure.data.to_csv(out_dir / f"{figure.name}.csv", index=False)
    for name, table in figure.tables.items():
        table.to_csv(out_dir / f"{name}.csv", index=False)
        (out_dir / f"{name}.md").write_text(markdown(table) + "\n")


def section(name: str, ctx: Context, result: Figure | str, seconds: float) -> str:
    """The index entry of one figure: the image, which runs made it, its notes and tables; or why it is missing."""
    if isinstance(result, str):
        return f"## {name}\n\n**Not drawn.** {result}\n"
    lines = [
        f"## {name}",
        "",
        f"![{name}]({name}.png)",
        "",
        f"Files: [{name}.png]({name}.png), [{name}.pdf]({name}.pdf), plotted data [{name}.csv]({name}.csv) "
        f"({seconds:.1f} s).",
    ]
    used = ctx.runs[ctx.runs["run_id"].isin(result.run_ids)]
    if len(used):
        outcome = used["outcome"].value_counts().to_dict()
        lines += [
            "",
            f"Runs used: {len(used)} ({', '.join(f'{v} {k}' for k, v in outcome.items())}); "
            f"{len(used[config_keys(used.columns)].drop_duplicates())} configurations, "
            f"seeds {sorted(used['seed'].unique().tolist())}.",
            "",
            "<details><summary>run ids and names</summary>",
            "",
            *[f"- `{r.run_id}` {r.run_name}" for r in used.itertuples()],
            "",
            "</details>",
        ]
    else:
        lines += ["", "Runs used: none (not from training runs)."]
    lines += [""] + [f"- {note}" for note in result.notes]
    for table_name, table in result.tables.items():
        lines += [
            "",
            f"### {table_name}",
            "",
            f"[{table_name}.csv]({table_name}.csv), [{table_name}.md]({table_name}.md)",
            "",
            markdown(table),
        ]
    return "\n".join(lines) + "\n"


def build(ctx: Context, names: list[str]) -> tuple[Path, int]:
    """Draw the figures, write the index; returns its path and the number of figures that failed with an error."""
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    sections, failed = [], 0
    lines = console.lines_not_bars()  # in a log file: a line per figure, not a bar redrawn
    for i, name in enumerate(bar := tqdm(names, desc="report", unit="figure", disable=lines)):
        bar.set_postfix_str(name)
        if lines:
            print(f"report: figure {i + 1}/{len(names)}: {name}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            result: Figure | str = FIGURES[name](ctx)
            write_outputs(result, ctx.out_dir)
        except MissingInput as err:
            result = f"Missing input: {err}"
        except Exception as err:  # one broken figure must not take the report down; the index says why
            failed += 1
            result = f"Failed: {type(err).__name__}: {err}\n\n```\n{traceback.format_exc(limit=4)}```"
        sections.append(section(name, ctx, result, time.perf_counter() - start))
    head = [
        f"# Report: experiment `{ctx.experiment}`",
        "",
        f"Store `{ctx.uri}`; {len(ctx.runs)} training runs "
        f"({', '.join(f'{v} {k}' for k, v in ctx.runs['outcome'].value_counts().to_dict().items())}). "
        "Curves: per seed, mean over tasks of the log k-means objective (or the logged metric), then the median "
        "across seeds with the inter-quartile band; Lloyd's in black; diverged runs left out and counted.",
        "",
        f"Checkpoints: {ctx.settings.checkpoint_note()}.",
        "",
        "Contents: " + ", ".join(f"[{n}](#{n})" for n in names),
        "",
    ]
    if set(names) == set(
        FIGURES
    ):  # the full report also checks the paper's claims (from the cached evaluations)
        sections.append(claims_section(ctx))
    index = ctx.out_dir / "index.md"
    index.write_text("\n".join(head) + "\n" + "\n".join(sections))
    return index, failed


def claims_section(ctx: Context) -> str:
    """The paper's claims (analysis.claims), written as claims.csv and claims.md, and their table for the index."""
    claims = check(ctx)
    write_csv(claims, ctx.out_dir)
    table = markdown(claims_table(claims)[["status", "name", "numbers", "paper"]])
    (ctx.out_dir / "claims.md").write_text(table + "\n")
    return (
        "## claims\n\nThe paper's claims (docs/science.md section 7.1) against this store (`python -m analysis.claims`), each judged "
        "on its own sub-grid and slice: [claims.csv](claims.csv), [claims.md](claims.md).\n\n" + table + "\n"
    )


def written_since(folder: Path, before: dict[Path, int]) -> list[Path]:
    """The files of `folder` that are new or changed since the snapshot `before` (path -> mtime in ns)."""
    return sorted(p for p in folder.iterdir() if p.is_file() and before.get(p) != p.stat().st_mtime_ns)


def snapshot(folder: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in folder.iterdir() if p.is_file()} if folder.is_dir() else {}


def attach_to_sweep(ctx: Context, files: list[Path]) -> str | None:
    """A report on one sweep's runs goes to that sweep's parent run (artifacts report/); returns where to see it."""
    # A run's sweep tag is a list (a run one sweep finished, another adopted): the sweeps every run carries.
    sweeps = set.intersection(*(set(str(s).split(",")) for s in ctx.runs[SWEEP].fillna("")))
    if len(sweeps) != 1:
        return None
    sweeps = sorted(sweeps)
    client = store.connect(ctx.uri, write=False)
    experiment_id = store.find_experiment(client, ctx.experiment)
    parent = find_parent(client, experiment_id, sweeps[0])
    if parent is None:
        return None
    if not store.writable(ctx.uri):
        return f"tracking store {ctx.uri} is read-only: the report stays here, not on sweep {sweeps[0]}'s run"
    attach_report(client, parent, files)
    address = ui.run_page(ctx.uri, experiment_id, parent)
    return (
        f"report attached to the parent run of sweep {sweeps[0]} (artifacts {REPORT_DIR}/); "
        f"{ui.how_to_open(ctx.uri, address)}"
    )


@command("leaner-report", show_config=job_config, options=lambda: options_help(list(FIGURES)))
def main(argv: list[str]) -> int:
    ctx, own = open_context(argv, list(FIGURES))
    before = snapshot(ctx.out_dir)
    index, failed = build(ctx, own["figures"] or list(FIGURES))
    where = attach_to_sweep(ctx, written_since(ctx.out_dir, before))
    if where:
        print(where)
    print(f"report: {shown(index)}")
    return 1 if failed else 0


def shown(path: Path) -> Path:
    """A path as the user typed where it is: relative to the working directory when under it."""
    path = path.resolve()
    return path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path


if __name__ == "__main__":
    sys.exit(main())
