"""The claims written down: claims.csv (one row per claim) and claims.md (the paper's claims, then those
beyond the paper under their own heading)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pandas as pd

from analysis.claims.cases import STATUSES
from analysis.claims.evidence import Claim

COLUMNS = ["name", "status", "numbers", "paper", "source", "marginal", "beyond"]


def claims_table(claims: list[Claim]) -> pd.DataFrame:
    return pd.DataFrame([asdict(c) for c in claims], columns=COLUMNS)


def write_csv(claims: list[Claim], out_dir: Path) -> Path:
    """claims.csv (name, status, numbers, paper, source, marginal, beyond) in the report folder."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "claims.csv"
    claims_table(claims).to_csv(path, index=False)
    return path


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(claims: list[Claim], level: int = 2) -> str:
    """claims.md: the paper's claims, then those beyond the paper under their own heading; beside its verdict
    a claim says how many marginal cases it has (its verdict unchanged) and its verdict without its diverged
    runs where that differs (Claim.mark)."""

    def table(chosen: list[Claim]) -> str:
        lines = ["| status | name | numbers | paper |", "|---|---|---|---|"]
        for c in chosen:
            words = f'"{c.paper}" ({c.source})' if c.source else f'"{c.paper}"'
            lines.append(f"| {c.status}{c.mark()} | `{c.name}` | {_cell(c.numbers)} | {_cell(words)} |")
        return "\n".join(lines)

    paper = [c for c in claims if not c.beyond]
    counts = ", ".join(f"{sum(c.status == s for c in paper)} {s}" for s in STATUSES)
    heading = "#" * level
    text = (
        f"{heading} The paper's claims\n\n{len(paper)} claims: {counts}. PARTIAL: every case judged holds, "
        "but on part of the claim's scope (its numbers name what is missing). A case is *marginal* when the "
        f"seeds' IQR of its margin straddles zero; it still counts as it falls.\n\n{table(paper)}\n"
    )
    beyond = [c for c in claims if c.beyond]
    if beyond:
        text += (
            f"\n{heading} Beyond the paper\n\nJudged by the same rules, not counted among the paper's claims."
            f"\n\n{table(beyond)}\n"
        )
    return text


def write_markdown(claims: list[Claim], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "claims.md"
    path.write_text(markdown(claims))
    return path
