"""The report's two renderings of one list of blocks: index.md for GitHub (relative images, no raw HTML)
and index.html for MLflow's artifact viewer (self-contained: images inline, nothing fetched)."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser

import matplotlib
import pandas as pd

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis.page import page, to_markdown  # noqa: E402


class Collect(HTMLParser):
    """Every tag with its attributes, and the text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def blocks(folder):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    fig.savefig(folder / "convergence.png")
    plt.close(fig)
    claims = pd.DataFrame({"status": ["PASS", "FAIL"], "name": ["a", "b<c"], "numbers": [0.5, 1.25]})
    return [
        ("h1", "Report: experiment `x`"),
        ("p", "Contents: [convergence](#convergence), data [convergence.csv](convergence.csv)"),
        ("h2", "convergence"),
        ("img", "convergence.png"),
        ("ul", ["tau sub-grid: 3/48 configurations"]),
        ("h2", "claims"),
        ("table", claims),
        ("pre", "Traceback <most recent call last>"),
    ]


def test_index_html_is_self_contained_and_index_md_links_images(tmp_path):
    parts = blocks(tmp_path)
    found = Collect()
    found.feed(page(parts, tmp_path, "Report: x"))
    images = [attrs["src"] for tag, attrs in found.tags if tag == "img"]
    assert len(images) == 1 and images[0].startswith("data:image/png;base64,")
    png = base64.b64decode(images[0].removeprefix("data:image/png;base64,"))
    assert png == (tmp_path / "convergence.png").read_bytes()
    fetched = [a for _, attrs in found.tags for k, a in attrs.items() if k in ("src", "href")]
    assert all(a.startswith(("data:", "#")) for a in fetched), fetched  # nothing from a server, no file
    assert {"table", "th", "td", "pre", "h2"} <= {tag for tag, _ in found.tags}
    text = "".join(found.text)
    assert "b<c" in text and "Traceback <most recent call last>" in text  # escaped, shown as written
    assert ("h2", {"id": "claims"}) in found.tags  # the contents' anchors
    md = to_markdown(parts)
    assert "![convergence](convergence.png)" in md and "| PASS | a | 0.5 |" in md
    assert not re.search(r"<\s*(details|summary|img|table)", md)  # no raw HTML for a viewer to show as text
