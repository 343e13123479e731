"""The work a sweep driver hands Ray Tune: what is left of the sweep, packed into trials, as frozen data.

The driver plans it once (plan_work), from the sweep as config/ made it (config.grid.Sweep: its jobs, their
override words, the command line's) and its hold on the ledger (sweeper.driver.hold: the jobs left, where each
resumes): each pending job becomes a Member (what its trial composes and trains, and what the driver's
writer tags its run with), each Tune trial a Trial that trains one member or a pack of them (cluster.pack).
The trials travel once to every worker (tune.with_parameters); Tune's param space carries only each trial's
identity, a TrialId, encoded and decoded here alone.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from config.grid import Job, Sweep
from config.schema import SHARED_KEYS

if TYPE_CHECKING:
    from sweeper.driver.hold import Hold

TRIAL = "trial"  # a Tune trial's config: {TRIAL: its TrialId, encoded}


@dataclass(frozen=True)
class TrialId:
    """A Tune trial's identity: its key (its job's config_hash, or pack-HASH) and its display name.

    Encoded as one string, not a dict: Tune deep-copies its whole grid for every trial it creates, so the
    grid's cost grows with the square of its size (3,000 strings: 5 s of the driver's CPU; 3,000 dicts:
    66 s), and it replaces any other object by a placeholder its name creator sees. A key has no space.
    """

    key: str
    name: str

    def encode(self) -> str:
        return f"{self.key} {self.name}"

    @classmethod
    def decode(cls, config: dict) -> TrialId:
        """The identity a Tune trial's config carries (sweeper.driver.tune.param_space)."""
        key, name = config[TRIAL].split(" ", 1)
        return cls(key, name)


@dataclass(frozen=True)
class Member:
    """One pending job (config.grid.Job) as its trial trains it and the driver records its run."""

    key: str  # config_hash: the job's identity, and its trial's work folder
    name: str  # its run name
    seed: int
    overrides: tuple[str, ...]  # its configuration's, which the trial composes after Work.base
    subgrids: tuple[str, ...]
    resume_from: str | None  # the Tune checkpoint its unfinished run recorded, as a location here (Hold)
    pack: str | None  # its trial's key when that trial trains several jobs, else None
    label: str = ""  # its `configuration` tag, the sweep's axes in it (config.grid.Job.label)


@dataclass(frozen=True)
class Trial:
    id: TrialId
    members: tuple[Member, ...]


@dataclass(frozen=True)
class Work:
    """Tune's trials by key, and the command line's overrides every trial composes with."""

    trials: Mapping[str, Trial]
    base: tuple[str, ...]

    def trial_of(self, config: dict) -> Trial:
        """The trial a Tune trial's config names."""
        return self.trials[TrialId.decode(config).key]


def plan_work(sweep: Sweep, hold: Hold) -> Work:
    """The jobs the held ledger leaves pending, packed into Tune's trials (cluster.pack, .pack_size)."""
    pending, resume_from = {job.key: job for job in hold.pending}, hold.resume_from
    packs = packs_of(sweep.jobs, set(pending), sweep.cfg.cluster.pack, sweep.cfg.cluster.pack_size)
    trials = {}
    for key, keys in packs.items():
        pack = key if len(keys) > 1 else None
        members = tuple(_member(pending[k], resume_from.get(k), pack) for k in keys)
        first = members[0].name
        trials[key] = Trial(
            TrialId(key, first if pack is None else f"pack of {len(keys)} from {first}"), members
        )
    return Work(trials, sweep.base)


def _member(job: Job, resume_from: str | None, pack: str | None) -> Member:
    subgrids = job.configuration.subgrids
    return Member(job.key, job.name, job.seed, job.overrides, subgrids, resume_from, pack, job.label)


def packs_of(jobs: Sequence[Job], pending: set[str], mode: str, size: int) -> dict[str, list[str]]:
    """Ray Tune's trials, each a list of the pending jobs (config_hash) it trains.

    mode none: one job per trial, keyed by its config_hash. mode seeds: the
    seeds of a configuration train together (training.packed). mode shapes: the
    jobs that share config.schema.SHARED_KEYS train together, `size` at most
    (cluster.pack_size), cut from the whole plan in its order. A pack is keyed
    by a hash of all its jobs' keys, done or not, so a restarted sweep packs
    what is left under the same key.
    """
    if mode == "none":
        return {j.key: [j.key] for j in jobs if j.key in pending}
    groups: dict[tuple, list[str]] = {}
    if mode == "seeds":
        for j in jobs:
            groups.setdefault(j.overrides, []).append(j.key)
        cuts = list(groups.values())
    else:
        for j in jobs:  # a key no configuration overrides has the sweep's one value
            groups.setdefault(tuple(j.configuration.overrides.get(k) for k in SHARED_KEYS), []).append(j.key)
        cuts = [keys[i : i + size] for keys in groups.values() for i in range(0, len(keys), size)]
    packs = {
        "pack-" + hashlib.sha256(" ".join(keys).encode()).hexdigest()[:12]: [k for k in keys if k in pending]
        for keys in cuts
    }
    return {key: members for key, members in packs.items() if members}
