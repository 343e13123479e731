"""The paper's claims (docs/science.md section 7.1) judged on a store's runs: `python -m analysis.claims`,
whose command is __main__.py (parse the command line, read the store, judge every claim, write the table).

Its modules, each building on those before it:

- scopes: the words a claim uses for runs: the paper grid's axes and configurations (conf/sweep/, read
  through config/), a scope (sub-grid and slice);
- evidence: what the claims are judged on, gathered from what analysis.read read of a store (Evidence), and a
  claim's view of it, limited to its scope (View);
- cases: what a judge states: cases and parts, the verdict they give, the cases made from final values per
  seed and from a probe's rows;
- judges: one judge per claim, from a View to its parts;
- records: one Record per claim (the paper's words, where they stand, its scope and judge: CLAIMS), and the
  evaluations they read (reads);
- verdicts: a claim's verdict on the evidence (judge): against the paper grid, and without diverged runs;
- table: the judged claims (Claim) as the command prints them, claims.csv, claim_cases.csv and claims.md.
"""
