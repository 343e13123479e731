"""The import graph of the repository's own modules, read from the source (ast), and its circles."""

from __future__ import annotations

import ast
from pathlib import Path

from support.repo import REPO


def _modules(packages: tuple[str, ...]) -> dict[str, Path]:
    return {
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
        for package in packages
        for p in (REPO / package).rglob("*.py")
    }


def import_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Each module -> the modules of `packages` its imports run: `from pkg import name` runs pkg's __init__
    (and pkg.name when that is a module), `import pkg.mod` runs pkg.mod."""
    files = _modules(packages)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                wanted = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                wanted = [a.name for a in node.names]
            else:
                continue
            graph[name].update(m for m in wanted if m in files and m != name)
    return graph


def circle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of the graph, as the modules along it; [] when there is none."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return []
