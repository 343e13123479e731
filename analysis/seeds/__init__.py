"""`python -m analysis.seeds seeds.sweep=NAME seeds.budget=MODEL_STEPS [seeds.config_dir=DIR] [tracking.*]
[eval.*] [out=...]`: seeds where a verdict is marginal.

Judges the paper's claims on the runs of sweep NAME and of the rounds before (sweep NAME-seeds),
and writes the next round: DIR/sweep/NAME-seeds.yaml, a sweep that trains the paper's next seeds of the
configurations behind marginal cases (docs/science.md section 7.2), which the ordinary sweep runs
(`python -m sweeper.sweep --config-dir DIR sweep=NAME-seeds`, the command printed on the `next:` line).
Started again after it, it judges again over all seeds and writes the next round; when every case is firm,
none more of the paper's ten seeds could settle, or the budget is spent, it deletes the round's file and
prints `done:`. A round whose models have not all ended (stopped midway) is left as it is: the same sweep
command resumes it. The budget counts the rounds' model-steps (the runs of NAME-seeds at seeds NAME does not
train); seeds.budget_s=SECONDS instead prices seconds at NAME's recorded rate (its parent run's
model_steps_per_s). Writes claims.md, claims.csv, claim_cases.csv, before.csv, rounds.csv and firmness.md
into <out>/<experiment>/seeds/.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.checkpoint_eval import EvalSettings
from analysis.claims.records import reads
from analysis.claims.table import Claim, write_csv, write_markdown
from analysis.claims.verdicts import check
from analysis.cli import expected_sizes, job_config, options_help, parse
from analysis.read import read
from analysis.runs import NoRuns, load_runs
from analysis.seeds import record, sweep_file
from analysis.seeds.plan import Key, Wanted, need, plan_round
from cli.entry import command
from config.compose import compose
from config.grid import Plan
from config.schema import ConfigError
from tracking import parent_run, store
from tracking.names import DIVERGED, FINISHED, OUTCOME, SEED, STEP_RATE, SWEEP

PREFIX = "seeds."
KEYS = ("sweep", "budget", "budget_s", "config_dir")


@dataclass(frozen=True)
class Settings:
    sweep: str  # the base sweep (conf/sweep/NAME.yaml)
    budget: int | None  # model-steps
    budget_s: float | None  # seconds at the base sweep's recorded rate
    config_dir: Path  # the user's config directory the round's sweep goes to

    @property
    def name(self) -> str:
        return f"{self.sweep}-seeds"

    def path(self) -> Path:
        return self.config_dir / "sweep" / f"{self.name}.yaml"


def settings_of(argv: list[str]) -> tuple[Settings, list[str]]:
    """The seeds.* keys, checked before any work, and the other words (the claims' keys)."""
    given = {w[len(PREFIX) :].split("=", 1)[0]: w.split("=", 1)[1] for w in argv if w.startswith(PREFIX)}
    unknown = sorted(set(given) - set(KEYS))
    if unknown or any("=" not in w for w in argv if w.startswith(PREFIX)):
        raise ConfigError(
            f"seeds.{(unknown or ['?'])[0]} is not a key: allowed seeds.{', seeds.'.join(KEYS)}"
        )
    names = [n for n in sweep_file.sweep_names() if n != "paper"]
    if given.get("sweep") not in names:
        raise ConfigError(
            f"seeds.sweep={given.get('sweep')} is not allowed: choose one of {', '.join(names)}"
        )
    if ("budget" in given) == ("budget_s" in given):
        raise ConfigError("seeds.budget=MODEL_STEPS or seeds.budget_s=SECONDS is needed: give one of the two")
    budget = _positive("budget", given.get("budget"), int)
    budget_s = _positive("budget_s", given.get("budget_s"), float)
    folder = Path(given.get("config_dir", "sweeps"))
    rest = [w for w in argv if not w.startswith(PREFIX)]
    refused = [w for w in rest if w.split("=", 1)[0] in ("experiments", "select.sweep", "select.subgrid")]
    if refused:
        raise ConfigError(
            f"{refused[0]} is not allowed here: the runs judged are seeds.sweep's and its rounds'"
        )
    return Settings(given["sweep"], budget, budget_s, folder), rest


def _positive(key: str, text: str | None, kind: type) -> int | float | None:
    if text is None:
        return None
    try:
        value = kind(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"seeds.{key}={text} is not allowed: a number > 0 ({kind.__name__})")
    return value


def _words(argv: list[str]) -> str:
    return job_config([w for w in argv if not w.startswith(PREFIX)])


def _options() -> str:
    return "\n".join(
        [
            "  seeds.sweep=NAME: the sweep whose marginal cases get more seeds (conf/sweep/NAME.yaml)",
            "  seeds.budget=MODEL_STEPS, or seeds.budget_s=SECONDS at NAME's recorded model_steps_per_s",
            "  seeds.config_dir=sweeps: where sweep/NAME-seeds.yaml, the round's sweep, is written",
            options_help(),
        ]
    )


@command("leaner-seeds", show_config=_words, options=_options)
def main(argv: list[str]) -> int:
    settings, rest = settings_of(argv)
    own, tracking = parse(rest)
    uri, experiment = tracking.uri, tracking.experiment
    runs = _runs(uri, experiment, {settings.sweep, settings.name})
    total = settings.budget or round(settings.budget_s * _rate(uri, experiment, settings.sweep))
    report = Path(own["out"]) / experiment  # the report's folder: its cached evaluations are reused
    folder = report / "seeds"
    where = f"tracking.uri={uri} tracking.experiment={experiment}"
    sweep = f"python -m sweeper.sweep --config-dir {settings.config_dir} sweep={settings.name} {where}"
    if settings.path().exists():
        left = sweep_file.unfinished(runs, sweep_file.plan_of(settings.name, settings.config_dir))
        if left:
            print(
                f"{settings.path()}: {left} of its models have not ended; the sweep resumes it\nnext: {sweep}"
            )
            return 0
    settings_eval = EvalSettings.of(own["eval"])
    extra = {key: Path(own[key]) if own[key] else None for key in ("speed_json", "step_json")}
    ctx = read(uri, experiment, runs, settings_eval, report, reads, expected=expected_sizes(), **extra)
    claims = check(ctx)
    write_markdown(claims, folder)
    write_csv(claims, folder)
    before = record.first_judgement(claims, folder)
    state = _next_round(settings, claims, runs, total, folder, sweep)
    print(state)
    print(record.write_firmness(folder, before, claims, state).resolve())
    return 0


def _next_round(
    settings: Settings, claims: list[Claim], runs: pd.DataFrame, total: int, folder: Path, sweep: str
) -> str:
    """The next round's sweep written (the `next:` line) or the rounds' end (`done:`), in words."""
    base, paper = sweep_file.plan_of(settings.sweep), sweep_file.paper_seeds()
    default_steps = int(compose([]).train.steps)

    def steps_of(key: Key) -> int:
        return int(dict(key).get("train.steps", default_steps))

    spent = _spent(runs, settings.name, base)
    wanted = _wanted(claims, base, len(paper))
    ended = functools.cache(lambda key: sweep_file.ended_seeds(runs, key))  # asked per case, read once
    found, why = plan_round(wanted, ended, paper, steps_of, total - spent)
    budget = f"budget {total:,} model-steps, {spent:,} spent"
    if found is None:
        settings.path().unlink(missing_ok=True)
        return f"done: {why or 'every case is firm'} ({budget})"
    number = len(record.rounds_so_far(folder)) + 1
    words = (
        f"Round {number} of `python -m analysis.seeds seeds.sweep={settings.sweep}`: {found.models} models, "
        f"{found.steps:,} model-steps ({budget}), the paper's first {found.target} seeds of "
        f"{len(found.configurations)} configurations, for {len(found.cases)} marginal cases"
    )
    sweep_file.write(settings.path(), base, settings.name, found, paper, words)
    row = {"round": number, "seeds": found.target, "configurations": len(found.configurations)}
    record.log_round(
        folder, {**row, "models": found.models, "model_steps": found.steps, "spent_before": spent}
    )
    return f"{words}\nnext: {sweep}"


def _wanted(claims: list[Claim], base: Plan, most: int) -> list[Wanted]:
    """Every marginal case, the base sweep's configurations behind it and the seeds settling it needs."""
    found = []
    for claim in claims:
        for part, case in claim.judged:
            if case.marginal:
                keys = tuple(dict.fromkeys(k for c in case.configs for k in sweep_file.matching(c, base)))
                rests = claim.rests_on_marginal
                found.append(Wanted(claim.name, f"{part}: {case.label}", keys, need(case, most), rests))
    return found


def _spent(runs: pd.DataFrame, name: str, base: Plan) -> int:
    """The rounds' model-steps so far: the ended runs of sweep `name` at seeds its base does not train."""
    rounds = runs[runs[SWEEP].fillna("").map(lambda s: name in s.split(","))]
    added = rounds[~rounds[SEED].isin(base.seeds) & rounds[OUTCOME].isin((FINISHED, DIVERGED))]
    return int(added["train.steps"].sum()) if len(added) else 0


def _runs(uri: str, experiment: str, sweeps: set[str]) -> pd.DataFrame:
    """The experiment's runs of the base sweep and of its rounds."""
    runs = load_runs(uri, experiment)
    if not runs.empty:
        runs = runs[runs[SWEEP].fillna("").map(lambda s: bool(sweeps & set(s.split(","))))]
    if runs.empty:
        named = " or ".join(sorted(sweeps))
        raise NoRuns(f"nothing to judge: experiment {experiment!r} in {uri} has no run of sweep {named}")
    return runs.reset_index(drop=True)


def _rate(uri: str, experiment: str, sweep: str) -> float:
    """The base sweep's recorded model-steps a second (its parent run's STEP_RATE)."""
    client = store.connect(uri, write=False)
    parent = parent_run.find_parent(client, store.find_experiment(client, experiment), sweep)
    rate = client.get_run(parent).data.metrics.get(STEP_RATE) if parent else None
    if rate is None:
        raise ConfigError(
            f"seeds.budget_s needs sweep {sweep}'s recorded {STEP_RATE} (its parent run in {experiment}), "
            "which it has not: give seeds.budget=MODEL_STEPS"
        )
    return float(rate)
