"""`python -m analysis.claims [tracking.*] [select.*] [eval.*]`: the paper's claims (SPEC 7) against the store.

Each claim is PASS or FAIL with the numbers behind it, or UNTESTED with what
data it needs. Per configuration, a run's final logged value counts once per
seed and configurations are compared by their median across seeds; probes
(multistep, length, family transfer) use the same cached evaluations as the
report.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pandas as pd

from analysis.cli import open_context
from analysis.context import Context, eval_curves, narrow, series_labels
from analysis.plot import MissingInput
from analysis.runs import config_keys
from analysis.style import LLOYD, short
from sweeper.metrics import DIVERGED, FINISHED, SEED, TRAIN_LOSS, VAL_KMEANS, VAL_REL_LLOYD

PASS, FAIL, UNTESTED = "PASS", "FAIL", "UNTESTED"
EMBEDDED = ("onehot", "binary")


@dataclass
class Claim:
    name: str
    text: str
    status: str
    numbers: str


def _medians(runs: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """Per configuration (all config keys), the median across seeds of each metric's final value; finished runs only."""
    done = runs[runs["outcome"] == FINISHED]
    keys = config_keys(done.columns)
    per_seed = done.groupby(keys + [SEED], dropna=False)[metrics].mean().reset_index()
    return per_seed.groupby(keys, dropna=False)[metrics].median().reset_index()


def l2_beats_ne(ctx: Context) -> Claim:
    text = "l2 beats ne on training loss and unseen-task k-means objective at every tau"
    medians = _medians(ctx.runs, [TRAIN_LOSS, VAL_KMEANS])
    pair_keys = [k for k in config_keys(medians.columns) if k != "loss.regularizer"]
    wide = medians.pivot_table(index=pair_keys, columns="loss.regularizer", values=[TRAIN_LOSS, VAL_KMEANS])
    if not {"l2", "ne"} <= set(medians["loss.regularizer"]) or wide.dropna().empty:
        return Claim("l2_beats_ne", text, UNTESTED, "needs configurations run with both loss.regularizer=l2 and ne")
    wide = wide.dropna().reset_index()
    parts, ok = [], True
    for tau, part in wide.groupby("loss.tau"):
        train = int((part[(TRAIN_LOSS, "l2")] < part[(TRAIN_LOSS, "ne")]).sum())
        val = int((part[(VAL_KMEANS, "l2")] < part[(VAL_KMEANS, "ne")]).sum())
        ok &= train == val == len(part)
        parts.append(f"tau={tau:g}: l2 lower train_loss in {train}/{len(part)} pairs, lower val_kmeans in {val}/{len(part)}")
    return Claim("l2_beats_ne", text, PASS if ok else FAIL, "; ".join(parts))


def tau01_beats_lloyd(ctx: Context) -> Claim:
    text = "at tau 0.1, l2 and ne both beat one Lloyd step (val_rel_lloyd < 1) except with no embedding"
    runs = ctx.runs[ctx.runs["loss.tau"] == 0.1]
    medians = _medians(runs, [VAL_REL_LLOYD]) if not runs.empty else pd.DataFrame()
    if medians.empty or not medians["model.embedding"].isin(EMBEDDED).any():
        return Claim("tau01_beats_lloyd", text, UNTESTED, "needs finished onehot/binary runs with loss.tau=0.1")
    embedded = medians[medians["model.embedding"].isin(EMBEDDED)]
    bare = medians[medians["model.embedding"] == "none"]
    beat, bare_beat = int((embedded[VAL_REL_LLOYD] < 1).sum()), int((bare[VAL_REL_LLOYD] < 1).sum())
    worst = embedded.sort_values(VAL_REL_LLOYD).iloc[-1]
    numbers = (f"OH/BN configurations below 1: {beat}/{len(embedded)} (worst median val_rel_lloyd "
               f"{worst[VAL_REL_LLOYD]:.3f} at {_describe(worst)}); "
               f"NA configurations below 1: {bare_beat}/{len(bare)}")
    ok = beat == len(embedded) and bare_beat == 0
    return Claim("tau01_beats_lloyd", text, PASS if ok else FAIL, numbers)


def _describe(row: pd.Series) -> str:
    return ", ".join(short(k, row[k]) for k in ("loss.regularizer", "model.embedding", "task.d", "task.k") if k in row)


def _at(curves: pd.DataFrame, panel: str, series: str, step: int) -> float:
    hit = curves[(curves["panel"] == panel) & (curves["series"] == series) & (curves["x"] == step)]
    return float(hit["median"].iloc[0]) if not hit.empty else float("nan")


def _embedded_probe(ctx: Context, keep: list[str], pool: pd.DataFrame | None = None) -> pd.DataFrame:
    runs = narrow(ctx.runs if pool is None else pool, keep=keep)
    return runs[runs["model.embedding"].isin(EMBEDDED)]


