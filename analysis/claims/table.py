"""The claims written down: claims.csv (one row per claim) and claims.md (the paper's claims, then those
beyond the paper under their own heading)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from analysis.claims.evidence import Claim
from tracking.names import CLAIM_COUNTS

COLUMNS = ["name", "status", "numbers", "paper", "source", "marginal", "seeds", "beyond"]


def claims_table(claims: list[Claim]) -> pd.DataFrame:
    return pd.DataFrame([asdict(c) for c in claims], columns=COLUMNS)


def write_csv(claims: list[Claim], out_dir: Path) -> Path:
    """claims.csv (COLUMNS: seeds, a d 32 verdict's seeds per case) in the report folder."""
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
    heading = "#" * level
    text = (
        f"{heading} The paper's claims\n\n{len(paper)} claims: {counts(paper)}. PARTIAL: every case judged "
        "holds, but on part of the claim's scope (its numbers name what is missing). A case is *marginal* "
        "when the seeds' IQR of its margin straddles zero; it still counts as it falls. Beside a verdict on "
        "d 32 runs: how many seeds it rests on, and in how many cases the IQR straddles zero (OH had "
        "numerical issues in 3 of the paper's 10 trials at d 32, tau 0.1, k 25: on 3 seeds, a "
        f"configuration's median can fail by the seeds drawn alone, about 1 time in 5).\n\n{table(paper)}\n"
    )
    beyond = [c for c in claims if c.beyond]
    if beyond:
        text += (
            f"\n{heading} Beyond the paper\n\nJudged by the same rules, not counted among the paper's claims."
            f"\n\n{table(beyond)}\n"
        )
    return text


def counts(claims: list[Claim]) -> str:
    """How many claims have each status, '7 PASS, 5 FAIL, 2 UNTESTED': every status the MLflow metrics count
    (tracking.names.CLAIM_COUNTS, zeros shown), in that order, then any other status a judge gave."""
    found = Counter(c.status for c in claims)
    statuses = [*CLAIM_COUNTS, *sorted(set(found) - set(CLAIM_COUNTS))]
    return ", ".join(f"{found[s]} {s}" for s in statuses)


def totals(claims: list[Claim]) -> str:
    """The command's last line before the table's path: the counts of the paper's claims, and apart (never
    counted among them) those beyond the paper."""
    paper, beyond = [c for c in claims if not c.beyond], [c for c in claims if c.beyond]
    return (
        f"totals: the paper's {len(paper)} claims: {counts(paper)}; {len(beyond)} beyond it: {counts(beyond)}"
    )


def write_markdown(claims: list[Claim], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "claims.md"
    path.write_text(markdown(claims))
    return path
