"""Every figure of docs/science.md section 7 by name, in the order the report shows them: convergence, the
headline's curves, first; and the report's drawing of them (`draw`)."""

from __future__ import annotations

import sys
import time
import traceback
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from analysis import eval_figures, training_figures
from analysis.context import Context, Want
from analysis.plot import Figure, MissingInput
from cli import console

FIGURES: dict[str, Callable[[Context], Figure]] = {
    "convergence": training_figures.convergence,
    "loss_surface": eval_figures.loss_surface,
    "multistep": eval_figures.multistep,
    "mixture_shift": eval_figures.mixture_shift,
    "length": eval_figures.length,
    "family_transfer": eval_figures.family_transfer,
    "task_dissimilarity": eval_figures.task_dissimilarity,
    "ablation_lr": partial(training_figures.ablation, subgrid="lr"),
    "ablation_lr_curves": training_figures.lr_curves,
    "ablation_points": partial(training_figures.ablation, subgrid="points"),
    "ablation_dim": partial(training_figures.ablation, subgrid="dim"),
    "ablation_clusters": partial(training_figures.ablation, subgrid="clusters"),
    "ablation_family": partial(training_figures.ablation, subgrid="family"),
    "time_to_quality": training_figures.time_to_quality,
    "speed_memory": training_figures.speed_memory,
}


def reads(names: list[str], ctx: Context) -> list[Want]:
    """The evaluations the figures `names` draw, to read before drawing them."""
    return [want for name in names for want in eval_figures.reads(name, ctx)]


@dataclass
class Drawing:
    """The figures asked for (`names`); those `draw` drew, in their order, with the seconds each took; those
    the store cannot support, and why; those that failed, with the end of the traceback; and the report
    folder's files before the first was drawn (path -> mtime in ns): what changed since, the report wrote."""

    names: list[str]
    before: dict[Path, int]
    figures: dict[str, Figure] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


def draw(ctx: Context, names: list[str]) -> Drawing:
    """Draw the figures `names` into the report folder (each writes its PNG and PDF); one the store cannot
    support, or that fails, is noted and the others are still drawn."""
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    drawing = Drawing(names, {p: p.stat().st_mtime_ns for p in ctx.out_dir.iterdir() if p.is_file()})
    lines = console.lines_not_bars()  # in a log file: a line per figure, not a bar redrawn
    for i, name in enumerate(bar := tqdm(names, desc="report", unit="figure", disable=lines)):
        bar.set_postfix_str(name)
        if lines:
            print(f"report: figure {i + 1}/{len(names)}: {name}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            drawing.figures[name] = FIGURES[name](ctx)
        except MissingInput as err:
            drawing.missing[name] = str(err)
        except Exception as err:  # one broken figure must not take the report down; the index says why
            drawing.failed[name] = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=4)}"
        else:
            drawing.seconds[name] = time.perf_counter() - start
    return drawing
