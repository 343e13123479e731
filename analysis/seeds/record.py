"""What the rounds changed: the cases as first judged (before.csv), the rounds (rounds.csv), and for every
case that was marginal its seeds, margin and verdict before and now, firm or still marginal (firmness.md)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from analysis.claims.cases import signed
from analysis.claims.table import Claim, cases_table

BEFORE, ROUNDS, FIRMNESS = "before.csv", "rounds.csv", "firmness.md"
CASE = ["claim", "part", "case"]


def first_judgement(claims: list[Claim], folder: Path) -> pd.DataFrame:
    """The cases as first judged, kept in before.csv: the rounds' starting point, never rewritten."""
    path = folder / BEFORE
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        cases_table(claims).to_csv(path, index=False)
    return pd.read_csv(path)


def log_round(folder: Path, row: dict) -> pd.DataFrame:
    """rounds.csv with `row` (one round written) appended; all rounds so far."""
    path = folder / ROUNDS
    rounds = pd.read_csv(path) if path.exists() else pd.DataFrame()
    rounds = pd.concat([rounds, pd.DataFrame([row])], ignore_index=True)
    rounds.to_csv(path, index=False)
    return rounds


def rounds_so_far(folder: Path) -> pd.DataFrame:
    path = folder / ROUNDS
    return pd.read_csv(path) if path.exists() else pd.DataFrame()


def _verdict(holds: object, status: object, margin: float) -> str:
    """'holds (PASS)': the case's verdict and its claim's ('not judged' without a margin: it neither holds
    nor fails); 'not judged now' for a case no longer there."""
    if not isinstance(status, str):  # NaN: the merge found no such case in the later judgement
        return "not judged now"
    case = "not judged" if margin != margin else "holds" if holds is True or holds == "True" else "fails"
    return f"{case} ({status})"


def _margin(value: float) -> str:
    return "" if value != value else signed(float(value))  # NaN: not judged


def changes(before: pd.DataFrame, now: pd.DataFrame) -> pd.DataFrame:
    """Every case marginal at first, beside itself now: seeds, margin, the case's and its claim's verdict."""
    was = before[before["firmness"] == "marginal"]
    table = was.merge(now, on=CASE, how="left", suffixes=("_before", "_after"))
    for when in ("before", "after"):
        table[f"verdict_{when}"] = [
            _verdict(*row)
            for row in zip(table[f"holds_{when}"], table[f"status_{when}"], table[f"margin_{when}"])
        ]
    return table


def write_firmness(folder: Path, before: pd.DataFrame, claims: list[Claim], state: str) -> Path:
    """firmness.md: `state` (the budget, the rounds, why they stopped or what runs next), the rounds, every
    case that was marginal before and after, and the verdicts that changed with more seeds."""
    table = changes(before, cases_table(claims))
    lines = [
        "| claim | part | case | seeds | margin | verdict (claim) | now |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in table.itertuples():
        seeds = f"{int(r.seeds_before)} -> {_int(r.seeds_after)}"
        margin = f"{_margin(r.margin_before)} -> {_margin(r.margin_after)}"
        verdict = (
            r.verdict_before
            if r.verdict_before == r.verdict_after
            else f"{r.verdict_before} -> {r.verdict_after}"
        )
        lines.append(
            f"| `{r.claim}` | {r.part} | {r.case} | {seeds} | {margin} | {verdict} | {r.firmness_after} |"
        )
    changed = table[table["verdict_before"] != table["verdict_after"]]
    closing = [
        f"- `{r.claim}` {r.case}: {r.verdict_before} -> {r.verdict_after}" for r in changed.itertuples()
    ]
    firm = int((table["firmness_after"] == "firm").sum())
    rounds = rounds_so_far(folder)
    text = (
        f"# Seeds where the verdict was marginal\n\n{state}\n\n"
        f"Cases marginal at first: {len(table)}; firm now: {firm}; still marginal: {len(table) - firm} "
        "(docs/science.md section 7.2).\n\n"
        + (f"## Rounds\n\n{_markdown(rounds)}\n\n" if len(rounds) else "")
        + "## Every case that was marginal\n\n"
        + "\n".join(lines)
        + "\n\n"
        + "## Verdicts that changed with more seeds\n\n"
        + ("\n".join(closing) or "none")
        + "\n"
    )
    path = folder / FIRMNESS
    path.write_text(text)
    return path


def _markdown(frame: pd.DataFrame) -> str:
    rows = [list(frame.columns), ["---"] * len(frame.columns), *frame.astype(str).to_numpy().tolist()]
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def _int(value: float) -> str:
    return "?" if isinstance(value, float) and math.isnan(value) else str(int(value))
