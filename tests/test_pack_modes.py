"""cluster.pack=shapes: the sweep packs every model of one shape (config.schema.SHARED_KEYS), up to
cluster.pack_size, into one trial (sweeper.driver.work.packs_of); bad values are refused before anything
runs."""

from __future__ import annotations

import pytest
from omegaconf import DictConfig, OmegaConf

from config import grid
from config.compose import compose
from config.identity import config_hash
from config.schema import SHARED_KEYS, ConfigError
from sweeper.driver.work import packs_of
from sweeper.sweep import load
from training.packed import check_packable


@pytest.fixture(scope="module")
def lite() -> tuple[list[grid.Job], dict[str, object]]:
    """sweep=lite's trials, and each one's configuration: composed once per configuration, then given the
    trial's seed (the hash check proves it is what the trial composes)."""
    trials = list(load(["sweep=lite"]).jobs)
    composed: dict[tuple[str, ...], DictConfig] = {}
    cfgs = {}
    for t in trials:
        overrides = tuple(t.configuration.override_strings())
        if overrides not in composed:
            composed[overrides] = compose(list(overrides))
        cfgs[t.key] = OmegaConf.merge(composed[overrides], {"seed": t.seed})
    assert all(config_hash(c) == key for key, c in cfgs.items())
    return trials, cfgs


def test_shape_packs_hold_every_pending_model_once_each_of_one_shape(lite) -> None:
    trials, cfgs = lite
    everyone = {t.key for t in trials}
    packs = packs_of(trials, everyone, "shapes", 30)
    members = [key for pack in packs.values() for key in pack]
    assert sorted(members) == sorted(everyone)
    for pack in packs.values():
        assert 1 <= len(pack) <= 30
        check_packable([cfgs[key] for key in pack])  # ValueError if a pack mixed shapes
    seeds = packs_of(trials, everyone, "seeds", 30)
    assert len(packs) < len(seeds)  # configurations of one shape share trials
    # Packs of one shape are cut only where full: no two packs could have been one.
    shapes = [
        tuple(cfgs[pack[0]][k.split(".")[0]][k.split(".")[1]] for k in SHARED_KEYS) for pack in packs.values()
    ]
    for shape in set(shapes):
        sizes = sorted(len(p) for p, s in zip(packs.values(), shapes) if s == shape)
        assert all(size == 30 for size in sizes[1:]), (shape, sizes)

    small = packs_of(trials, everyone, "shapes", 4)
    assert max(map(len, small.values())) == 4 and sum(map(len, small.values())) == len(everyone)


def test_a_restarted_sweep_packs_what_is_left_under_the_same_keys(lite) -> None:
    trials, _ = lite
    everyone = {t.key for t in trials}
    first = packs_of(trials, everyone, "shapes", 7)
    left = {t.key for i, t in enumerate(trials) if i % 3}
    again = packs_of(trials, left, "shapes", 7)
    assert set(again) <= set(first)
    for key, members in again.items():
        assert members == [m for m in first[key] if m in left]


@pytest.mark.parametrize(
    "override, key, allowed",
    [
        ("cluster.pack_size=0", "cluster.pack_size", "an integer >= 1"),
        ("cluster.pack=configs", "cluster.pack", "none, seeds, shapes"),
        ("cluster.report_every=0", "cluster.report_every", "an integer >= 1"),
    ],
)
def test_bad_pack_settings_are_refused(override: str, key: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as err:
        compose([override])
    assert str(err.value).startswith(f"{key}=") and allowed in str(err.value)
