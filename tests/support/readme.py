"""The README's code blocks (tests/test_docs.py explains the `<!-- runnable -->` markers) and their
commands."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from support.repo import README


@dataclass
class Block:
    line: int  # 1-based line of the opening fence
    text: str
    runnable: bool
    smoke: list[str]


def blocks(lang: str = "bash") -> list[Block]:
    lines = README.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() == f"```{lang}":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            marker = lines[i - 1].strip() if i else ""
            runnable = re.fullmatch(r"<!-- runnable( smoke=\"[^\"]*\")? -->", marker) is not None
            smoke = re.search(r'smoke="([^"]*)"', marker)
            out.append(
                Block(i + 1, "\n".join(lines[i + 1 : end]), runnable, smoke.group(1).split() if smoke else [])
            )
            i = end
        i += 1
    return out


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
