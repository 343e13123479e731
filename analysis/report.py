"""`python -m analysis.report [figures=[...]] [tracking.*] [select.*] [eval.*]`: every figure and table.

Writes under reports/<experiment>/: each figure as PNG and PDF, its plotted
data as CSV, its tables as CSV and Markdown, and index.md showing every
figure with the runs it used, and index.html, the same page in one self-contained file
(figures inline: MLflow's artifact viewer shows it, its Markdown viewer does not show relative
images). A report on one sweep's runs is also stored in that sweep's parent MLflow run (artifacts
report/), which then carries the sweep's summary as metrics (median_val_rel_lloyd.<embedding>,
claims_passed, claims_failed, claims_untested), so that sweeps compare in the runs table. A figure whose
inputs are not in the store is listed once, at the end of the index, with what it needs; the others are still
drawn. The index opens on the headline: the median final val_rel_lloyd per embedding and the claims'
verdicts. Evaluations of checkpoints are cached (under reports/ and, when the store is writable, as
evaluation runs in MLflow), so a second report is fast.
Prints `report: PATH` of index.md last.
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import pandas as pd
from mlflow.entities import Metric
from tqdm import tqdm

from analysis.claims import records
from analysis.claims.table import Claim, claims_table, write_csv, write_markdown
from analysis.claims.verdicts import check
from analysis.cli import job_config, open_context, options_help
from analysis.context import Context, Want, varying
from analysis.figures import FIGURES, reads
from analysis.page import anchor, page
from analysis.plot import Figure, MissingInput
from analysis.runs import config_keys
from analysis.style import order
from cli import console
from cli.credentials import mask
from cli.entry import command
from tracking import sqlite_guard, store, ui
from tracking.names import CLAIM_COUNTS, FINISHED, MEDIAN_FINAL, REPORT_DIR, REPORT_HTML, SWEEP, VAL_REL_LLOYD
from tracking.parent_run import attach_report, find_parent

Block = tuple[str, object]  # (kind, content): the index's pieces, written as Markdown and as HTML


def markdown(table: pd.DataFrame, digits: int = 4) -> str:
    """A DataFrame as a GitHub Markdown table."""

    def cell(v: object) -> str:
        return f"{v:.{digits}g}" if isinstance(v, float) else str(v)

    head = "| " + " | ".join(map(str, table.columns)) + " |"
    rule = "|" + "---|" * len(table.columns)
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def to_markdown(blocks: list[Block]) -> str:
    """index.md: images by relative path (GitHub and local viewers show them; MLflow's Markdown viewer
    shows only absolute image addresses, so index.html carries the same page with its figures inline)."""
    heads = {"h1": "#", "h2": "##", "h3": "###"}
    out = []
    for kind, content in blocks:
        if kind in heads:
            out.append(f"{heads[kind]} {content}")
        elif kind == "img":
            out.append(f"![{Path(content).stem}]({content})")
        elif kind == "ul":
            out.append("\n".join(f"- {item}" for item in content))
        elif kind == "table":
            out.append(markdown(content))
        elif kind == "pre":
            out.append(f"```\n{content.rstrip()}\n```")
        else:
            out.append(str(content))
    return "\n\n".join(out) + "\n"


def write_outputs(figure: Figure, out_dir: Path) -> None:
    figure.data.to_csv(out_dir / f"{figure.name}.csv", index=False)
    for name, table in figure.tables.items():
        table.to_csv(out_dir / f"{name}.csv", index=False)
        (out_dir / f"{name}.md").write_text(markdown(table) + "\n")


def section(name: str, ctx: Context, figure: Figure, seconds: float) -> list[Block]:
    """A drawn figure's part of the index: its image, the runs that made it, notes, tables."""
    blocks: list[Block] = [
        ("h2", name),
        ("img", f"{name}.png"),
        (
            "p",
            f"Files: [{name}.png]({name}.png), [{name}.pdf]({name}.pdf), "
            f"plotted data [{name}.csv]({name}.csv) ({seconds:.1f} s).",
        ),
    ]
    used = ctx.runs[ctx.runs["run_id"].isin(figure.run_ids)]
    if len(used):
        outcome = used["outcome"].value_counts().to_dict()
        used[["run_id", "run_name"]].to_csv(ctx.out_dir / f"{name}_runs.csv", index=False)
        blocks.append(
            (
                "p",
                f"Runs used: {len(used)} ({', '.join(f'{v} {k}' for k, v in outcome.items())}); "
                f"{len(used[config_keys(used.columns)].drop_duplicates())} configurations, "
                f"seeds {sorted(used['seed'].unique().tolist())}; their ids and names: "
                f"[{name}_runs.csv]({name}_runs.csv).",
            )
        )
    else:
        blocks.append(("p", "Runs used: none (not from training runs)."))
    if figure.notes:
        blocks.append(("ul", list(figure.notes)))
    for table_name, table in figure.tables.items():
        blocks += [
            ("h3", table_name),
            ("p", f"[{table_name}.csv]({table_name}.csv), [{table_name}.md]({table_name}.md)"),
            ("table", table),
        ]
    return blocks


