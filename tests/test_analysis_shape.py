"""The analysis wing reads, then judges: the report and the claims read what they need of a store in one pass
(analysis.read) into plain frames, and no figure or judge takes a store, a client or an evaluator to read more
while it draws or judges."""

from __future__ import annotations

import inspect
from functools import partial

import pytest

from analysis import eval_figures, training_figures
from analysis.claims import cases, evidence, judges, verdicts
from analysis.claims.records import CLAIMS
from analysis.context import Context
from analysis.figures import FIGURES

# What opens or reaches a store: a parameter so named or so typed lets a figure or judge read while it works.
STORE_WORDS = ("uri", "client", "store", "tracking", "evaluator")
STORE_TYPES = ("MlflowClient", "Evaluator", "TrackingStore")


def _functions() -> dict[str, object]:
    """Every figure (FIGURES, and each function of the figure modules) and every judge (each claim's, each
    function of analysis.claims.judges and of what judges a claim: its cases, its verdict, its view of the
    evidence)."""
    found = {name: f.func if isinstance(f, partial) else f for name, f in FIGURES.items()}
    found |= {f"judge of {record.name}": record.judge for record in CLAIMS}
    for module in (eval_figures, training_figures, judges, cases, verdicts, evidence):
        found |= {
            f"{module.__name__}.{name}": f
            for name, f in vars(module).items()
            if inspect.isfunction(f) and f.__module__ == module.__name__
        }
    return found


def _reaches_a_store(name: str, annotation: object) -> bool:
    words = name.lower().split("_")
    return any(w in STORE_WORDS for w in words) or any(t in str(annotation) for t in STORE_TYPES)


FUNCTIONS = _functions()


@pytest.mark.parametrize("name", sorted(FUNCTIONS))  # by name: the same ids in every xdist worker
def test_no_figure_or_judge_takes_a_store(name: str) -> None:
    for param in inspect.signature(FUNCTIONS[name]).parameters.values():
        assert not _reaches_a_store(param.name, param.annotation), f"{name} takes {param}"


def test_what_figures_and_judges_read_is_plain_data() -> None:
    """The Context they get holds frames and settings, no store client nor evaluator."""
    for field in Context.__dataclass_fields__.values():
        assert not any(t in str(field.type) for t in STORE_TYPES), field
    assert not any(
        inspect.isfunction(v) and "evaluat" in k for k, v in vars(Context).items() if k != "evaluation"
    )


def test_the_store_check_catches_a_store_parameter() -> None:
    """The check above is not vacuous: a parameter that reaches a store is found, by name or by type."""

    def figure(ctx: Context, client: object) -> None: ...

    def judge(v: object, reader: "MlflowClient") -> None: ...  # noqa: F821

    for f in (figure, judge):
        assert any(_reaches_a_store(p.name, p.annotation) for p in inspect.signature(f).parameters.values())
