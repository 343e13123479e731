"""What the report shows, built from what was read, drawn and judged: the index as blocks (index.md and
index.html, rendered by analysis.page), the files beside it but the figures' images (each figure's plotted
data, tables and runs, axes.csv; the claims judged) and the sweep's summary metrics. Nothing here writes a
file: analysis.folder does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.claims.table import Claim, claims_table
from analysis.context import Context, config_keys, varying
from analysis.figures import Drawing
from analysis.page import Block, anchor
from analysis.plot import Figure
from analysis.style import order
from cli.credentials import mask
from tracking.names import CLAIM_COUNTS, FINISHED, MEDIAN_FINAL, REPORT_HTML, VAL_REL_LLOYD

NOT_DRAWN = "Not drawn"  # the index's last section: every figure the store cannot support, and why


@dataclass
class Report:
    """The report as content: its index as blocks, the files beside it but the figures' images (which drawing
    wrote), how many figures failed and the sweep's summary metrics."""

    markdown: list[Block]  # index.md
    html: list[Block]  # index.html, headed `title`: the same page with a link less, its figures inline
    title: str
    csv: dict[str, pd.DataFrame]  # file name -> table: each figure's plotted data and runs, axes.csv
    tables: dict[str, pd.DataFrame]  # the figures' tables, each written as <name>.csv and <name>.md
    claims: list[Claim] | None  # judged by the full report: written as the claims command writes them
    failed: int
    summary: dict[str, float]
    before: dict[Path, int]  # the folder's files before the drawing (analysis.figures.Drawing)


def build(ctx: Context, drawing: Drawing, claims: list[Claim] | None) -> Report:
    """The index leads with the headline, then the drawn figures in their order and the claims (judged by the
    full report only), and ends, once, with what was not drawn and why."""
    csv: dict[str, pd.DataFrame] = {}
    tables: dict[str, pd.DataFrame] = {}
    sections: list[Block] = []
    for name, figure in drawing.figures.items():
        csv |= figure_csv(name, figure, ctx.runs)
        tables |= figure.tables
        sections += section(name, ctx, figure, drawing.seconds[name])
    headline, axes = headline_table(ctx), axes_table(ctx)
    if not headline.empty and not axes.empty:
        csv["axes.csv"] = axes
    head = head_section(ctx, drawing, bool(claims))
    verdict, source = verdicts(claims, ctx.out_dir)
    if claims is not None:
        sections += claims_section(verdict)
    sections += not_drawn_section(drawing.missing, drawing.failed)
    body = headline_section(headline, axes, verdict, source) + sections
    inline = ("p", f"The same page with its figures inline, in one file: [{REPORT_HTML}]({REPORT_HTML}).")
    return Report(
        markdown=[*head[:3], inline, *head[3:], *body],
        html=head + body,
        title=f"Report: {ctx.experiment}",
        csv=csv,
        tables=tables,
        claims=claims,
        failed=len(drawing.failed),
        summary=summary(headline, claims),
        before=drawing.before,
    )


def figure_csv(name: str, figure: Figure, runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """A drawn figure's CSV files but its tables': its plotted data and the ids and names of the runs it
    used."""
    csv = {f"{figure.name}.csv": figure.data}
    used = runs[runs["run_id"].isin(figure.run_ids)]
    if len(used):
        csv[f"{name}_runs.csv"] = used[["run_id", "run_name"]]
    return csv


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


def head_section(ctx: Context, drawing: Drawing, judged: bool) -> list[Block]:
    """The index's title, what it was drawn from, and its contents."""
    outcomes = ctx.runs["outcome"].value_counts().to_dict().items()
    contents = [
        "Headline",
        *drawing.figures,
        *(["claims"] if judged else []),
        *([NOT_DRAWN] if drawing.missing or drawing.failed else []),
    ]
    return [
        ("h1", f"Report: experiment `{ctx.experiment}`"),
        (
            "p",
            f"Store `{mask(ctx.uri)}`; {len(ctx.runs)} training runs "
            f"({', '.join(f'{v} {k}' for k, v in outcomes)}); {len(drawing.figures)} of {len(drawing.names)} "
            "figures drawn. Curves: per seed, mean over tasks of the log k-means objective (or the logged "
            "metric), then the median across seeds with the inter-quartile band; Lloyd's in black; diverged "
            "runs left out and counted.",
        ),
        ("p", f"Checkpoints: {ctx.settings.checkpoint_note()}."),
        ("p", "Contents: " + ", ".join(f"[{n}](#{anchor(n)})" for n in contents)),
    ]


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


def verdicts(claims: list[Claim] | None, out_dir: Path) -> tuple[pd.DataFrame | None, str]:
    """The claims' verdicts (name, status, beyond ...) and where they come from: judged by this report, else
    the claims.csv beside it (`python -m analysis.claims` or an earlier full report), else none."""
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


def headline_section(
    headline: pd.DataFrame, axes: pd.DataFrame, found: pd.DataFrame | None, source: str
) -> list[Block]:
    """The index's first section: the median final val_rel_lloyd per embedding (`headline`), the swept axes
    compared (`axes`) and the claims' verdicts (`found`, from `source`)."""
    blocks: list[Block] = [("h2", "Headline")]
    if headline.empty:
        blocks.append(("p", f"No finished run has a final {VAL_REL_LLOYD}."))
    else:
        blocks += [
            (
                "p",
                f"Median final {VAL_REL_LLOYD} per embedding (the model's k-means objective on validation "
                "tasks over that of one Lloyd step: below 1 beats it), over its finished runs:",
            ),
            ("table", headline),
            *axes_section(axes),
        ]
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


def axes_section(axes: pd.DataFrame) -> list[Block]:
    """The headline's comparison of the swept axes (axes_table), written as axes.csv too."""
    if axes.empty:
        return []
    return [
        (
            "p",
            "Per swept axis and value, over the finished runs that have it (seeds and the other axes' "
            "values pooled: a paper figure narrows to one slice, this table does not): [axes.csv](axes.csv)",
        ),
        ("table", axes),
    ]


def claims_section(found: pd.DataFrame) -> list[Block]:
    """The paper's claims (analysis.claims) judged by this report (`found`: their verdicts); their part of the
    index."""
    return [
        ("h2", "claims"),
        (
            "p",
            "The paper's claims (docs/science.md section 7.1) against this store "
            "(`python -m analysis.claims`), each judged on its own sub-grid and slice: "
            "[claims.csv](claims.csv), [claims.md](claims.md).",
        ),
        ("table", found[["status", "name", "numbers", "marginal", "seeds", "beyond", "paper"]]),
    ]


def summary(headline: pd.DataFrame, claims: list[Claim] | None) -> dict[str, float]:
    """The sweep's summary as metrics of its parent run: the headline's median final val_rel_lloyd per
    embedding; the claims passed, failed and untested when the full report checked them."""
    median = f"median final {VAL_REL_LLOYD}"
    out = {MEDIAN_FINAL + str(row["embedding"]): row[median] for _, row in headline.iterrows()}
    if claims is not None:
        out.update(
            {name: float(sum(c.status == status for c in claims)) for status, name in CLAIM_COUNTS.items()}
        )
    return out