NOT_DRAWN = "Not drawn"  # the index's last section: every figure the store cannot support, and why


def not_drawn_section(missing: dict[str, str], failed: dict[str, str]) -> list[Block]:
    """The figures left out, once, at the end: what each needs that the store lacks, and any that failed
    (with the end of its traceback)."""
    if not missing and not failed:
        return []
    blocks: list[Block] = [("h2", NOT_DRAWN)]
    if missing:
        blocks += [
            ("p", "What this store cannot support (everything it can is drawn above):"),
            ("ul", [f"**{name}**: {why.removeprefix(f'{name}: ')}" for name, why in missing.items()]),
        ]
    for name, error in failed.items():
        why, _, trace = error.partition("\n")
        blocks += [
            ("p", f"**{name} failed** (a fault of the report, not of the store): {why}"),
            ("pre", trace),
        ]
    return blocks


def headline_table(ctx: Context) -> pd.DataFrame:
    """Per embedding, over its finished runs of every configuration in the store: the median final
    val_rel_lloyd and its inter-quartile range (the parent run's MEDIAN_FINAL metrics too)."""
    finished = ctx.runs[(ctx.runs["outcome"] == FINISHED) & ctx.runs[VAL_REL_LLOYD].notna()]
    rows = [
        {
            "embedding": embedding,
            "finished runs": len(values),
            f"median final {VAL_REL_LLOYD}": float(values.median()),
            "IQR": f"[{values.quantile(0.25):.3g}, {values.quantile(0.75):.3g}]",
        }
        for embedding, values in finished.groupby("model.embedding")[VAL_REL_LLOYD]
    ]
    return pd.DataFrame(sorted(rows, key=lambda row: order("model.embedding", row["embedding"])))


def axes_table(ctx: Context) -> pd.DataFrame:
    """Per swept axis (a config key whose value differs among the finished runs) and value: its
    configurations and finished runs, and the median and IQR of their final val_rel_lloyd over seeds and the
    other axes' values, so that any sweep, the user's own included, compares its axes."""
    finished = ctx.runs[(ctx.runs["outcome"] == FINISHED) & ctx.runs[VAL_REL_LLOYD].notna()]
    keys = config_keys(finished.columns)
    rows = [
        {
            "axis": key,
            "value": value,
            "configurations": len(part[keys].drop_duplicates()),
            "finished runs": len(part),
            f"median final {VAL_REL_LLOYD}": float(part[VAL_REL_LLOYD].median()),
            "IQR": f"[{part[VAL_REL_LLOYD].quantile(0.25):.3g}, {part[VAL_REL_LLOYD].quantile(0.75):.3g}]",
        }
        for key in varying(finished[keys])
        for value, part in finished.groupby(key, sort=True)
    ]
    return pd.DataFrame(rows)


def axes_section(ctx: Context) -> list[Block]:
    """The headline's comparison of the swept axes (axes_table), written as axes.csv too."""
    table = axes_table(ctx)
    if table.empty:
        return []
    table.to_csv(ctx.out_dir / "axes.csv", index=False)
    return [
        (
            "p",
            "Per swept axis and value, over the finished runs that have it (seeds and the other axes' "
            "values pooled: a paper figure narrows to one slice, this table does not): [axes.csv](axes.csv)",
        ),
        ("table", table),
    ]


