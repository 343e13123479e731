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
from typing import Callable

from analysis.attach import attach_to_sweep
from analysis.claims import records
from analysis.claims.evidence import evidence_of
from analysis.claims.verdicts import judge
from analysis.cli import job_config, options_help, settings_of
from analysis.context import Context, Want
from analysis.figures import FIGURES, draw, reads
from analysis.folder import write
from analysis.index import build
from analysis.read import read_store
from cli.entry import command


def wants(own: dict) -> Callable[[Context], list[Want]]:
    """What the report reads before drawing: its figures' evaluations and, drawing all, the claims'."""
    names = own["figures"] or list(FIGURES)
    full = set(names) == set(FIGURES)
    return lambda ctx: reads(names, ctx) + (records.reads(ctx) if full else [])


@command("leaner-report", show_config=job_config, options=lambda: options_help(list(FIGURES)))
def main(argv: list[str]) -> int:
    own, tracking = settings_of(argv, list(FIGURES), several=False)
    ctx = read_store(own, tracking, wants)[0]  # the report draws one experiment (settings_of)
    drawing = draw(ctx, own["figures"] or list(FIGURES))
    claims = None
    if set(drawing.names) == set(FIGURES):  # the full report also judges the paper's claims, on what it drew
        found = evidence_of([ctx], drawing.figures)
        claims = [judge(record, found) for record in records.CLAIMS]
    report = build(ctx, drawing, claims)
    index = write(report, ctx.out_dir)
    where = attach_to_sweep(ctx, report.before, report.summary)
    if where:
        print(where)
    print(f"report: {index}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
