"""The documentation's pages and code blocks (tests/test_docs.py explains the `<!-- runnable -->` markers),
and their commands."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from support.repo import README, REPO

DOCS = REPO / "docs"


def pages() -> list[Path]:
    """README.md, then the docs/*.md pages in the order README links them, then any page it does not link
    (by name): the order a newcomer reads them in, and the one the runnable blocks run in."""
    linked = [DOCS / name for name in re.findall(r"\]\(docs/([\w-]+\.md)\)", README.read_text())]
    rest = sorted(set(DOCS.glob("*.md")) - set(linked))
    return [README, *dict.fromkeys(p for p in linked if p.exists()), *rest]


def page_holding(marker: str) -> Path:
    """The one page whose text holds `marker` (a generated section's start)."""
    (page,) = [p for p in pages() if marker in p.read_text()]
    return page


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    text: str
    runnable: bool
    smoke: list[str]
    lang: str = "bash"  # or python: a notebook's cell, run after the page's earlier runnable cells

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)} line {self.line}"


def page_blocks(page: Path, lang: str = "bash") -> list[Block]:
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() == f"```{lang}":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            marker = lines[i - 1].strip() if i else ""
            runnable = re.fullmatch(r"<!-- runnable( smoke=\"[^\"]*\")? -->", marker) is not None
            smoke = re.search(r'smoke="([^"]*)"', marker)
            text = "\n".join(lines[i + 1 : end])
            out.append(Block(page, i + 1, text, runnable, smoke.group(1).split() if smoke else [], lang))
            i = end
        i += 1
    return out


def blocks(lang: str = "bash") -> list[Block]:
    """Every block of every page, in pages() order."""
    return [b for page in pages() for b in page_blocks(page, lang)]


def runnable_blocks() -> list[Block]:
    """Every runnable block, bash or python, of every page, in pages() order and the page's own."""
    found = [b for page in pages() for b in (*page_blocks(page, "bash"), *page_blocks(page, "python"))]
    order = {page: i for i, page in enumerate(pages())}
    return sorted((b for b in found if b.runnable), key=lambda b: (order[b.page], b.line))


def commands(text: str) -> list[list[str]]:
    """Shell commands of a block: continuation lines joined, comments and heredoc bodies dropped."""
    text = re.sub(r"<<'EOF'\n.*?\nEOF", "", text, flags=re.S).replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            words = shlex.split(line)
            cuts = [-1] + [i for i, w in enumerate(words) if w == "&&"] + [len(words)]
            out += [words[a + 1 : b] for a, b in zip(cuts, cuts[1:])]
            # a command quoted inside another (`ray exec CLUSTER "cd /app && python -m ..."`)
            out += [c for w in words if " " in w and "python -m" in w for c in commands(w)]
            # the entrypoint of a Ray job (`ray job submit --address URL -- python -m ...`)
            if words[:3] == ["ray", "job", "submit"] and "--" in words:
                out.append(words[words.index("--") + 1 :])
    return out