def verdicts(claims: list[Claim] | None, out_dir: Path) -> tuple[pd.DataFrame | None, str]:
    """The claims' verdicts (name, status, beyond) and where they come from: judged by this report, else the
    claims.csv beside it (`python -m analysis.claims` or an earlier full report), else none."""
    if claims is not None:
        return claims_table(claims), "judged by this report on this store; their numbers: [claims](#claims)"
    path = out_dir / "claims.csv"
    if path.exists():
        written = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(path.stat().st_mtime))
        return (
            pd.read_csv(path),
            f"from [claims.csv](claims.csv) beside this report, written {written}, not judged again by this "
            "report of chosen figures; their numbers: [claims.md](claims.md)",
        )
    return None, (
        "not judged by a report of chosen figures: `python -m analysis.report` (every figure) or "
        "`python -m analysis.claims` judges them"
    )


def headline_section(ctx: Context, claims: list[Claim] | None) -> list[Block]:
    """The index's first section: the median final val_rel_lloyd per embedding and the claims' verdicts."""
    blocks: list[Block] = [("h2", "Headline")]
    table = headline_table(ctx)
    if table.empty:
        blocks.append(("p", f"No finished run has a final {VAL_REL_LLOYD}."))
    else:
        blocks += [
            (
                "p",
                f"Median final {VAL_REL_LLOYD} per embedding (the model's k-means objective on validation "
                "tasks over that of one Lloyd step: below 1 beats it), over its finished runs:",
            ),
            ("table", table),
            *axes_section(ctx),
        ]
    found, source = verdicts(claims, ctx.out_dir)
    if found is None:
        return blocks + [("p", f"The paper's claims: {source}.")]
    paper = found[~found["beyond"].astype(bool)]
    counts = ", ".join(f"{(paper['status'] == s).sum()} {s}" for s in CLAIM_COUNTS)
    rows = [
        {
            "verdict": status,
            "claims": ", ".join(
                f"`{c.name}`" + (" (beyond the paper)" if c.beyond else "")
                for c in found[found["status"] == status].itertuples()
            ),
        }
        for status in CLAIM_COUNTS
        if (found["status"] == status).any()
    ]
    return blocks + [
        ("p", f"The paper's {len(paper)} claims: {counts} ({source})."),
        ("table", pd.DataFrame(rows)),
    ]


def build(ctx: Context, names: list[str]) -> tuple[Path, int, list[Claim] | None]:
    """Draw the figures, write index.md and index.html; returns the index's path, the number of figures
    that failed with an error, and the claims (checked by the full report only).

    The index leads with the headline, then the drawn figures in FIGURES' order and the claims, and ends,
    once, with what was not drawn and why."""
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    sections: list[Block] = []
    drawn: dict[str, Figure] = {}
    missing: dict[str, str] = {}
    failed: dict[str, str] = {}
    lines = console.lines_not_bars()  # in a log file: a line per figure, not a bar redrawn
    for i, name in enumerate(bar := tqdm(names, desc="report", unit="figure", disable=lines)):
        bar.set_postfix_str(name)
        if lines:
            print(f"report: figure {i + 1}/{len(names)}: {name}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            figure = FIGURES[name](ctx)
            write_outputs(figure, ctx.out_dir)
        except MissingInput as err:
            missing[name] = str(err)
            continue
        except Exception as err:  # one broken figure must not take the report down; the index says why
            failed[name] = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=4)}"
            continue
        drawn[name] = figure
        sections += section(name, ctx, figure, time.perf_counter() - start)
    claims = None
    if set(names) == set(FIGURES):  # the full report also checks the paper's claims, on what it drew
        claims = check(ctx, drawn)
        sections += claims_section(claims, ctx.out_dir)
    sections += not_drawn_section(missing, failed)
    outcomes = ctx.runs["outcome"].value_counts().to_dict().items()
    contents = [
        "Headline",
        *drawn,
        *(["claims"] if claims else []),
        *([NOT_DRAWN] if missing or failed else []),
    ]
    head: list[Block] = [
        ("h1", f"Report: experiment `{ctx.experiment}`"),
        (
            "p",
            f"Store `{mask(ctx.uri)}`; {len(ctx.runs)} training runs "
            f"({', '.join(f'{v} {k}' for k, v in outcomes)}); {len(drawn)} of {len(names)} figures drawn. "
            "Curves: per seed, mean over tasks of the log k-means objective (or the logged metric), then the "
            "median across seeds with the inter-quartile band; Lloyd's in black; diverged runs left out and "
            "counted.",
        ),
        ("p", f"Checkpoints: {ctx.settings.checkpoint_note()}."),
        ("p", "Contents: " + ", ".join(f"[{n}](#{anchor(n)})" for n in contents)),
    ]
    body = headline_section(ctx, claims) + sections
    index = ctx.out_dir / "index.md"
    inline = ("p", f"The same page with its figures inline, in one file: [{REPORT_HTML}]({REPORT_HTML}).")
    index.write_text(to_markdown([*head[:3], inline, *head[3:], *body]))
    (ctx.out_dir / REPORT_HTML).write_text(page(head + body, ctx.out_dir, f"Report: {ctx.experiment}"))
    return index, len(failed), claims


