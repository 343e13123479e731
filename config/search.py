"""A random search over declared ranges (sweep.search): each configuration of a sweep's grid drawn
`samples` times, the values of the axes in `space` drawn from their distributions (Ray Tune's uniform,
loguniform, randint and choice), the grid's other values kept, as Ray Tune's num_samples over a grid.

The draws happen here, before any job starts, from a generator seeded by sweep.search.seed, the draw's index
and the grid point (less the drawn keys): the same sweep draws the same configurations, so a restart finds
them done or resumes them and nothing runs twice, and raising `samples` adds draws to those made. Drawn
configurations are configurations like the grid's (config.grid): jobs, packs, the ledger and resume apply
unchanged. A float is drawn to 6 significant digits, the precision a run name spells (config.identity).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any, Mapping

from config.schema import ConfigError

KINDS = ("uniform", "loguniform", "randint", "choice")
ALLOWED = (
    "one of {uniform: [lo, hi]}, {loguniform: [lo, hi]} (0 < lo), {randint: [lo, hi]} (integers, hi "
    "excluded) or {choice: [a, b, ...]}, lo < hi"
)
DIGITS = 6  # significant digits of a drawn float


@dataclass(frozen=True)
class Distribution:
    """One axis's range: kind (KINDS) and its arguments, [lo, hi] or the choices."""

    kind: str
    args: tuple

    def draw(self, rng: random.Random) -> Any:
        if self.kind == "choice":
            return rng.choice(self.args)
        lo, hi = self.args
        if self.kind == "randint":
            return rng.randrange(lo, hi)
        if self.kind == "loguniform":
            value = math.exp(rng.uniform(math.log(lo), math.log(hi)))
        else:
            value = rng.uniform(lo, hi)
        return min(max(float(f"{value:.{DIGITS}g}"), float(lo)), float(hi))  # rounded, still in range

    def __str__(self) -> str:
        return f"{self.kind}{list(self.args)}"


@dataclass(frozen=True)
class Search:
    """sweep.search, validated: how many draws per grid point, their seed, and (axis, config key, range)."""

    samples: int
    seed: int
    space: tuple[tuple[str, str, Distribution], ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(key for _, key, _ in self.space)

    def draws(self, point: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The grid point's `samples` configurations (config key -> value), each its own seeded draw."""
        kept = {key: value for key, value in point.items() if key not in self.keys}
        where = json.dumps(kept, sort_keys=True, default=str)
        out = []
        for index in range(self.samples):
            rng = random.Random(f"{self.seed}:{index}:{where}")  # a str seed: the same in every process
            out.append({**kept, **{key: dist.draw(rng) for _, key, dist in self.space}})
        return out

    def describe(self) -> str:
        """'lr loguniform[0.0001, 0.1] x gamma uniform[0.5, 2.0]' for the plan's table."""
        return " x ".join(f"{axis} {dist}" for axis, _, dist in self.space)


def declared(
    sweep: str, spec: Mapping[str, Any], keys_of: Mapping[str, list[str]], held: Mapping[str, str]
) -> Search | None:
    """The sweep's search (sweep.search as a plain dict), None without one; raises ConfigError in one line.

    keys_of: each axis of the space -> its config keys (config.grid, which refused an undeclared axis);
    held: config key -> what else sets it in every trial (a sub-grid, sweep.fixed, the command line), which a
    drawn axis may not be.
    """
    samples, space = spec.get("samples") or 0, spec.get("space") or {}
    if not samples and not space:
        return None
    if not space or not samples:
        missing = "sweep.search.space" if not space else "sweep.search.samples"
        raise ConfigError(
            f"sweep {sweep!r}, {missing}: a search needs both sweep.search.samples >= 1 and an axis in "
            "sweep.search.space (docs/configuration.md, 'A random search')"
        )
    axes = []
    for axis, value in space.items():
        where = f"sweep.search.space.{axis}"
        keys = keys_of[axis]
        if len(keys) != 1:
            raise ConfigError(f"sweep {sweep!r}, {where}: a zipped axis is not drawn; draw one key per axis")
        if keys[0] in held:
            raise ConfigError(
                f"sweep {sweep!r}, {where}: {keys[0]} is also set by {held[keys[0]]}; an axis is drawn or "
                "set, not both"
            )
        axes.append((axis, keys[0], distribution(sweep, where, value)))
    return Search(samples, spec.get("seed") or 0, tuple(axes))


def distribution(sweep: str, where: str, value: Any) -> Distribution:
    """`{kind: args}` as a Distribution, or a ConfigError naming `where`, the value and what is allowed."""
    kind, args = next(iter(value.items())) if isinstance(value, dict) and len(value) == 1 else (None, None)
    if kind in KINDS and isinstance(args, list) and args and all(_scalar(a) for a in args):
        if kind == "choice":
            return Distribution(kind, tuple(args))
        numbers = len(args) == 2 and all(_number(a, integer=kind == "randint") for a in args)
        if numbers and args[0] < args[1] and (kind != "loguniform" or args[0] > 0):
            return Distribution(kind, tuple(args))
    raise ConfigError(f"sweep {sweep!r}, {where}={value!r} is not allowed: {ALLOWED}")


def _scalar(value: Any) -> bool:
    return isinstance(value, (int, float, str, bool))


def _number(value: Any, integer: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) if integer else math.isfinite(value)
