"""The claims judged (Claim, one per Record) and written down: the command's lines, claims.csv (one row per
claim), claim_cases.csv (one row per case: its seeds and firmness) and claims.md (the paper's claims, then
those beyond the paper under their own heading, then every case)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pandas as pd

from analysis.claims.cases import PAPER_STEPS, Case, signed
from analysis.context import Context
from tracking.names import CLAIM_COUNTS


@dataclass
class Claim:
    """A claim judged (verdicts.judge): its verdict, what was measured beside the paper's words, and every
    case it rests on."""

    name: str
    status: str  # PASS, PARTIAL, FAIL or UNTESTED
    numbers: str  # what was measured, and what is missing
    paper: str  # the paper's words (docs/science.md section 7.1)
    source: str = ""  # where the words stand in the paper
    marginal: int = 0  # judged cases over seeds whose sign is not settled (cases.LEVEL)
    beyond: bool = False  # a finding beyond the paper: its own heading, not among the paper's claims
    without_diverged: str = ""  # the verdict without the diverged runs, where that differs from `status`
    seeds: str = ""  # the judged cases' seeds, "3" or "3-5"; "" where no case rests on seeds
    cases: int = 0  # judged cases
    firm: int = 0  # judged cases whose sign is settled
    straddles: int = 0  # judged cases over seeds whose IQR of the paired difference straddles zero
    rests_on_marginal: bool = False  # one marginal case turning would change the verdict (rests_on_marginal)
    judged: tuple[tuple[str, Case], ...] = ()  # (part, case) for every case, judged or not, in part order
    # Several experiments judged as one: the verdict at lite scale (each configuration at the setting farthest
    # from the paper's, settings.beside) where that differs from `status`.
    at_lite_scale: str = ""

    def mark(self) -> str:
        """What is printed beside the verdict: how many seeds it rests on, how many of its cases are
        marginal and how many have an IQR that straddles zero, whether the verdict rests on a marginal one
        (OH had numerical issues in 3 of the paper's 10 trials at d 32, tau 0.1, k 25, so a verdict on 3
        seeds can turn on which were drawn), and the verdict it rests on diverged runs for."""
        marks = []
        if self.seeds:
            firmness = (
                f"{self.marginal} of {self.cases} cases marginal" if self.marginal else "every case firm"
            )
            straddles = f", {self.straddles} whose IQR straddles zero" if self.straddles else ""
            rests = ", the verdict rests on a marginal case" if self.rests_on_marginal else ""
            marks.append(f"{self.seeds} seeds, {firmness}{straddles}{rests}")
        if self.without_diverged:
            marks.append(f"{self.without_diverged} without its diverged runs")
        if self.at_lite_scale:
            marks.append(f"{self.at_lite_scale} at lite scale")
        return f" ({', '.join(marks)})" if marks else ""


COLUMNS = [
    "name",
    "status",
    "numbers",
    "paper",
    "source",
    "marginal",
    "firm",
    "straddles",
    "rests_on_marginal",
    "seeds",
    "beyond",
]
CASE_COLUMNS = [
    "claim",
    "status",
    "part",
    "case",
    "margin",
    "iqr_low",
    "iqr_high",
    "straddles",
    "seeds",
    "agree",
    "p",
    "firmness",
    "holds",
    "short_steps",
]


def claims_table(claims: list[Claim]) -> pd.DataFrame:
    return pd.DataFrame(
        [{k: v for k, v in asdict(c).items() if k in COLUMNS} for c in claims], columns=COLUMNS
    )


def cases_table(claims: list[Claim]) -> pd.DataFrame:
    """Every case of every claim: its margin, the seeds' IQR of the paired difference and whether it
    straddles zero, seeds, how many agree with its sign, the sign test's p and whether it is firm, marginal,
    one measurement (no seeds) or not judged, and its runs' training steps where fewer than the paper's."""
    rows = []
    for claim in claims:
        for part, case in claim.judged:
            firmness = (
                "not judged"
                if not case.judged
                else "one measurement"
                if not case.seeds
                else "firm"
                if case.firm
                else "marginal"
            )
            rows.append(
                [claim.name, claim.status, part, case.label, case.margin, *case.iqr, case.straddles]
                + [case.seeds, case.agree, case.p if case.seeds else float("nan"), firmness, case.holds]
                + ["/".join(map(str, case.short_steps))]
            )
    return pd.DataFrame(rows, columns=CASE_COLUMNS)


def beside(claims: list[Claim], at_lite_scale: list[Claim]) -> list[Claim]:
    """The claims, each with its verdict at lite scale (the same claim judged at the settings farthest from
    the paper's, settings.at_setting) where that differs from its own."""
    return [
        replace(claim, at_lite_scale=lite.status if lite.status != claim.status else "")
        for claim, lite in zip(claims, at_lite_scale)
    ]


def claims_dir(contexts: list[Context], out: str) -> Path:
    """Where the claims are written: the experiment's report folder, or for several experiments judged
    together <out>/<a>+<b>/."""
    if len(contexts) == 1:
        return contexts[0].out_dir
    return Path(out) / "+".join(c.experiment for c in contexts)


def write_csv(claims: list[Claim], out_dir: Path) -> Path:
    """claims.csv (COLUMNS: seeds, the judged cases' seeds) and claim_cases.csv (cases_table) in the report
    folder; the path of claims.csv."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "claims.csv"
    claims_table(claims).to_csv(path, index=False)
    cases_table(claims).to_csv(out_dir / "claim_cases.csv", index=False)
    return path


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(claims: list[Claim], level: int = 2) -> str:
    """claims.md: the paper's claims, then those beyond the paper under their own heading, then every case's
    seeds, IQR and firmness; beside its verdict a claim says how many seeds and marginal cases it has, how
    many cases' IQR straddles zero, whether the verdict rests on one, and its verdict without its diverged
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
        "holds, but on part of the claim's scope (its numbers name what is missing). A case is *firm* when "
        "a one-sided exact sign test of its paired differences over the seeds, in its margin's direction, "
        "reaches 5% (at least 5 seeds, all agreeing; docs/science.md section 7.2), else *marginal*; either "
        "way it counts as it falls. Apart from firmness, a case whose seeds' IQR of the paired difference "
        "straddles zero is marked so: one seed more could move its margin across zero. Beside a verdict: "
        "how many seeds its cases rest on, how many are marginal, how many straddle zero, and whether the "
        "verdict rests on a marginal case (OH had numerical issues in 3 of the "
        "paper's 10 trials at d 32, tau 0.1, k 25: on 3 seeds, a configuration's median can fail by the "
        f"seeds drawn alone, about 1 time in 5).\n\n{table(paper)}\n"
    )
    beyond = [c for c in claims if c.beyond]
    if beyond:
        text += (
            f"\n{heading} Beyond the paper\n\nJudged by the same rules, not counted among the paper's claims."
            f"\n\n{table(beyond)}\n"
        )
    text += changed_with_setting(claims, heading)
    return text + f"\n{heading} Every case: seeds, IQR and firmness\n\n{case_lines(claims)}\n"