def claims_section(claims: list[Claim], out_dir: Path) -> list[Block]:
    """The paper's claims (analysis.claims) written as claims.csv and claims.md; their part of the index."""
    write_csv(claims, out_dir)
    write_markdown(claims, out_dir)
    table = claims_table(claims)[["status", "name", "numbers", "marginal", "seeds", "beyond", "paper"]]
    return [
        ("h2", "claims"),
        (
            "p",
            "The paper's claims (docs/science.md section 7.1) against this store "
            "(`python -m analysis.claims`), each judged on its own sub-grid and slice: "
            "[claims.csv](claims.csv), [claims.md](claims.md).",
        ),
        ("table", table),
    ]


def summary(ctx: Context, claims: list[Claim] | None) -> dict[str, float]:
    """The sweep's summary as metrics of its parent run: the headline's median final val_rel_lloyd per
    embedding; the claims passed, failed and untested when the full report checked them."""
    median = f"median final {VAL_REL_LLOYD}"
    out = {MEDIAN_FINAL + str(row["embedding"]): row[median] for _, row in headline_table(ctx).iterrows()}
    if claims is not None:
        out.update(
            {name: float(sum(c.status == status for c in claims)) for status, name in CLAIM_COUNTS.items()}
        )
    return out


def written_since(folder: Path, before: dict[Path, int]) -> list[Path]:
    """The files of `folder` that are new or changed since the snapshot `before` (path -> mtime in ns)."""
    return sorted(p for p in folder.iterdir() if p.is_file() and before.get(p) != p.stat().st_mtime_ns)


def snapshot(folder: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in folder.iterdir() if p.is_file()} if folder.is_dir() else {}


def attach_to_sweep(ctx: Context, files: list[Path], metrics: dict[str, float]) -> str | None:
    """A report on one sweep's runs goes to that sweep's parent run (artifacts report/, and the summary
    `metrics`); returns where to see it."""
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
    if not sqlite_guard.writable(ctx.uri):
        return f"tracking store {ctx.uri} is read-only: the report stays here, not on sweep {sweeps[0]}'s run"
    attach_report(client, parent, files)
    client.log_batch(parent, metrics=[Metric(k, v, int(time.time() * 1000), 0) for k, v in metrics.items()])
    address = ui.run_page(ctx.uri, experiment_id, parent, f"artifactPath/{REPORT_DIR}/{REPORT_HTML}")
    return (
        f"report attached to the parent run of sweep {sweeps[0]} (artifacts {REPORT_DIR}/, "
        f"{REPORT_DIR}/{REPORT_HTML} in one page); "
        f"{ui.how_to_open(ctx.uri, address)}"
    )


def wants(own: dict) -> Callable[[Context], list[Want]]:
    """What the report reads before drawing: its figures' evaluations and, drawing all, the claims'."""
    names = own["figures"] or list(FIGURES)
    full = set(names) == set(FIGURES)
    return lambda ctx: reads(names, ctx) + (records.reads(ctx) if full else [])


@command("leaner-report", show_config=job_config, options=lambda: options_help(list(FIGURES)))
def main(argv: list[str]) -> int:
    ctx, own = open_context(argv, list(FIGURES), wants)
    before = snapshot(ctx.out_dir)
    index, failed, claims = build(ctx, own["figures"] or list(FIGURES))
    where = attach_to_sweep(ctx, written_since(ctx.out_dir, before), summary(ctx, claims))
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
