"""The report folder: the report written into it (analysis.index built it), index.md and index.html rendered
by analysis.page."""

from __future__ import annotations

from pathlib import Path

from analysis.claims.table import write_csv, write_markdown
from analysis.index import Report
from analysis.page import markdown, page, to_markdown
from tracking.names import REPORT_HTML


def write(report: Report, folder: Path) -> Path:
    """Every file of the report but the figures' images (drawn already): index.md, index.html, each table as
    CSV (a figure's as Markdown too) and the claims' files when it judged them. Returns index.md's path as the
    user typed where it is."""
    index = shown(folder / "index.md")
    for name, table in report.csv.items():
        table.to_csv(folder / name, index=False)
    for name, table in report.tables.items():
        table.to_csv(folder / f"{name}.csv", index=False)
        (folder / f"{name}.md").write_text(markdown(table) + "\n")
    (folder / "index.md").write_text(to_markdown(report.markdown))
    (folder / REPORT_HTML).write_text(page(report.html, folder, report.title))
    if report.claims is not None:
        write_csv(report.claims, folder)
        write_markdown(report.claims, folder)
    return index


def shown(path: Path) -> Path:
    """A path as the user typed where it is: relative to the working directory when under it."""
    path = path.resolve()
    return path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
