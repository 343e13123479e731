"""`python -m analysis.claims [tracking.*] [experiments=[a,b]] [select.*] [eval.*]`: the paper's 18 claims
(docs/science.md 7.1), on one experiment or on several judged as one (`experiments`: sweep=lite's d 4 runs
and sweep=lite32's d 32 runs, each in its own experiment, give large_lr_worse both its halves).

Each claim has a name, the paper's words and where they
stand, its scope (the sub-grid and slice it is about) and its judge. A claim is
judged only on its scope, so other runs in a store never change a verdict.
Per configuration, the median across seeds of the final value, where a
diverged seed counts as +inf (it beats nothing: neither Lloyd's nor a lower
loss) and an unfinished one not at all; a configuration with fewer than 2
seeds is left out. A judge returns a few parts ("every OH/BN configuration
< 1", "every NA one >= 1") over the cases its scope holds: one failing case
makes the claim FAIL, else a part without cases, or a case without a margin
(no seed on both sides: not judged), makes it UNTESTED (never PASS on zero
cases), else PASS; a PASS whose cases leave out configurations the paper grid
holds in its scope reads PARTIAL, naming them (never PASS on part of its
scope). Probes compare the models' median (over seeds) mean
log objective with Lloyd's after the same T steps, on the models the figures
draw (the report's probe figures).

A case compares a model with its reference seed by seed: its margin is the
median over seeds of the paired difference (model minus reference), the case
holds when that margin has the claimed sign and by nothing else, so every
verdict is the sign of the margin printed beside it; the seeds' IQR of the difference is printed too,
and a case whose IQR straddles zero is marked *marginal*, which informs and
never changes a verdict. The claims beyond the paper are the platform's own findings, judged
by the same rules, reported under their own heading and never counted among
the paper's claims: among them the family claims at lite scale (d 4, k 6,
`sweep=lite`), the same statements beyond the paper's setting (d 32, k 10,
where the paper's claims are judged, on `sweep=lite32`'s runs).

Prints every claim beside the paper's words and writes claims.csv and claims.md into the report folder.
"""

from __future__ import annotations

import sys

from analysis.claims.evidence import evidence_of
from analysis.claims.records import CLAIMS, reads
from analysis.claims.settings import at_setting
from analysis.claims.table import beside, claims_dir, printed, totals, write_csv, write_markdown
from analysis.claims.verdicts import judge
from analysis.cli import job_config, options_help, settings_of
from analysis.read import read_store
from cli.entry import command


@command("leaner-claims", show_config=job_config, options=options_help)
def main(argv: list[str]) -> int:
    own, tracking = settings_of(argv)
    contexts = read_store(own, tracking, lambda own: reads)
    found = evidence_of(contexts)
    nearest, farthest = at_setting(found), at_setting(found, nearest=False)
    claims = [judge(record, nearest) for record in CLAIMS]
    if len(contexts) > 1:  # several experiments: beside each verdict, the one at lite scale where it differs
        claims = beside(claims, [judge(record, farthest) for record in CLAIMS])
    out_dir = claims_dir(contexts, own["out"])
    print(printed(claims))
    write_markdown(claims, out_dir)
    print(totals(claims))
    print(write_csv(claims, out_dir).resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
