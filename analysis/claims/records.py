"""The claims of docs/science.md section 7.1, one Record each: the paper's words, where they stand, the scope
of runs a claim is judged on and its judge (analysis.claims.judges); and `reads`, the evaluations their judges
read, which the command reads from the store first (analysis.read).

Records with `beyond=True` are the platform's own findings, judged by the same rules, reported under their own
heading and never counted among the paper's claims: among them the family claims at lite scale (LITE_FAMILY,
`sweep=lite`), the same statements beyond the paper's setting (PAPER_FAMILY, where the paper's claims are
judged, on `sweep=lite32`'s runs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import pandas as pd

import analysis.claims.judges as judges
from analysis.claims.cases import Part
from analysis.claims.evidence import PANELS, View
from analysis.claims.scopes import (
    D32,
    EMB,
    EMBEDDED,
    FAMILY,
    OTHER_FAMILIES,
    TAU,
    D,
    K,
    Scope,
    setting,
    transfer_from,
    within,
)
from analysis.context import Context, Want, evaluations_of, scope
from analysis.eval_figures import PROBES
from tracking.names import FINISHED, OUTCOME


@dataclass(frozen=True)
class Record:
    """One claim: what the paper says, where, the runs it is about, and its judge (a View -> its parts)."""

    name: str
    paper: str
    source: str
    scope: Scope | None  # None: judged on a benchmark or on sampled tasks, not on runs
    judge: Callable[[View], list[Part]]
    beyond: bool = False
    # Slice values its scope takes in the paper grid when they differ from its own: a `_lite` twin's scope is
    # counted at the paper's d and k, where the grid holds the statement's configurations.
    counted_at: dict = field(default_factory=dict)

    def counted(self) -> Scope:
        """Its scope as counted in the paper grid."""
        subgrid, where = self.scope
        return subgrid, {**where, **self.counted_at}


# The family claims' setting: the d and k of the paper's family sub-grid (sweep=lite32 trains it there);
# sweep=lite trains it at its own d and k, where the same statements are judged beyond the paper's setting
# (at_lite_scale).
PAPER_FAMILY = setting("paper", "family", (D, K))
LITE_FAMILY = setting("lite", "family", (D, K))
TRANSFER_FROM = transfer_from(PAPER_FAMILY)
PROBED_OH_BN = within("multistep", **{EMB: EMBEDDED})

# The claims of docs/science.md section 7.1, in its order; `beyond` ones last. A new claim is a new Record.
_RECORDS = (
    Record(
        "tau01_beats_lloyd",
        "At tau=0.1, both regularizers outperform one Lloyd step except with no token embedding",
        "section 3, p. 9",
        ("tau", {TAU: 0.1}),
        judges.tau01,
    ),
    Record(
        "l2_lower_train_loss",
        "The L2-regularized min gives tighter bounds",
        "section 3, p. 8; App. F, p. 23",
        ("tau", {}),
        judges.l2_lower_train_loss,
    ),
    Record(
        "l2_better_val_tau1_d4",
        "better validation performance than the NE-regularized min, especially at larger tau and d = 4",
        "App. F, p. 23, Figure 10",
        ("tau", {TAU: 1.0, D: 4, EMB: EMBEDDED}),
        judges.l2_better_val,
    ),
    Record(
        "reembed_beats_lloyd",
        "Re-embedding ... OH/BN models outperforming Lloyd's iterations while naive repeated updates diverge",
        "section 4, p. 10, Figure 6; init as in App. D (k sampled data points)",
        PROBED_OH_BN,
        judges.reembed(("random",)),
    ),
    Record(
        "noembed_reembed_trails_lloyd",
        "models without token embeddings improve with re-embedding but underperform Lloyd's",
        "section 4, p. 10, Figure 6",
        within("multistep", **{EMB: "none"}),
        judges.noembed,
    ),
    Record(
        "length_generalises",
        "Models trained on n = 512 points generalize to tasks with 128, 256, 1024, and 2048 points ... "
        "outperform Lloyd's iterations at each tested size",
        "App. F, pp. 24-25, Figure 12",
        within("length", **{EMB: EMBEDDED}),
        judges.length,
    ),
    Record(
        "shift_generalises",
        "OH/BN models significantly outperform Lloyd's except at larger scale, where they trail initially "
        "but overtake with more steps",
        "section 4, p. 11, Figure 7",
        within("mixture_shift", **{EMB: EMBEDDED}),
        judges.shift,
    ),
    Record(
        "cauchy_fails",
        "Cauchy training diverges and Cauchy testing remains noncompetitive",
        "section 4, p. 11, Figure 8; App. F, pp. 28-29",
        ("family", {FAMILY: "cauchy", **PAPER_FAMILY}),
        judges.cauchy_fails,
    ),
    Record(
        "families_generalise",
        "with tau = 0.1, both regularizers and OH or BN embeddings can beat Lloyd across the other tested "
        "distributions",
        "App. F, pp. 28-29, Figure 16",
        ("family", {TAU: 0.1, EMB: EMBEDDED, FAMILY: OTHER_FAMILIES, **PAPER_FAMILY}),
        judges.families,
    ),
    Record(
        "ne_fails_gumbel_laplace_tau1",
        "At tau = 1, L2 generalizes better than NE, and NE fails to generalize on gumbel and laplace tasks",
        "App. F, pp. 28-29, Figure 16",
        ("family", {TAU: 1.0, EMB: EMBEDDED, **PAPER_FAMILY}),
        judges.ne_fails,
    ),
    Record(
        "clusters_d4_tau1",
        "For d = 4 and tau = 1, across k in {6, 10, 16, 25}, L2 learns somewhat but never matches one Lloyd "
        "iteration, while NE fails to learn; BN deteriorates as k rises, unlike OH",
        "App. F, p. 26",
        ("clusters", {D: 4, TAU: 1.0}),
        judges.clusters_d4_tau1,
    ),
    Record(
        "large_lr_worse",
        "For d = 32, rates 0.1 and 1.0 converge to worse local minima; for d = 4, this is reported for "
        "rate 1.0",
        "App. F, pp. 23-24, Figure 11",
        ("lr", {}),
        judges.large_lr,
    ),
    Record(
        "binary_faster_leaner",
        "With k sufficiently larger than d, the binary model achieves up to 12x/9x forward/backward speedups "
        "and almost 70% lower memory usage",
        "section 2, pp. 4-5, Figure 1",
        None,
        judges.speed,
    ),
    Record(
        "cauchy_dissimilar",
        "cauchy tasks are similar mainly to other cauchy tasks and are substantially dissimilar from other "
        "families",
        "App. G, Figure 19; section 5, Figure 9",
        None,
        judges.dissimilar,
    ),
    Record(
        "ne_val_rises_tau1",
        "at tau=1, only L2 reduces unseen-task loss as training progresses. With NE regularization at tau=1, "
        "validation loss increases during training",
        "section 3, p. 8",
        ("tau", {TAU: 1.0, EMB: EMBEDDED}),
        judges.ne_val_rises,
    ),
    Record(
        "family_transfer_multistep",
        "Across non-Cauchy distribution-family evaluations, OH/BN models generalize well and significantly "
        "outperform Lloyd's",
        "section 4, p. 11, Figure 8; App. G, Figure 18 (T = 20)",
        TRANSFER_FROM,
        judges.family_transfer,
    ),
    Record(
        "clusters_d4_tau01",
        "With d = 4 and tau = 0.1, OH with L2-regularized min beats Lloyd for all tested k, while BN "
        "performance slows as k grows",
        "App. F, pp. 26-28",
        ("clusters", {D: 4, TAU: 0.1}),
        judges.clusters_d4_tau01,
    ),
    Record(
        "clusters_d32",
        "at d = 32, tau = 1, OH and BN with L2 beat Lloyd across k ... At d = 32 and tau = 0.1, both "
        "regularizers with OH and BN beat Lloyd",
        "App. F, pp. 26-28",
        ("clusters", {D: 32, EMB: EMBEDDED}),
        judges.clusters_d32,
    ),
    Record(
        "reembed_from_good_inits",
        "(beyond the paper) the reembed_beats_lloyd test from kmeans++ and gonzalez centers, inits the "
        "models never trained on",
        "not in the paper: its tasks start from k sampled data points (App. D)",
        PROBED_OH_BN,
        judges.reembed(("kmeans++", "gonzalez")),
        beyond=True,
    ),
)
FAMILY_CLAIMS = (
    "cauchy_fails",
    "families_generalise",
    "ne_fails_gumbel_laplace_tau1",
    "family_transfer_multistep",
)


def at_lite_scale(record: Record) -> Record:
    """A family claim's statement judged on sweep=lite's family runs (LITE_FAMILY): beyond the paper's
    setting, so `make reproduce` alone still shows it, under its own name and heading."""
    subgrid, where = record.scope
    return Record(
        f"{record.name}_lite",
        f"(the same statement at lite scale, beyond the paper's setting) {record.paper}",
        f"{record.source}; here at d {LITE_FAMILY[D]}, k {LITE_FAMILY[K]} (sweep=lite), not the paper's "
        f"d {PAPER_FAMILY[D]}, k {PAPER_FAMILY[K]}",
        (subgrid, {**where, **LITE_FAMILY}),
        record.judge,
        beyond=True,
        counted_at=PAPER_FAMILY,  # the paper grid holds the statement's configurations at its d and k
    )


CLAIMS = _RECORDS + tuple(at_lite_scale(r) for r in _RECORDS if r.name in FAMILY_CLAIMS)
RECORDS = {record.name: record for record in CLAIMS}
PAPER = {record.name: record.paper for record in CLAIMS if not record.beyond}  # the paper's 18, in order


def reads(ctx: Context) -> list[Want]:
    """The evaluations the claims read: each probe's of every finished model its figure draws (PROBES: a probe
    claim's scope is a part of those), and with eval.d32_n the final values at that n of the finished d 32
    runs in any claim's scope."""
    probes = [want for name in PANELS for want in evaluations_of(name, scope(ctx.runs, *PROBES[name]))]
    n = ctx.settings.d32_n
    if n is None:
        return probes
    scoped = pd.concat([scope(ctx.runs, *record.scope) for record in CLAIMS if record.scope is not None])
    d32 = scoped[(scoped[D] == D32) & (scoped[OUTCOME] == FINISHED)] if D in scoped else scoped[:0]
    return probes + [("final", run_id, n) for run_id in dict.fromkeys(d32["run_id"])]