def changed_with_setting(claims: list[Claim], heading: str) -> str:
    """Several experiments judged as one: the claims whose verdict at lite scale differs, both verdicts."""
    changed = [c for c in claims if c.at_lite_scale]
    if not changed:
        return ""
    rows = "".join(f"| `{c.name}` | {c.at_lite_scale} | {c.status} |\n" for c in changed)
    return (
        f"\n{heading} Verdicts that changed with the setting\n\nEach configuration is judged at the "
        "setting closest to the paper's that has runs (the paper's n, then its steps; docs/science.md "
        "section 7.3); at lite scale, where each is judged at the farthest, these claims read otherwise. "
        "Their numbers above say what each was judged on.\n\n"
        f"| claim | at lite scale | at the closest setting |\n|---|---|---|\n{rows}"
    )


def case_lines(claims: list[Claim]) -> str:
    """Every case as a table row: claim, part, case (with its runs' training steps where fewer than the
    paper's), margin, the seeds' IQR of the difference (marked where it straddles zero), seeds agreeing of
    seeds, firmness."""
    lines = [
        "| claim | part | case | margin | IQR | seeds agree | firmness |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in cases_table(claims).itertuples():
        agree = f"{row.agree} of {row.seeds}" if row.seeds else ""
        margin = signed(row.margin) if row.margin == row.margin else ""  # NaN: not judged
        band = f"[{signed(row.iqr_low)}, {signed(row.iqr_high)}]" if row.seeds else ""
        band += " straddles 0" if row.straddles else ""
        steps = "/".join(f"{int(s):,}" for s in row.short_steps.split("/")) if row.short_steps else ""
        short = f" ({steps} steps of the paper's {PAPER_STEPS:,})" if steps else ""
        lines.append(
            f"| `{row.claim}` | {_cell(row.part)} | {_cell(row.case)}{short} | {margin} | {band} | {agree} "
            f"| {row.firmness} |"
        )
    return "\n".join(lines)


def printed(claims: list[Claim]) -> str:
    """The command's lines: each claim's verdict and name (Claim.mark beside them), the paper's words and what
    was measured."""
    return "\n".join(
        f"{claim.status:<8} {claim.name}{' [beyond the paper]' if claim.beyond else ''}{claim.mark()}\n"
        f'{"":9}paper:    "{claim.paper}" ({claim.source})\n'
        f"{'':9}measured: {claim.numbers}"
        for claim in claims
    )


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
