"""The report's index in its two renderings of one list of blocks: index.md (`to_markdown`) and index.html,
one self-contained page (`page`): figures inline (base64 PNG), tables, nothing fetched.

MLflow's artifact viewer shows an HTML artifact in a sandboxed frame from a blob address, where no relative
path resolves; its Markdown viewer shows only images with absolute addresses. So the page carries
everything itself: the PNGs as data: URIs, the tables as HTML, no script, no style sheet from elsewhere.
Links to the report's other files (CSV, PDF) become their names: they lie beside the page.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

import pandas as pd

from tracking.names import CLAIM_COUNTS  # the verdicts, each a colour

Block = tuple[str, object]  # (kind, content): the index's pieces, written as Markdown and as HTML

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1100px; padding: 0 1em; }
img { max-width: 100%; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
code, pre { background: #f6f6f6; font-size: 0.9em; }
pre { padding: 0.5em; overflow-x: auto; }
td.PASS { background: #e3f4e1; } td.PARTIAL { background: #e6eef8; } td.FAIL { background: #fbe3e1; }
td.UNTESTED { background: #f4f0dc; }
"""


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


def inline(text: str) -> str:
    """The report's inline Markdown as HTML: `code`, **bold**, [name](#anchor), [name](file)."""
    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)
    out = re.sub(r"\[([^\]]+)\]\(#([^)]+)\)", r'<a href="#\2">\1</a>', out)
    return re.sub(r"\[([^\]]+)\]\(([^)]+)\)", r"<code>\1</code>", out)  # a file beside the page


def table_html(table: pd.DataFrame, digits: int = 4) -> str:
    def cell(v: object) -> str:
        text = f"{v:.{digits}g}" if isinstance(v, float) else str(v)
        status = f' class="{text}"' if text in CLAIM_COUNTS else ""
        return f"<td{status}>{inline(text)}</td>"

    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)
    rows = "".join("<tr>" + "".join(map(cell, row)) + "</tr>" for row in table.itertuples(index=False))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def image(folder: Path, name: str) -> str:
    data = base64.b64encode((folder / name).read_bytes()).decode()
    return f'<img alt="{html.escape(Path(name).stem)}" src="data:image/png;base64,{data}">'


def anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it in index.md ('Not drawn' -> 'not-drawn'); this page's too."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def page(blocks: list[Block], folder: Path, title: str) -> str:
    """The index's blocks (h1, h2, h3, p, img, ul, table, pre) as an HTML document; images are
    read from `folder`. Each h2 is an anchor (`anchor`), as the index's contents link them."""
    parts = []
    for kind, content in blocks:
        if kind == "h2":
            parts.append(f'<h2 id="{anchor(str(content))}">{inline(str(content))}</h2>')
        elif kind in ("h1", "h3", "p"):
            parts.append(f"<{kind}>{inline(str(content))}</{kind}>")
        elif kind == "img":
            parts.append(f"<p>{image(folder, str(content))}</p>")
        elif kind == "ul":
            parts.append("<ul>" + "".join(f"<li>{inline(item)}</li>" for item in content) + "</ul>")
        elif kind == "table":
            parts.append(table_html(content))
        elif kind == "pre":
            parts.append(f"<pre>{html.escape(str(content))}</pre>")
        else:
            raise ValueError(f"unknown block kind {kind!r}")
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head>\n<body>\n" + "\n".join(parts) + "\n</body></html>\n"
    )