def reembed_beats_lloyd(ctx: Context) -> Claim:
    text = "re-embedded iteration beats Lloyd's at T while naive iteration diverges"
    runs = _embedded_probe(ctx, ["model.embedding"])
    T = ctx.settings.steps
    try:
        series, _ = series_labels(runs, ["model.embedding"])
        curves = eval_curves(ctx, runs, "multistep", lambda t, r: t["init"], series, ("reembed", "naive"))
    except MissingInput as err:
        return Claim("reembed_beats_lloyd", text, UNTESTED, f"needs finished onehot/binary models: {err}")
    parts, ok = [], True
    for panel in dict.fromkeys(curves["panel"]):
        lloyd = _at(curves, panel, LLOYD, T)
        for label in dict.fromkeys(series):
            re, naive, naive1 = (_at(curves, panel, f"{label} reembed", T), _at(curves, panel, f"{label} naive", T),
                                 _at(curves, panel, f"{label} naive", 1))
            good = re < lloyd and naive > lloyd and naive > naive1
            ok &= good
            parts.append(f"init {panel}, {label}: reembed {re:.3f} vs Lloyd {lloyd:.3f}, naive {naive1:.3f} at t=1 "
                         f"-> {naive:.3f} at T={T}")
    return Claim("reembed_beats_lloyd", text, PASS if ok else FAIL, "; ".join(parts) + " (median mean log objective)")


def cauchy_fails(ctx: Context) -> Claim:
    text = "Cauchy neither trains (diverges or val_rel_lloyd >= 1) nor transfers (models lose to Lloyd's on Cauchy tasks)"
    cauchy = ctx.runs[ctx.runs["task.family"] == "cauchy"]
    if cauchy.empty:
        return Claim("cauchy_fails", text, UNTESTED, "needs runs with task.family=cauchy (the `family` sub-grid)")
    diverged = int((cauchy["outcome"] == DIVERGED).sum())
    medians = _medians(cauchy, [VAL_REL_LLOYD])
    trained = int((medians[VAL_REL_LLOYD] < 1).sum())
    numbers = [f"cauchy runs diverged {diverged}/{len(cauchy)}; configurations below 1: {trained}/{len(medians)}"]
    ok = trained == 0
    others = ctx.subgrid("family")
    others = others[others["task.family"] != "cauchy"]
    if others.empty:
        numbers.append("transfer untested: no model trained on another family")
    else:
        runs = _embedded_probe(ctx, ["model.embedding", "task.family"], others)
        series, _ = series_labels(runs, ["model.embedding"])
        curves = eval_curves(ctx, runs, "family_transfer", lambda t, r: t["test_family"], series, ("reembed",))
        T, lloyd = ctx.settings.steps, _at(curves, "cauchy", LLOYD, ctx.settings.steps)
        wins = [(s, _at(curves, "cauchy", s, T)) for s in dict.fromkeys(series)]
        ok &= all(v >= lloyd for _, v in wins)
        numbers.append(f"on cauchy tasks at T={T}: Lloyd {lloyd:.3f}, " + ", ".join(f"{s} {v:.3f}" for s, v in wins))
    return Claim("cauchy_fails", text, PASS if ok else FAIL, "; ".join(numbers))


def length_generalises(ctx: Context) -> Claim:
    text = "models trained at one n beat Lloyd's at T on n in " + ", ".join(map(str, ctx.settings.lengths))
    runs = _embedded_probe(ctx, ["model.embedding"])
    try:
        series, _ = series_labels(runs, ["model.embedding"])
        curves = eval_curves(ctx, runs, "length", lambda t, r: t["n"].astype(str), series, ("reembed",))
    except MissingInput as err:
        return Claim("length_generalises", text, UNTESTED, f"needs finished onehot/binary models: {err}")
    T, parts, ok = ctx.settings.steps, [], True
    for n in dict.fromkeys(curves["panel"]):
        lloyd = _at(curves, n, LLOYD, T)
        for label in dict.fromkeys(series):
            value = _at(curves, n, label, T)
            ok &= value < lloyd
            parts.append(f"n={n} {label} {value:.3f} vs Lloyd {lloyd:.3f}")
    return Claim("length_generalises", text, PASS if ok else FAIL, "; ".join(parts))


CLAIMS = (l2_beats_ne, tau01_beats_lloyd, reembed_beats_lloyd, cauchy_fails, length_generalises)


def check(ctx: Context) -> list[Claim]:
    return [claim(ctx) for claim in CLAIMS]


def main(argv: list[str] | None = None) -> int:
    ctx, _ = open_context(sys.argv[1:] if argv is None else argv, "analysis.claims")
    for claim in check(ctx):
        print(f"{claim.status:<8} {claim.name}: {claim.text}\n         {claim.numbers}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
